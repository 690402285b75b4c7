"""The aggregation stage, measured: a verifier, a reward model and a format reward combined with
G-RA gating (pipelines/mixed_rewards.yaml), Parrot's Pareto selection and PAR shaping, against the
outcome verifier alone; same warm start, same steps.

    python benchmarks/reward_layer.py                    # every variant, seeds 0 1 2
    python benchmarks/reward_layer.py --variants parrot --seeds 0 -- train.max_steps=30

Writes benchmarks/results/raw/reward_layer<label>.json and a markdown table to stdout and to the summary
benchmarks/results/reward_layer.md.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coevolve import evals, median_range, run_variants, variants_cli  # noqa: E402
from summary import raw_path, write as write_summary  # noqa: E402

GATES = "gate: [{source: rm, when: correct, threshold: 1.0}, {source: format, when: correct, threshold: 1.0}]"
VARIANTS = {
    "outcome only": ["rewards=[{name: correct, fn: integer_match}]", "aggregate={}"],
    "gated (G-RA)": [],
    "Parrot": ["aggregate={select: {pareto: [correct, rm, format]}}"],
    "PAR + gates": [f"aggregate={{{GATES}, transform: {{rm: {{par: {{reference: group_mean}}}}}}}}"],
}


def markdown(table: dict) -> str:
    """The summary table from a results file's `table` (per variant, one value per seed)."""
    return "\n".join(["### Reward aggregation: gating, Parrot, PAR", "",
                      "| aggregation | seeds | held-out acc start | end | best | RL wall s |", "|---|---:|---:|---:|---:|---:|",
                      *(f"| {v} | {len(c['acc_end'])} | {median_range(c['acc_start'])} | {median_range(c['acc_end'])} | "
                        f"{median_range(c['acc_best'])} | {median_range(c['train_s'])} |" for v, c in table.items())])


def main() -> None:
    args = variants_cli(__doc__, VARIANTS)
    runs = run_variants("mixed_rewards", VARIANTS, args)
    table = {}
    for v, rs in runs.items():
        table[v] = {"acc_start": [r["summary"].get("warmup/accuracy") for r in rs],
                    "acc_end": [evals(r["rows"])[-1][2] for r in rs],
                    "acc_best": [max(a for _, _, a in evals(r["rows"])) for r in rs],
                    "train_s": [r["summary"]["time/train_s"] for r in rs],
                    "pareto_masked": [r["rows"][-1].get("reward/pareto/masked") for r in rs]}
    md = markdown(table)
    print("\n" + md)
    out = raw_path(f"reward_layer{args.label}.json")
    slim = {v: [{k: r[k] for k in ("overrides", "wall_s", "summary", "load_avg")} |
                {"evals": evals(r["rows"])} for r in rs] for v, rs in runs.items()}
    out.write_text(json.dumps({"machine": platform.processor() or platform.machine(), "seeds": args.seeds,
                               "table": table, "runs": slim}, indent=1))
    summary = write_summary("reward_layer", out.stem, md, raw=[out],
                            protocol=f"seeds {args.seeds}, variants {args.variants}; overrides {args.extra or 'none'}")
    print(f"\nraw: {out}\nsummary: {summary}")


if __name__ == "__main__":
    main()
