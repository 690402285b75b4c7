"""Where the verifier's labels go (`verifier.select`, issue 32): with `verifier.fraction` < 1 the
verifier labels a fraction of the training prompts. `random` (the default) fixes that subset once,
per prompt and seeded (orchestrator/data.py), so a label is spent without looking at the samples:
the setting for a dataset whose answers exist for only part of it. Where the verifier could label
any prompt and its labels are the budget (a slow test suite, a paid grader), the other choices spend
that budget after generation, on the groups where a label is worth most, piece by piece: each piece labels `fraction` x its groups (rounded at random, so the
expected count is the same as `random`'s), picked by

- `distinct`: the groups with the most distinct responses. It needs no judge: a group whose
  samples all say the same thing gets no group-relative advantage whatever its label;
- `judge_unsure`: the groups whose judge scores sit closest to 0.5 on average (a `judge: true`
  reward source, judged before the verifier runs): the verifier labels what the judge cannot tell,
  and the judge's reward fills in where it is sure.

Ties go at random. The random draws are seeded by `seed` and the piece's group ids, so a piece
generated again after a resume labels the same groups. The judging warm-ups still read the
dataset's fixed subset (the `labelled` column of the prompts), so their cache and start are the
ones `random` gets."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa

from actors import batch as B

SELECT = ("random", "distinct", "judge_unsure")


def _rng(table: pa.Table, seed: int) -> np.random.Generator:
    ids = sorted(set(table.column("group_id").to_pylist()))
    digest = hashlib.sha256("\n".join(ids).encode()).digest()
    return np.random.default_rng([seed, int.from_bytes(digest[:8], "little")])


def group_priority(table: pa.Table, how: str, judge_column: str | None = None,
                   groups: np.ndarray | None = None) -> np.ndarray:
    """Per group (in group_index order, `groups` where the caller has it), how much a label is worth
    there: higher first."""
    groups = B.group_index(table) if groups is None else groups
    n = int(groups.max()) + 1 if len(groups) else 0
    if how == "distinct":
        responses = table.column("response").to_pylist()
        return np.array([len({responses[i] for i in np.nonzero(groups == g)[0]}) for g in range(n)], np.float64)
    if how == "judge_unsure":
        if judge_column not in table.schema.names:
            raise B.BatchError(f"verifier.select=judge_unsure reads the judge's scores from `{judge_column}`; the "
                               f"piece has {table.schema.names}")
        scores = table.column(judge_column).to_numpy(zero_copy_only=False).astype(np.float64)
        out = np.empty(n)
        for g in range(n):
            s = scores[groups == g]
            s = s[~np.isnan(s)]
            # a group the judge could not score at all is the least known: label it first
            out[g] = 1.0 - 2.0 * float(np.abs(s - 0.5).mean()) if len(s) else 2.0
        return out
    raise ValueError(f"verifier.select {how!r}: expected one of {SELECT}")


def choose_labelled(table: pa.Table, fraction: float, how: str, seed: int,
                    judge_column: str | None = None) -> tuple[pa.Table, dict]:
    """The piece with its `labelled` column set to the groups `how` picks, `fraction` of them (in
    expectation), and what was picked: `labels/groups` and `labels/priority` (the chosen groups'
    mean priority, against `labels/priority_all`)."""
    groups = B.group_index(table)
    if not len(groups):
        return table, {}
    rng = _rng(table, seed)
    n = int(groups.max()) + 1
    budget = min(n, int(np.floor(fraction * n + rng.random())))
    priority = group_priority(table, how, judge_column, groups)
    order = np.lexsort((rng.random(n), -priority))  # highest priority first, ties at random
    chosen = order[:budget]
    labelled = np.isin(groups, chosen)
    table = B.replace_column(table, "labelled", pa.array(labelled, pa.bool_()))
    return table, {"labels/groups": float(budget), "labels/priority": float(priority[chosen].mean()) if budget else None,
                   "labels/priority_all": float(priority.mean())}


def label_metrics(infos: list[dict]) -> dict:
    """The batch's `labels/*` from its pieces' infos: groups labelled, and the chosen and all groups'
    mean priorities (weighted by the pieces' label counts; {} where nothing was selected)."""
    picked = [i for i in infos if "labels/groups" in i]
    if not picked:
        return {}
    groups = sum(i["labels/groups"] for i in picked)
    chosen = [(i["labels/priority"], i["labels/groups"]) for i in picked if i.get("labels/priority") is not None]
    return {"labels/groups": groups,
            "labels/priority": sum(p * n for p, n in chosen) / sum(n for _, n in chosen) if chosen else None,
            "labels/priority_all": float(np.mean([i["labels/priority_all"] for i in picked]))}
