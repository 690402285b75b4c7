"""Reward shaping and aggregation as small pure numpy functions.

Conventions shared by every function here:

- One value per sample, float arrays of shape [N]; NaN means "no value" (the source did not score
  the sample, by design or because it failed; callers keep a separate `failed` mask where the
  difference matters).
- Process (per-step) rewards are either one trajectory, shape [S], or a padded batch [N, S] with a
  boolean step mask of the same shape.
- Inputs are never modified; results are new float64 arrays (the Arrow stage casts to float32).

`actors.rewards.aggregate.Aggregator` composes these into the config-driven stage over a batch.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

# ---- aggregation ---------------------------------------------------------------------------------


def weighted_sum(
    values: Mapping[str, np.ndarray],
    weights: Mapping[str, float],
    failed: Mapping[str, np.ndarray] | None = None,
    on_error: float = 0.0,
) -> np.ndarray:
    """Weighted sum of per-source rewards: `total_i = sum_s weights[s] * c_s,i` where

    - `c_s,i = on_error`      if `failed[s][i]` (the source tried and failed; its value is ignored),
    - `c_s,i = 0`             else if `values[s][i]` is NaN (the source did not score sample i by
                              design, e.g. a verifier that labels only some prompts),
    - `c_s,i = values[s][i]`  otherwise.

    Only the sources named in `weights` are summed (other entries of `values` are ignored); a
    source missing from `failed` has no failures. A sample that no source scored gets 0, so the
    result never holds NaN. This is the usual linear scalarisation of multi-source rewards.
    """
    failed = failed or {}
    missing = [s for s in weights if s not in values]
    if missing:
        raise KeyError(f"weights name source(s) {missing} with no values; have {sorted(values)}")
    n = _common_length({s: values[s] for s in weights})
    total = np.zeros(n, dtype=np.float64)
    for source, weight in weights.items():
        v = np.asarray(values[source], dtype=np.float64)
        contrib = np.where(np.isnan(v), 0.0, v)
        if source in failed:
            bad = np.asarray(failed[source], dtype=bool)
            if bad.shape != v.shape:
                raise ValueError(f"failed[{source!r}] has shape {bad.shape}, values {v.shape}")
            contrib = np.where(bad, on_error, contrib)
        total += weight * contrib
    return total


def _common_length(arrays: Mapping[str, np.ndarray]) -> int:
    shapes = {s: np.shape(a) for s, a in arrays.items()}
    if not shapes:
        return 0
    first = next(iter(shapes.values()))
    bad = {s: sh for s, sh in shapes.items() if sh != first or len(sh) != 1}
    if bad:
        raise ValueError(f"per-source values must be 1-D arrays of one length; got {shapes}")
    return first[0]


# ---- normalisation -------------------------------------------------------------------------------


def normalize_group(x: np.ndarray, groups: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Normalise within prompt groups: `(x - mean_g) / (std_g + eps)` (the GRPO group
    normalisation of Shao et al. 2024, "DeepSeekMath", applied to one reward source).

    `groups` holds one key per sample (any dtype). Statistics use only the non-NaN values of a
    group, with the population std (ddof=0); NaN stays NaN. A group with a single valued sample,
    or whose values are all equal, gives 0 (never a division by zero, even with eps=0).
    """
    x = np.asarray(x, dtype=np.float64)
    codes = _group_codes(groups, len(x))
    valid = ~np.isnan(x)
    xv = np.where(valid, x, 0.0)
    n_groups = int(codes.max(initial=-1)) + 1
    count = np.bincount(codes, weights=valid.astype(np.float64), minlength=n_groups)
    total = np.bincount(codes, weights=xv, minlength=n_groups)
    mean = np.divide(total, count, out=np.zeros(n_groups), where=count > 0)
    dev = np.where(valid, x - mean[codes], 0.0)
    var = np.divide(np.bincount(codes, weights=dev * dev, minlength=n_groups), count,
                    out=np.zeros(n_groups), where=count > 0)
    std = np.sqrt(var)[codes]
    denom = std + eps
    out = np.divide(dev, denom, out=np.zeros_like(dev), where=denom > 0)
    return np.where(valid, out, np.nan)


def _group_codes(groups, n: int) -> np.ndarray:
    groups = np.asarray(groups)
    if groups.shape != (n,):
        raise ValueError(f"groups has shape {groups.shape}, expected ({n},)")
    return np.unique(groups, return_inverse=True)[1].reshape(-1).astype(np.int64)


class RunningNorm:
    """Running mean/variance of a reward source, for normalising across batches.

    `momentum=None` (default): exact statistics over every value seen so far, merged batch by
    batch with the parallel form of Welford's algorithm (Chan, Golub & LeVeque 1979): with the
    batch weight `w = n_batch / (n_seen + n_batch)`,
        mean <- mean + w (m_b - mean)
        var  <- (1 - w) var + w v_b + w (1 - w) (m_b - mean_old)^2        (population variance)
    `momentum=m` in (0, 1]: the same update with a fixed `w = m` (an exponential moving average
    that forgets old batches: reward models that co-evolve with the policy drift in scale); the
    first batch always sets the statistics (w = 1).

    NaNs are ignored by `update` and kept by `normalize`. Before the first update the statistics
    are mean 0, var 1, so `normalize` is (almost) the identity.
    """

    def __init__(self, momentum: float | None = None, eps: float = 1e-6):
        if momentum is not None and not 0.0 < momentum <= 1.0:
            raise ValueError(f"momentum must be in (0, 1] or None, got {momentum}")
        self.momentum = momentum
        self.eps = eps
        self.count = 0
        self.mean = 0.0
        self.var = 1.0

    @property
    def std(self) -> float:
        return float(np.sqrt(self.var))

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        x = x[~np.isnan(x)]
        if len(x) == 0:
            return
        m_b, v_b = float(x.mean()), float(x.var())
        if self.count == 0:
            w = 1.0
        elif self.momentum is None:
            w = len(x) / (self.count + len(x))
        else:
            w = self.momentum
        d = m_b - self.mean
        self.mean = self.mean + w * d
        self.var = (1.0 - w) * self.var + w * v_b + w * (1.0 - w) * d * d
        self.count += len(x)

    def normalize(self, x: np.ndarray) -> np.ndarray:
        """`(x - mean) / (std + eps)`; NaN stays NaN."""
        x = np.asarray(x, dtype=np.float64)
        return (x - self.mean) / (self.std + self.eps)

    def state_dict(self) -> dict:
        return {"count": int(self.count), "mean": float(self.mean), "var": float(self.var)}

    def load_state_dict(self, state: Mapping) -> None:
        missing = [k for k in ("count", "mean", "var") if k not in state]
        if missing:
            raise KeyError(f"RunningNorm state is missing {missing}; got keys {sorted(state)}")
        if float(state["var"]) < 0 or int(state["count"]) < 0:
            raise ValueError(f"RunningNorm state has negative count/var: {dict(state)}")
        self.count = int(state["count"])
        self.mean = float(state["mean"])
        self.var = float(state["var"])


# ---- G-RA gating ---------------------------------------------------------------------------------


def gate(lower: np.ndarray, higher: np.ndarray, threshold: float) -> np.ndarray:
    """G-RA gate (Sun et al. 2025, "Gated Reward Accumulation"): the lower-level (immediate)
    reward counts only where the higher-level reward meets the threshold.

    Returns `lower` where `higher >= threshold`, else 0. A NaN `higher` (not scored / failed)
    keeps the gate shut. A NaN `lower` passes through an open gate unchanged (still missing).
    """
    lower = np.asarray(lower, dtype=np.float64)
    higher = np.asarray(higher, dtype=np.float64)
    if lower.shape != higher.shape:
        raise ValueError(f"gate: lower has shape {lower.shape}, higher {higher.shape}")
    with np.errstate(invalid="ignore"):
        is_open = higher >= threshold
    return np.where(is_open, lower, 0.0)


# ---- Parrot: batch-wise Pareto-optimal selection -------------------------------------------------


def pareto_front(matrix: np.ndarray, groups: np.ndarray | None = None) -> np.ndarray:
    """Non-dominated rows of a [N, K] reward matrix (every column maximised), as in Parrot's
    "batch-wise Pareto-optimal selection" (Lee et al. 2024, "Parrot: Pareto-optimal Multi-Reward
    Reinforcement Learning Framework for Text-to-Image Generation").

    Row j dominates row i when `matrix[j] >= matrix[i]` in every column and `>` in at least one.
    A row is on the front when no other row dominates it; identical rows do not dominate each
    other, so ties are all kept. Rows holding any NaN are never on the front and dominate nothing.
    With `groups`, the front is computed within each group separately (e.g. per prompt group);
    without, over the whole batch (Parrot's choice). Cost O(N F K) for a front of F rows.
    """
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"pareto_front expects a [N, K] matrix, got shape {m.shape}")
    n = m.shape[0]
    front = np.zeros(n, dtype=bool)
    valid = ~np.isnan(m).any(axis=1)
    if groups is None:
        buckets = [np.nonzero(valid)[0]]
    else:
        codes = _group_codes(groups, n)
        order = np.argsort(codes[valid], kind="stable")
        idx = np.nonzero(valid)[0][order]
        cuts = np.nonzero(np.diff(codes[idx]))[0] + 1
        buckets = np.split(idx, cuts)
    for idx in buckets:
        if len(idx):
            front[idx] = _non_dominated(m[idx])
    return front


def _non_dominated(m: np.ndarray, chunk: int = 256) -> np.ndarray:
    """Front of one set of NaN-free rows. A dominator is lexicographically larger than the row it
    dominates, so rows are visited in descending lexicographic order, a chunk at a time; a row is
    dominated iff a front row found so far or a row of its own chunk dominates it (dominance is
    transitive). Cost O(N * F * K) for a front of F rows, not O(N^2 K)."""
    n, k = m.shape
    out = np.zeros(n, dtype=bool)
    order = np.lexsort(-m.T[::-1])                  # column 0 descending, ties by column 1, ...
    front = np.empty((0, k))
    for start in range(0, n, chunk):
        idx = order[start:start + chunk]
        rows = m[idx]
        dominated = _dominates(front, rows).any(axis=0) | _dominates(rows, rows).any(axis=0)
        out[idx[~dominated]] = True
        front = np.concatenate([front, rows[~dominated]])
    return out


def _dominates(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[len(a), len(b)]: a[i] >= b[j] everywhere and > somewhere."""
    ge = (a[:, None, :] >= b[None, :, :]).all(axis=2)
    gt = (a[:, None, :] > b[None, :, :]).any(axis=2)
    return ge & gt


DOMINATED_MODES = ("mask", "zero")


def apply_front(reward: np.ndarray, front: np.ndarray, dominated: str = "mask"
                ) -> tuple[np.ndarray, np.ndarray]:
    """Turn a Pareto front into (reward, train_mask).

    - `dominated="mask"` (default, Parrot): the reward is unchanged and `train_mask = front`, so
      the learner updates only on non-dominated samples. Dominated samples keep their aggregated
      reward so metrics and group baselines still see them; nothing is dropped from the batch.
    - `dominated="zero"`: dominated samples get reward 0 and every sample trains
      (`train_mask` all True). Not Parrot's rule; 0 is a penalty only if rewards are positive.
    """
    reward = np.asarray(reward, dtype=np.float64)
    front = np.asarray(front, dtype=bool)
    if dominated == "mask":
        return reward.copy(), front.copy()
    if dominated == "zero":
        return np.where(front, reward, 0.0), np.ones_like(front)
    raise ValueError(f"dominated must be one of {DOMINATED_MODES}, got {dominated!r}")


def pareto_reward(reward: np.ndarray, matrix: np.ndarray, groups: np.ndarray | None = None,
                  dominated: str = "mask") -> tuple[np.ndarray, np.ndarray]:
    """Parrot selection as a reward: `apply_front(reward, pareto_front(matrix, groups), dominated)`.
    `reward` is the aggregated scalar reward, `matrix` [N, K] the per-source rewards compared."""
    return apply_front(reward, pareto_front(matrix, groups), dominated)


# ---- Clipping and Delta for process rewards ------------------------------------------------------
# Gao et al. 2024, "On Designing Effective RL Reward at Training Time for LLM Reasoning": a policy
# can farm a process reward model by repeating correct but unnecessary steps; both mechanisms bound
# the return sum_{t>=k} r_t of every suffix of a trajectory.


def clip_steps(rewards: np.ndarray, eta: float) -> np.ndarray:
    """Clip mechanism on one trajectory: `r_t -> min(r_t - eta, 0)`.

    Every step reward is <= 0, so the return of any suffix is bounded above by 0: extra steps can
    only cost. Steps scored below the threshold eta are penalised by how far they fall short.
    """
    r = np.asarray(rewards, dtype=np.float64)
    return np.minimum(r - eta, 0.0)


def delta_steps(rewards: np.ndarray, drop_last: bool = False) -> np.ndarray:
    """Delta mechanism on one trajectory of S steps (telescoping differences).

    `drop_last=False`: r_t -> r_t - r_{t+1} for t < S-1 and r_{S-1} -> r_{S-1}, so the return from
    step k is exactly r_k (bounded by the PRM's range however many steps follow).
    `drop_last=True`: the last step's process reward is discarded (set to 0) and the rule above is
    applied to the first S-1 steps, so the return from step k < S-1 is r_k. This is our reading of
    the paper's Figure (the final, answer step carries the success reward instead).
    """
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1:
        raise ValueError(f"delta_steps expects one trajectory [S], got shape {r.shape}")
    if drop_last:
        out = np.zeros_like(r)
        if len(r) > 1:
            out[:-1] = delta_steps(r[:-1])
        return out
    out = r.copy()
    out[:-1] -= r[1:]
    return out


def clip_padded(rewards: np.ndarray, mask: np.ndarray, eta: float) -> np.ndarray:
    """`clip_steps` over a padded [N, S] batch; positions outside `mask` give 0."""
    r, mask = _padded(rewards, mask)
    return np.where(mask, np.minimum(r - eta, 0.0), 0.0)


def delta_padded(rewards: np.ndarray, mask: np.ndarray, drop_last: bool = False) -> np.ndarray:
    """`delta_steps` over a padded [N, S] batch. The steps of row i are its `mask` positions in
    order (they need not be contiguous); each step subtracts the next masked step's reward, the
    last masked step keeps its own (or is zeroed, and the one before becomes last, with
    `drop_last`). Positions outside `mask` give 0."""
    r, mask = _padded(rewards, mask)
    n, s = r.shape
    if drop_last:
        mask = mask & ~_last_true(mask)
    cols = np.arange(s)
    # next_idx[i, t] = first masked column > t in row i, or s (a virtual zero column) if none.
    idx = np.where(mask, cols[None, :], s)
    suffix_min = np.minimum.accumulate(idx[:, ::-1], axis=1)[:, ::-1]        # min over cols >= t
    next_idx = np.concatenate([suffix_min[:, 1:], np.full((n, 1), s)], axis=1)
    padded = np.concatenate([np.where(mask, r, 0.0), np.zeros((n, 1))], axis=1)
    nxt = np.take_along_axis(padded, next_idx, axis=1)
    return np.where(mask, r - nxt, 0.0)


def _last_true(mask: np.ndarray) -> np.ndarray:
    s = mask.shape[1]
    last = s - 1 - np.argmax(mask[:, ::-1], axis=1)
    out = np.zeros_like(mask)
    has = mask.any(axis=1)
    out[np.nonzero(has)[0], last[has]] = True
    return out


def _padded(rewards, mask) -> tuple[np.ndarray, np.ndarray]:
    r = np.asarray(rewards, dtype=np.float64)
    m = np.asarray(mask, dtype=bool)
    if r.ndim != 2 or m.shape != r.shape:
        raise ValueError(f"expected [N, S] rewards and a mask of the same shape; got {r.shape}, "
                         f"{m.shape}")
    return r, m


PROCESS_TRANSFORMS = {"clip", "delta"}


# ---- PAR: Preference As Reward -------------------------------------------------------------------


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Numerically stable logistic function; NaN stays NaN."""
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def par(reward: np.ndarray, reference: np.ndarray | float) -> np.ndarray:
    """PAR (Fu et al. 2025, "Reward Shaping to Mitigate Reward Hacking in RLHF"):
    `r' = sigmoid(r - r_ref)`, the reward model's own preference probability (Bradley-Terry) of
    the response over a reference response. Bounded in (0, 1), steepest at r = r_ref (rapid
    initial growth, then saturation), and a function of the centered reward.

    `reference` is a scalar, an array [N] (one reference reward per sample) or [N, M] (M reference
    rewards per sample, averaged as `mean_m sigmoid(r - r_ref_m)`). NaN in r or a reference gives
    NaN.
    """
    r = np.asarray(reward, dtype=np.float64)
    ref = np.asarray(reference, dtype=np.float64)
    if ref.ndim == 2:
        if ref.shape[0] != r.shape[0]:
            raise ValueError(f"par: reference has shape {ref.shape}, reward {r.shape}")
        return sigmoid(r[:, None] - ref).mean(axis=1)
    return sigmoid(r - ref)
