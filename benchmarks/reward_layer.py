"""The aggregation stage, measured: a verifier, a reward model and a format reward combined with
G-RA gating (pipelines/mixed_rewards.yaml), Parrot's Pareto selection and PAR shaping, against the
outcome verifier alone; same warm start, same steps.

    python benchmarks/reward_layer.py                    # every variant, seeds 0 1 2
    python benchmarks/reward_layer.py --variants parrot --seeds 0 -- train.max_steps=30

Writes benchmarks/results/reward_layer<label>.json and a markdown table to stdout.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coevolve import RESULTS, coevo, evals, median_range  # noqa: E402

GATES = "gate: [{source: rm, when: correct, threshold: 1.0}, {source: format, when: correct, threshold: 1.0}]"
VARIANTS = {
    "outcome only": ["rewards=[{name: correct, fn: integer_match}]", "aggregate={}"],
    "gated (G-RA)": [],
    "Parrot": ["aggregate={select: {pareto: [correct, rm, format]}}"],
    "PAR + gates": [f"aggregate={{{GATES}, transform: {{rm: {{par: {{reference: group_mean}}}}}}}}"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--label", default="")
    parser.add_argument("extra", nargs="*", help="overrides for every run (after --)")
    args = parser.parse_args()
    runs: dict[str, list] = {v: [] for v in args.variants}
    with tempfile.TemporaryDirectory(prefix="coevo-reward-layer-") as tmp:
        work = Path(tmp)
        for seed in args.seeds:  # interleaved: every variant for a seed before the next seed
            for i, v in enumerate(args.variants):
                runs[v].append(coevo("mixed_rewards", [f"seed={seed}", *VARIANTS[v], *args.extra],
                                     work / f"{i}_{seed}", work / f"{i}_{seed}.log"))
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
