"""The aggregation stage, measured: a verifier, a reward model and a format reward combined with
G-RA gating (pipelines/mixed_rewards.yaml), Parrot's Pareto selection and PAR shaping, against the
outcome verifier alone; same warm start, same steps.

    python benchmarks/reward_layer.py                    # every variant, seeds 0 1 2
    python benchmarks/reward_layer.py --variants parrot --seeds 0 -- train.max_steps=30

Writes benchmarks/results/reward_layer<label>.json and a markdown table to stdout.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coevolve import RESULTS, evals, median_range, run_variants, variants_cli  # noqa: E402

GATES = "gate: [{source: rm, when: correct, threshold: 1.0}, {source: format, when: correct, threshold: 1.0}]"
VARIANTS = {
    "outcome only": ["rewards=[{name: correct, fn: integer_match}]", "aggregate={}"],
    "gated (G-RA)": [],
    "Parrot": ["aggregate={select: {pareto: [correct, rm, format]}}"],
    "PAR + gates": [f"aggregate={{{GATES}, transform: {{rm: {{par: {{reference: group_mean}}}}}}}}"],
}


def main() -> None:
    args = variants_cli(__doc__, VARIANTS)
    runs = run_variants("mixed_rewards", VARIANTS, args)
    print("\n### Reward aggregation: gating, Parrot, PAR\n")
    print("| aggregation | seeds | held-out acc start | end | best | RL wall s |")
    print("|---|---:|---:|---:|---:|---:|")
    table = {}
    for v, rs in runs.items():
        start = [r["summary"].get("warmup/accuracy") for r in rs]
        end = [evals(r["rows"])[-1][2] for r in rs]
        best = [max(a for _, _, a in evals(r["rows"])) for r in rs]
        wall = [r["summary"]["time/train_s"] for r in rs]
        table[v] = {"acc_start": start, "acc_end": end, "acc_best": best, "train_s": wall,
                    "pareto_masked": [r["rows"][-1].get("reward/pareto/masked") for r in rs]}
        print(f"| {v} | {len(rs)} | {median_range(start)} | {median_range(end)} | {median_range(best)} | "
              f"{median_range(wall)} |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"reward_layer{args.label}.json"
    slim = {v: [{k: r[k] for k in ("overrides", "wall_s", "summary", "load_avg")} |
                {"evals": evals(r["rows"])} for r in rs] for v, rs in runs.items()}
    out.write_text(json.dumps({"machine": platform.processor() or platform.machine(), "seeds": args.seeds,
                               "table": table, "runs": slim}, indent=1))
    print(f"\nraw: {out}")


if __name__ == "__main__":
    main()
