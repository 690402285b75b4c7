"""Probe prompts (`verifier.probe_share`, issue 32): a share of the labelled training prompts that no
judge or reward model trains on, so that what reads a learned reward's quality reads it where the
reward has not learned the answers.

A judge trained on the verifier's labels of a few prompts learns those prompts' answers before it
learns the check: on sorting with 80-100 labelled prompts its AUROC on their samples was 0.85-0.94
while on held-out prompts it was 0.65-0.80 (docs/benchmarks.md), and every guard read the first.
With probes, the policy still trains on the probe prompts with the verifier's reward, but

- the judging warm-ups and LaSeR's alignment draw their labelled prompts from the others
  (`trainable_labelled`);
- each train batch reaches the learners with the verifier's labels hidden (null) on probe rows,
  after the credit step has turned them into advantages (`hide_labels`, called by the loop): the
  online judge learner, SPARK's judge loss, SPC's critic items, a reward model's or PRIME's pairs
  and LaSeR's alignment loss all read labels from that batch;
- judge_credit's guard and calibration and self_rewarding's guard read the probe rows alone.

Caveat: where the judge shares the policy's weights, the policy's own training on the probe prompts
reaches the judge; the benchmark reports the probe AUROC beside the held-out one."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from actors import batch as B


def probe_mask(table: pa.Table) -> np.ndarray | None:
    """Which rows are probes (None: the table has no `probe` column)."""
    if "probe" not in table.schema.names:
        return None
    return table.column("probe").to_numpy(zero_copy_only=False).astype(bool)


def trainable_labelled(train: pa.Table) -> pa.Table:
    """The training prompts a judge or reward model may learn from: the labelled ones (all where
    the verifier labels every prompt) that are not probes."""
    if "labelled" in train.schema.names:
        train = train.filter(train.column("labelled"))
    probe = probe_mask(train)
    return train if probe is None else train.filter(pa.array(~probe))


def probes_note(train: pa.Table) -> str:
    """' (N more labelled ones held out as probes: ...)' for a warm-up's progress line, or ''."""
    probe = probe_mask(train)
    return "" if probe is None else f" ({int(probe.sum())} more labelled ones held out as probes: verifier.probe_share)"


def hide_labels(table: pa.Table, sources: list[str]) -> pa.Table:
    """`table` with the reward columns of `sources` (the verifier's) null on its probe rows."""
    probe = probe_mask(table)
    if probe is None or not probe.any():
        return table
    for name in sources:
        column = B.REWARD_PREFIX + name
        if column in table.schema.names:
            values = table.column(column).to_numpy(zero_copy_only=False).astype(np.float32)
            values[probe] = np.nan
            table = B.replace_column(table, column, pa.array(values, pa.float32(), mask=np.isnan(values)))
    return table


async def hidden_batch(config, tables: list) -> list:
    """The loop's call before the learners: each piece (object ref or table) with its verifier
    labels hidden on probe rows, put back in the object store; the pieces themselves where
    `verifier.probe_share` is 0."""
    if not config.verifier.probe_share:
        return tables
    import ray

    sources = [r.name for r in config.fn_rewards()]
    fetched = [await t if isinstance(t, ray.ObjectRef) else t for t in tables]
    return [ray.put(hide_labels(t, sources)) for t in fetched]
