"""The self-rewarding recipes on 2-digit addition with the verifier withheld from training
(LaSeR: the verifier on a quarter of the prompts only): start and end held-out accuracy, judge
quality, wall time; 3 seeds each.

    python benchmarks/self_rewarding.py                         # every recipe, seeds 0 1 2
    python benchmarks/self_rewarding.py --recipes laser --seeds 0
    python benchmarks/self_rewarding.py -- train.max_steps=40   # overrides for every run

The warm start is the same for every recipe and seed (the default recipe's cached SFT warm-up;
self_rewarding and self_judged_grpo then run their judging warm-up, also cached, and start from it:
both accuracies are reported; laser runs its self-verification warm-up, also cached, and starts from it).
Raw results: benchmarks/results/raw/self_rewarding<label>.json; the table goes to its section of the
summary benchmarks/results/self_rewarding.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coevolve import coevo, evals  # noqa: E402
from summary import raw_path, write as write_summary  # noqa: E402

RECIPES = ["self_rewarding", "laser", "majority_vote", "co_reward", "self_judged_grpo"]


def summarise(name: str, run: dict) -> dict:
    rows, summary = run["rows"], run["summary"]
    e = evals(rows)
    start = summary.get("judge_warmup/accuracy_after", summary.get("laser_warmup/accuracy_after",
                                                                     summary.get("warmup/accuracy")))
    out = {"recipe": name, "sft_accuracy": summary.get("warmup/accuracy"), "start_accuracy": start,
           "end_accuracy": e[-1][2] if e else None, "best_accuracy": max((a for _, _, a in e), default=None),
           "steps": summary["steps"], "wall_s": run["wall_s"], "train_s": summary["time/train_s"],
           "judge_auroc_warmup": summary.get("judge_warmup/auroc_after")}
    out.update({k: v for k, v in summary.items() if k.startswith("laser_warmup/")})
    gains = [r["eval/best_of_n_gain"] for r in rows if r.get("eval/best_of_n_gain") is not None]
    if gains:  # best-of-N against a random pick at every evaluation, not only the last
        out["best_of_n_gain_mean"] = statistics.mean(gains)
        out["best_of_n_gain_positive"] = f"{sum(g > 0 for g in gains)}/{len(gains)}"
    last = [r for r in rows if r.get("eval/accuracy") is not None][-1] if e else {}
    for key in ("eval/judge_agreement", "eval/judge_auroc", "eval/self_reward_auroc", "eval/best_of_8_accuracy",
                "eval/random_pick_accuracy", "eval/best_of_n_gain"):
        if key in last:
            out[key] = last[key]
    return out


def table(results: list[dict]) -> str:
    """Per recipe, medians over seeds (a results file's `results`)."""
    lines = ["| recipe | seeds | SFT warm start | start (after judge warm-up) | end: median (range) | "
             "improved in | judge / self-reward | wall s (median) |", "|---|---:|---:|---:|---:|---:|---|---:|"]
    for name in dict.fromkeys(r["recipe"] for r in results):
        rs = [r for r in results if r["recipe"] == name]
        ends = [r["end_accuracy"] for r in rs]
        better = sum(r["end_accuracy"] > r["start_accuracy"] for r in rs)
        quality = "; ".join(f"{k.split('/')[-1]} {statistics.median(r[k] for r in rs):.2f}" for k in
                            ("eval/judge_auroc", "eval/judge_agreement", "eval/self_reward_auroc", "eval/best_of_n_gain")
                            if all(r.get(k) is not None for r in rs))
        lines.append(f"| {name} | {len(rs)} | {statistics.median(r['sft_accuracy'] for r in rs):.3f} | "
                     f"{statistics.median(r['start_accuracy'] for r in rs):.3f} | {statistics.median(ends):.3f} "
                     f"({min(ends):.3f}-{max(ends):.3f}) | {better}/{len(rs)} | {quality or '-'} | "
                     f"{statistics.median(r['wall_s'] for r in rs):.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipes", nargs="+", default=RECIPES)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--label", default="")
    parser.add_argument("extra", nargs="*")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="selfrew-") as tmp:
        for name in args.recipes:
            for seed in args.seeds:
                run = coevo(name, [f"seed={seed}", *args.extra], Path(tmp) / f"{name}_{seed}",
                            Path(tmp) / f"{name}_{seed}.log")
                results.append({**summarise(name, run), "seed": seed, "rows": run["rows"],
                                "summary": run["summary"]})
                print(json.dumps({k: v for k, v in results[-1].items() if k not in ("rows", "summary")}), flush=True)
    md = table(results)
    print("\n" + md)
    path = raw_path(f"self_rewarding{args.label}.json")
    path.write_text(json.dumps({"machine": f"{os.cpu_count()} CPUs {platform.machine()}", "argv": sys.argv[1:],
                                "results": results}, indent=1, default=str))
    summary = write_summary("self_rewarding", path.stem, md, raw=[path],
                            protocol=f"recipes {args.recipes}, seeds {args.seeds}; overrides {args.extra or 'none'}")
    print(f"raw results: {path}\nsummary: {summary}")


if __name__ == "__main__":
    main()
