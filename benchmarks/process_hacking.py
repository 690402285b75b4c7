"""Reward hacking by a naive process reward, and Clipping / Delta shaping against it
(pipelines/process_hacking.yaml: GRPO on 2-digit addition, outcome verifier + a per-step reward
where every response token is a step).

    python benchmarks/process_hacking.py                  # naive, clip, delta; seeds 0 1 2
    python benchmarks/process_hacking.py --seeds 0 -- train.max_steps=40

For each run: held-out accuracy (the outcome verifier, greedy) and steps per response
(`token_rewards/steps/steps_mean`, here the response length) over training. Writes
benchmarks/results/raw/process_hacking<label>.json and .png, and a markdown table to stdout and to the
summary benchmarks/results/process_hacking.md.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coevolve import evals, median_range, run_variants, save_plot, variants_cli  # noqa: E402
from summary import raw_path, write as write_summary  # noqa: E402

VARIANTS = {
    "naive": [],
    "clip": ["aggregate={process: {steps: {transform: clip, eta: 1.0}}}"],
    "delta": ["aggregate={process: {steps: {transform: delta}}}"],
}
STEPS = "token_rewards/steps/steps_mean"


def steps_curve(rows: list[dict]) -> list[tuple[int, float]]:
    return [(r["step"], r[STEPS]) for r in rows if r.get(STEPS) is not None]


def window_mean(curve: list[tuple[int, float]], first: bool, k: int = 5) -> float:
    values = [v for _, v in (curve[:k] if first else curve[-k:])]
    return sum(values) / len(values)


def plot(runs: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_s, ax_a) = plt.subplots(1, 2, figsize=(11, 3.8))
    colors = {"naive": "tab:red", "clip": "tab:blue", "delta": "tab:green"}
    for name, rs in runs.items():
        for i, r in enumerate(rs):
            c = steps_curve(r["rows"])
            ax_s.plot([s for s, _ in c], [v for _, v in c], color=colors[name], alpha=0.7,
                      label=name if i == 0 else None)
            e = evals(r["rows"])
            ax_a.plot([s for s, _, _ in e], [a for _, _, a in e], color=colors[name], marker="o", markersize=3,
                      alpha=0.7, label=name if i == 0 else None)
    ax_s.set_title("steps per response (sampled)")
    ax_a.set_title("held-out accuracy (outcome verifier, greedy)")
    save_plot(fig, (ax_s, ax_a), path)


def markdown(table: dict) -> str:
    """The summary table from a results file's `table` (per variant, one value per seed)."""
    return "\n".join(["### Naive process reward versus Clipping / Delta shaping", "",
                      "| shaping | seeds | steps/response, first 5 steps | last 5 steps | held-out acc start | end |",
                      "|---|---:|---:|---:|---:|---:|",
                      *(f"| {v} | {len(c['acc_end'])} | {median_range(c['steps_first'])} | {median_range(c['steps_last'])} | "
                        f"{median_range(c['acc_start'])} | {median_range(c['acc_end'])} |" for v, c in table.items())])


def main() -> None:
    args = variants_cli(__doc__, VARIANTS)
    runs = run_variants("process_hacking", VARIANTS, args)
    table = {}
    for v, rs in runs.items():
        table[v] = {"steps_first": [window_mean(steps_curve(r["rows"]), True) for r in rs],
                    "steps_last": [window_mean(steps_curve(r["rows"]), False) for r in rs],
                    "acc_start": [r["summary"].get("warmup/accuracy") for r in rs],
                    "acc_end": [evals(r["rows"])[-1][2] for r in rs]}
    md = markdown(table)
    print("\n" + md)
    out = raw_path(f"process_hacking{args.label}")
    plot(runs, out.with_suffix(".png"))
    slim = {v: [{k: r[k] for k in ("overrides", "wall_s", "summary", "load_avg")} |
                {"curve": [{k: x.get(k) for k in ("step", "time_s", STEPS, "eval/accuracy", "reward/mean",
                                                   "samples/response_length")} for x in r["rows"]]}
                for r in rs] for v, rs in runs.items()}
    out.with_suffix(".json").write_text(json.dumps({"machine": platform.processor() or platform.machine(),
                                                    "seeds": args.seeds, "table": table, "runs": slim}, indent=1))
    summary = write_summary("process_hacking", out.name, md, raw=[out.with_suffix(".json"), out.with_suffix(".png")],
                            protocol=f"seeds {args.seeds}, variants {args.variants}; overrides {args.extra or 'none'}")
    print(f"\nraw: {out.with_suffix('.json')}\nplot: {out.with_suffix('.png')}\nsummary: {summary}")


if __name__ == "__main__":
    main()
