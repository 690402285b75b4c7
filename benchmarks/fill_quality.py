"""How good the reward on the unlabelled prompts is, read from a run's rollout dumps (issue 32).

A run with `train.dump_rollouts=true` and the task's verifier as a label-free, weight-0 column
beside its judge (`benchmarks/oracle_fill.py`, on PYTHONPATH) writes, for every row, what the judge
gave and what the verifier would have: e.g. on sorting

    PYTHONPATH=benchmarks coevo run self_judged_grpo ... verifier.fraction=0.25 train.dump_rollouts=true \\
        'rewards=[{name: sorted_digits}, {name: judge, judge: true, weight: 0},
                  {name: oracle, fn: "oracle_fill:oracle", weight: 0}]' 'aggregate.fill={sorted_digits: judge}'
    python benchmarks/fill_quality.py RUN_DIR [--source judge] [--every 5]

Per dumped step, on the rows the verifier did not label: the verifier's accuracy there, the
source's AUROC against it, the share of a group's (right, wrong) pairs the source orders right
(ties half) and the same for the group's vote share (how many of its responses give the same
text); and, from the advantages the learner got, the share of their mass pointing the right way less
the share pointing the wrong way (`align`, 1 for the verifier's own labels) and their summed size
(`mass`) on the unlabelled and the labelled rows. The dumped source column is the credit step's
(after calibration and gating)."""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def step_row(table: pd.DataFrame, source: str, oracle: str) -> dict:
    unlabelled = ~table["labelled"].astype(bool).to_numpy()
    right = table[f"reward.{oracle}"].to_numpy(float) >= 0.5
    score = table[f"reward.{source}"].to_numpy(float)
    groups = table["prompt_id"].astype("category").cat.codes.to_numpy()
    texts = table["response"].str.strip()
    share = np.zeros(len(table))
    for g in np.unique(groups):
        rows = np.nonzero(groups == g)[0]
        counts = Counter(texts.iloc[rows])
        share[rows] = [counts[t] / len(rows) for t in texts.iloc[rows]]
    out = {"verifier_acc": round(float(right[unlabelled].mean()), 3)}
    ok = unlabelled & ~np.isnan(score)
    if ok.any() and 0 < right[ok].mean() < 1:
        from orchestrator.evaluation import rank_quality

        judge, vote = (rank_quality(x[ok], right[ok], groups[ok]) for x in (score, share))
        out["auroc"] = round(judge["auroc"], 3)
        out["ordered"] = round(judge["pairs_ordered"] or float("nan"), 3)
        out["vote_ordered"] = round(vote["pairs_ordered"] or float("nan"), 3)
    advantage = np.array([float(np.mean(a)) if a is not None and len(a) else 0.0 for a in table["advantages"]])
    for name, rows in (("unlabelled", unlabelled), ("labelled", ~unlabelled)):
        a, sign = advantage[rows], np.where(right[rows], 1.0, -1.0)
        out[f"align_{name}"] = round(float((a * sign).sum() / (np.abs(a).sum() + 1e-12)), 3)
        out[f"mass_{name}"] = round(float(np.abs(a).sum()), 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir")
    parser.add_argument("--source", default="judge", help="the reward column that fills the unlabelled rows")
    parser.add_argument("--oracle", default="oracle", help="the verifier's label-free, weight-0 column")
    parser.add_argument("--every", type=int, default=5, help="read every this many dumped steps (and the last)")
    args = parser.parse_args()
    dumps = sorted(Path(args.run_dir, "rollouts").glob("step_*.parquet"), key=lambda p: int(re.findall(r"\d+", p.name)[-1]))
    if not dumps:
        raise SystemExit(f"error: {args.run_dir}/rollouts holds no step_*.parquet: run with train.dump_rollouts=true")
    rows = []
    for path in dumps[::args.every] + ([dumps[-1]] if (len(dumps) - 1) % args.every else []):
        table = pd.read_parquet(path)
        missing = [c for c in (f"reward.{args.source}", f"reward.{args.oracle}", "labelled", "advantages") if c not in table]
        if missing:
            raise SystemExit(f"error: {path} has no column {missing[0]!r} (columns: {list(table.columns)})")
        rows.append({"step": int(re.findall(r"\d+", path.name)[-1]), **step_row(table, args.source, args.oracle)})
    print(pd.DataFrame(rows).to_string(index=False))


if __name__ == "__main__":
    main()
