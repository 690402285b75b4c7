"""The shipped self-judging and co-evolving recipes, run as shipped (issue 32): `coevo run <recipe>
seed=N` with nothing else changed, each from its own warm-ups (cached after a first run, as a user's
would be). Does each end at or above the accuracy it started RL from? A guard that stops the judge's
reward when it is at chance counts as holding. Reports per run the SFT warm start, the start of RL
(after the recipe's own warm-ups), the final and the lowest held-out accuracy, the judge's or reward
model's held-out AUROC, hacking evaluations and how often the guard was on.

    python benchmarks/shipped_recipes.py                                  # every recipe, seed 0
    python benchmarks/shipped_recipes.py --recipes cooper spark --seeds 0 1 2 --label _x
    python benchmarks/shipped_recipes.py --report --label _x               # the table from the raw file

Raw results: benchmarks/results/raw/shipped_recipes<label>.json (rewritten after every run); the table
goes to its section of benchmarks/results/shipped_recipes.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coevolve import coevo, evals  # noqa: E402
from self_judges import isolate_ray, summarise  # noqa: E402
from summary import raw_path, write as write_summary  # noqa: E402

RECIPES = ("self_judged_grpo", "spark", "laser", "cooper", "self_rewarding", "spc")


def row(run: dict) -> dict:
    s = summarise(run)
    acc = [a for *_, a in evals(run["rows"])]
    return {**s, "sft": run["summary"].get("warmup/accuracy_after", run["summary"].get("warmup/accuracy")),
            "lowest": min(acc, default=None), "steps": max((r["step"] for r in run["rows"]), default=0)}


def fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def table(runs: dict[str, list[dict]]) -> str:
    lines = ["| recipe | seed | steps | SFT warm start | RL start | final | lowest | >= start | judge AUROC first -> last "
             "| hacking evals | guard on | wall s |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, rs in runs.items():
        for run in rs:
            if "error" in run:
                lines.append(f"| {name} | {run['seed']} | failed: {run['error'][:80]} |" + " |" * 9)
                continue
            r = row(run)
            held = "yes" if r["final"] is not None and r["start"] is not None and r["final"] >= r["start"] else "no"
            lines.append(f"| {name} | {run['seed']} | {r['steps']} | {fmt(r['sft'])} | {fmt(r['start'])} | "
                         f"{fmt(r['final'])} | {fmt(r['lowest'])} | {held} | {fmt(r['judge_auroc_first'])} -> "
                         f"{fmt(r['judge_auroc_last'])} | {r['hacking_count']} | {fmt(r['guard_frac'])} | "
                         f"{r['wall_s']:.0f} |")
    ok = [row(x) for rs in runs.values() for x in rs if "error" not in x]
    held = sum(1 for r in ok if r["final"] is not None and r["start"] is not None and r["final"] >= r["start"])
    gains = [r["final"] - r["start"] for r in ok if r["final"] is not None and r["start"] is not None]
    if gains:
        lines += ["", f"{held} of {len(ok)} runs end at or above their RL start; final - start: median "
                      f"{statistics.median(gains):+.3f} ({min(gains):+.3f} to {max(gains):+.3f})."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--label", default="")
    parser.add_argument("--report", action="store_true", help="only print the table from an earlier raw file")
    parser.add_argument("--resume", action="store_true", help="keep the runs of an earlier raw file of this label")
    parser.add_argument("extra", nargs="*", help="overrides for every run (after --)")
    args = parser.parse_args()
    out = raw_path(f"shipped_recipes{args.label}.json")
    runs: dict[str, list[dict]] = json.loads(out.read_text())["runs"] if (args.report or args.resume) and out.is_file() else {}
    if not args.report:
        isolate_ray()
        with tempfile.TemporaryDirectory(prefix="coevo-shipped-") as tmp:
            for seed in args.seeds:  # seed-major: a cut run has every recipe of the first seeds
                for name in args.recipes:
                    if any(r["seed"] == seed for r in runs.get(name, [])):
                        continue
                    tag = f"{name}_s{seed}"
                    try:
                        run = coevo(name, [f"seed={seed}", *args.extra], Path(tmp) / tag, Path(tmp) / f"{tag}.log")
                    except RuntimeError as e:
                        run = {"error": str(e), "log_tail": (Path(tmp) / f"{tag}.log").read_text(errors="replace")[-3000:]}
                        print(f"{tag}: FAILED\n{run['log_tail']}", flush=True)
                    run["seed"] = seed
                    runs.setdefault(name, []).append(run)
                    if "error" not in run:
                        r = row(run)
                        print(f"{tag}: RL start {r['start']}, final {r['final']}, lowest {r['lowest']}, "
                              f"{r['wall_s']:.0f} s, load {run['load_avg']:.1f}", flush=True)
                    out.write_text(json.dumps({"runs": runs}, indent=1, default=str))
    text = table(runs)
    print("\n" + text)
    summary = write_summary("shipped_recipes", f"shipped_recipes{args.label}", text, raw=[out], protocol=(
        f"`coevo run <recipe> seed=N` as shipped (pipelines/<recipe>.yaml), seeds {args.seeds}, overrides "
        f"{args.extra or 'none'}; warm-ups cached after a first run; held-out accuracy every train.eval_every steps"))
    print(f"\nraw results: {out}\nsummary: {summary}")


if __name__ == "__main__":
    main()
