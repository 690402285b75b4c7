"""Policy losses (per token), off-policy corrections and KL estimators.

Every loss here returns a per-token loss [B, T] and a dict of per-token stats [B, T] (detached);
the learner masks and aggregates them (token mean). Advantages broadcast: [B, 1] for sequence-level,
[B, T] for token-level.
"""

from __future__ import annotations

import functools
import inspect

import torch

from actors.algorithms import KL_ESTIMATORS, OFF_POLICY, POLICY_LOSSES


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
             clip_eps: float = 0.2, clip_eps_high: float | None = None,
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate (Schulman et al. 2017) as used by GRPO, per token:
    -min(ratio * A, clip(ratio, 1-eps, 1+eps_high) * A), ratio = exp(logp - old_logp).

    `clip_eps_high` is DAPO's clip-higher (Yu et al. 2025): a wider upper bound 1+eps_high lets
    low-probability tokens with A > 0 grow further; None means eps_high = clip_eps (plain PPO).
    `advantages` broadcasts ([B, 1] for sequence-level). Returns loss [B, T] and per-token stats:
    clip_frac (1 where the clipped branch is taken, i.e. the token carries no gradient) and ratio."""
    high = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    return loss, {"clip_frac": (clipped < unclipped).float(), "ratio": ratio.detach()}


# ---- off-policy corrections -------------------------------------------------------------------
# A correction says what the policy loss is computed against, and with what weight; it composes with
# any registered policy loss (`corrected`). One interface:
#   (logprobs, behavior_logprobs, *, proximal_logprobs=None, is_cap=2.0) -> (anchor, weight, truncated)
# `behavior_logprobs` are the generator's log-probs of the sampled tokens; `proximal_logprobs` those of
# the learner's weights before this train step (recomputed; only decoupled_ppo needs them). `anchor`:
# the log-probs the policy loss uses as its old policy (its ratio and trust region are around them);
# `weight`: a detached per-token importance weight on the policy loss; `truncated`: 1 where the
# weight's cap applied. On-policy (logp == behaviour == proximal) all three give anchor == logp and
# weight 1: plain policy gradient, loss -A, gradient -A * grad(logp), for ppo_clip.

def _check_cap(is_cap: float | None) -> None:
    if is_cap is not None and not is_cap > 0:
        raise ValueError(f"is_cap must be > 0 (or None for no truncation), got {is_cap}")


def _truncated(log_w: torch.Tensor, is_cap: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Detached importance weight min(exp(log_w), cap) and where the cap applied (float 0/1)."""
    w = torch.exp(log_w.detach())
    if is_cap is None:
        return w, torch.zeros_like(w)
    return w.clamp(max=is_cap), (w > is_cap).float()


@OFF_POLICY.register("none")
def no_correction(logprobs: torch.Tensor, behavior_logprobs: torch.Tensor, *,
                  proximal_logprobs: torch.Tensor | None = None, is_cap: float | None = 2.0,
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """No correction beyond the policy loss's own: its old policy is the behaviour policy (PPO,
    Schulman et al. 2017). Exact when the data is on-policy; ignores `proximal_logprobs`, `is_cap`."""
    _check_cap(is_cap)
    ones = torch.ones_like(behavior_logprobs)
    return behavior_logprobs, ones, torch.zeros_like(ones)


@OFF_POLICY.register("tis")
def truncated_is(logprobs: torch.Tensor, behavior_logprobs: torch.Tensor, *,
                 proximal_logprobs: torch.Tensor | None = None, is_cap: float | None = 2.0,
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Truncated importance sampling: the truncated IS weights of IMPALA's V-trace (Espeholt et al.
    2018), used against rollout/training mismatch by Yao et al. 2025 ("Your efficient RL framework
    secretly brings you off-policy RL training").

    weight w = min(exp(logp - logp_behaviour), is_cap), detached, on the policy loss taken around the
    current weights (anchor = sg(logp): ratio 1, so ppo_clip never clips and its gradient is
    -w * A * grad(logp)). is_cap=None means plain IS."""
    _check_cap(is_cap)
    w, truncated = _truncated(logprobs - behavior_logprobs, is_cap)
    return logprobs.detach(), w, truncated


@OFF_POLICY.register("decoupled_ppo")
def decoupled_ppo(logprobs: torch.Tensor, behavior_logprobs: torch.Tensor, *,
                  proximal_logprobs: torch.Tensor | None = None, is_cap: float | None = 2.0,
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decoupled PPO (Hilton et al. 2022, "Batch size-invariance for policy optimization"; used for
    asynchronous RL by AReaL, Fu et al. 2025): the trust region is taken around the proximal policy
    (the learner's weights before this step), not around the stale behaviour policy, and the
    behaviour mismatch is corrected by w = min(exp(logp_proximal - logp_behaviour), is_cap), detached.
    With ppo_clip: loss = -w * min(r * A, clip(r, 1-eps, 1+eps_high) * A), r = exp(logp - logp_proximal).
    Raises ValueError without `proximal_logprobs`."""
    if proximal_logprobs is None:
        raise ValueError("decoupled_ppo needs proximal_logprobs: the log-probs of the sampled tokens under "
                         "the learner's weights before this train step (recompute them with no_grad)")
    _check_cap(is_cap)
    proximal = proximal_logprobs.detach()
    w, truncated = _truncated(proximal - behavior_logprobs, is_cap)
    return proximal, w, truncated


@functools.lru_cache(maxsize=None)
def takes(fn, keyword: str) -> bool:
    """Whether `fn` accepts `keyword` (looked up once per function)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return keyword in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def corrected(policy_loss, correction, logprobs: torch.Tensor, behavior_logprobs: torch.Tensor,
              advantages: torch.Tensor, *, proximal_logprobs: torch.Tensor | None = None,
              is_cap: float | None = 2.0, **loss_kwargs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`policy_loss` (any registered one) under an off-policy `correction`: weight * loss(logp, anchor, A).
    Stats: the loss's own (clip_frac, ratio ...), plus is_weight (the correction's weight) and
    is_truncated (where its cap applied)."""
    anchor, weight, truncated = correction(logprobs, behavior_logprobs, proximal_logprobs=proximal_logprobs,
                                           is_cap=is_cap)
    if "mask" in loss_kwargs and not takes(policy_loss, "mask"):
        loss_kwargs.pop("mask")  # a loss that works token by token needs no mask
    loss, stats = policy_loss(logprobs, anchor, advantages, **loss_kwargs)
    stats = dict(stats)
    stats.setdefault("clip_frac", torch.zeros_like(loss))
    stats.update(is_weight=weight.expand_as(loss), is_truncated=truncated.expand_as(loss))
    return weight * loss, stats


# ---- KL estimators (Schulman 2020, "Approximating KL divergence") -----------------------------
# Per token, estimates of KL(pi || ref) from samples of pi, with r = ref_logp - logp. Used as a loss
# term (algorithm.kl_estimator), what matters is the gradient through logp on samples of pi:
#   k1: grad = grad(logp); its expectation under pi is 0 (no pull towards ref in expectation).
#   k2: grad = (logp - ref) grad(logp); its expectation is grad KL(pi || ref), the reverse KL.
#   k3: grad = (1 - ref_p / p) grad(logp); its expectation is grad KL(ref || pi), the forward KL.
# (checked numerically in tests/test_algorithms.py). As values, k1 and k3 are unbiased for KL(pi || ref).

@KL_ESTIMATORS.register("k1")
def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k1: -r = logp - ref. Unbiased, high variance, can be negative; as a loss its
    expected gradient is 0."""
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k2")
def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k2: r^2 / 2. Biased (low bias near ref), low variance, always >= 0; as a loss its
    gradient follows the reverse KL(pi || ref)."""
    return 0.5 * (ref_logprobs - logprobs) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref), per token: exp(r) - r - 1 with r = ref - logp.
    Unbiased and always >= 0 as a value; as a loss its gradient follows the forward KL(ref || pi)."""
    r = ref_logprobs - logprobs
    return torch.exp(r) - r - 1
