"""Preference pairs built from groups of sampled responses (one group per prompt).

Inputs are numpy arrays or CPU torch tensors of length N (one entry per response); `groups` may hold
any hashable keys numpy can sort (ints, prompt-id strings). Outputs are numpy int64 index arrays
(chosen_idx, rejected_idx) into those N rows, directly usable with `pyarrow.Table.take`, plus a stats
dict of counts. Pairs come out group by group, in sorted group order.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np


def _group_rows(groups: Any) -> tuple[np.ndarray, list[np.ndarray]]:
    """The distinct groups (sorted) and, for each, its row indices (ascending)."""
    keys, inverse = np.unique(np.asarray(groups), return_inverse=True)
    if len(keys) == 0:
        return keys, []
    order = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.bincount(inverse.reshape(-1), minlength=len(keys)))[:-1]
    return keys, np.split(order, bounds)


def _labels(correct: Any, labelled: Any | None) -> tuple[np.ndarray, np.ndarray]:
    """(is_correct, is_labelled) as bool arrays, from bools + a mask, or floats with NaN unlabelled."""
    c = np.asarray(correct)
    if c.dtype == bool:
        lab = np.ones(len(c), dtype=bool) if labelled is None else np.asarray(labelled, dtype=bool)
        return c, lab
    c = c.astype(np.float64)
    lab = ~np.isnan(c)
    if labelled is not None:
        lab &= np.asarray(labelled, dtype=bool)
    bad = lab & (c != 0) & (c != 1)
    if bad.any():
        raise ValueError(f"correct must be bool, or 1.0 / 0.0 / NaN (unlabelled); got {c[bad][:3].tolist()}")
    return lab & (c == 1), lab


def labelled_pairs(groups: Any, correct: Any, scores: Any | None = None,
                   selection: Literal["hardest", "random"] = "hardest", pairs_per_group: int = 1,
                   rng: np.random.Generator | int | None = None, labelled: Any | None = None,
                   ) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """Verifier-labelled positive/negative pairs for reward-model training, as in Cooper (Hong et al.
    2025, "Cooper: Co-Optimizing Policy and Reward Models"): within each prompt group that has at
    least one correct and one wrong labelled response, pair a correct (chosen) with a wrong (rejected).

    `correct`: bool [N] with an optional bool `labelled` mask, or float [N] with 1.0 / 0.0 and NaN for
    unlabelled. `selection`:
      - "hardest": the pairs the reward model currently mis-orders most, i.e. the largest
        scores[wrong] - scores[correct]; the first is the lowest-scored correct response against the
        highest-scored wrong one. Needs `scores`; responses with NaN scores are left out. Ties go to
        the lower (correct, wrong) indices.
      - "random": distinct (correct, wrong) pairs drawn uniformly without replacement with `rng`
        (a numpy Generator or a seed; None draws fresh entropy, so pass one for reproducibility).
    Each group gives min(pairs_per_group, n_correct * n_wrong) pairs.

    Stats: pairs, groups, groups_paired, skipped_all_correct, skipped_all_wrong, skipped_unlabelled
    (no usable labelled response at all), unscored (responses left out by "hardest" for a NaN score).
    """
    if selection not in ("hardest", "random"):
        raise ValueError(f"selection must be 'hardest' or 'random', got {selection!r}")
    if pairs_per_group < 1:
        raise ValueError(f"pairs_per_group must be >= 1, got {pairs_per_group}")
    is_correct, usable = _labels(correct, labelled)
    unscored = 0
    if selection == "hardest":
        if scores is None:
            raise ValueError("selection='hardest' needs the reward model's scores")
        s = np.asarray(scores, dtype=np.float64)
        unscored = int((usable & np.isnan(s)).sum())
        usable = usable & ~np.isnan(s)
    else:
        rng = np.random.default_rng(rng)

    keys, rows_by_group = _group_rows(groups)
    chosen, rejected = [], []
    stats = {"pairs": 0, "groups": len(keys), "groups_paired": 0, "skipped_all_correct": 0,
             "skipped_all_wrong": 0, "skipped_unlabelled": 0, "unscored": unscored}
    for rows in rows_by_group:
        rows = rows[usable[rows]]
        pos, neg = rows[is_correct[rows]], rows[~is_correct[rows]]
        if len(rows) == 0:
            stats["skipped_unlabelled"] += 1
            continue
        if len(neg) == 0:
            stats["skipped_all_correct"] += 1
            continue
        if len(pos) == 0:
            stats["skipped_all_wrong"] += 1
            continue
        k = min(pairs_per_group, len(pos) * len(neg))
        if selection == "hardest":
            hardness = s[neg][None, :] - s[pos][:, None]  # [n_pos, n_neg], row-major = (pos, neg) index order
            flat = np.argsort(-hardness.reshape(-1), kind="stable")[:k]
        else:
            flat = rng.choice(len(pos) * len(neg), size=k, replace=False)
        chosen.append(pos[flat // len(neg)])
        rejected.append(neg[flat % len(neg)])
        stats["pairs"] += k
        stats["groups_paired"] += 1
    return _cat(chosen), _cat(rejected), stats


def best_worst_pairs(groups: Any, scores: Any, margin: float = 0.0,
                     ) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """Self-Rewarding LM pairs (Yuan et al. 2024): in each group, the highest-scored response (chosen)
    against the lowest-scored one (rejected), scores coming from the model's own LLM-as-judge.

    NaN scores (judgments that could not be parsed) are ignored. A group is skipped when fewer than
    two responses are scored (skipped_unscored), when its best and worst tie (skipped_tie), or when
    they differ by less than `margin` (skipped_margin; a difference equal to the margin is kept).
    Among equal scores the lower index is taken. Stats: pairs, groups, skipped_tie, skipped_margin,
    skipped_unscored."""
    s = np.asarray(scores, dtype=np.float64)
    keys, rows_by_group = _group_rows(groups)
    chosen, rejected = [], []
    stats = {"pairs": 0, "groups": len(keys), "skipped_tie": 0, "skipped_margin": 0, "skipped_unscored": 0}
    for rows in rows_by_group:
        rows = rows[~np.isnan(s[rows])]
        if len(rows) < 2:
            stats["skipped_unscored"] += 1
            continue
        best, worst = rows[np.argmax(s[rows])], rows[np.argmin(s[rows])]  # argmax/argmin: first occurrence
        gap = s[best] - s[worst]
        if gap == 0:
            stats["skipped_tie"] += 1
        elif gap < margin:
            stats["skipped_margin"] += 1
        else:
            chosen.append([best])
            rejected.append([worst])
            stats["pairs"] += 1
    return _cat(chosen), _cat(rejected), stats


def _cat(parts: list) -> np.ndarray:
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)
