"""Policy losses (per token), off-policy corrections and KL estimators.

Every loss here returns a per-token loss [B, T] and a dict of per-token stats [B, T] (detached);
the learner masks and aggregates them (token mean). Advantages broadcast: [B, 1] for sequence-level,
[B, T] for token-level.
"""

from __future__ import annotations

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
# One interface: (logprobs, behavior_logprobs, advantages, *, proximal_logprobs=None, clip_eps,
# clip_eps_high=None, is_cap=2.0) -> (loss [B, T], stats). `behavior_logprobs` are the generator's
# log-probs of the sampled tokens; `proximal_logprobs` are those of the learner's weights before
# this train step (recomputed by the learner; only decoupled_ppo needs them). Stats always hold
# "clip_frac" and "is_weight" (the detached behaviour-correction weight; 1 where there is none).
# On-policy (logp == behaviour == proximal) all three give clip_frac 0, is_weight 1, loss -A and
# gradient -A * grad(logp): plain policy gradient.

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
def no_correction(logprobs: torch.Tensor, behavior_logprobs: torch.Tensor, advantages: torch.Tensor, *,
                  proximal_logprobs: torch.Tensor | None = None, clip_eps: float,
                  clip_eps_high: float | None = None, is_cap: float | None = 2.0,
                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """No correction beyond PPO's own: `ppo_clip` with the behaviour log-probs as the old policy
    (Schulman et al. 2017; clip-higher from DAPO, Yu et al. 2025). Exact when the data is on-policy;
    ignores `proximal_logprobs` and `is_cap`. is_weight is 1 (the ratio itself is in stats["ratio"])."""
    _check_cap(is_cap)
    loss, stats = ppo_clip(logprobs, behavior_logprobs, advantages, clip_eps=clip_eps, clip_eps_high=clip_eps_high)
    stats["is_weight"] = torch.ones_like(stats["ratio"])
    return loss, stats


@OFF_POLICY.register("tis")
def truncated_is(logprobs: torch.Tensor, behavior_logprobs: torch.Tensor, advantages: torch.Tensor, *,
                 proximal_logprobs: torch.Tensor | None = None, clip_eps: float,
                 clip_eps_high: float | None = None, is_cap: float | None = 2.0,
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Truncated importance-sampling policy gradient: the truncated IS weights of IMPALA's V-trace
    (Espeholt et al. 2018), used against rollout/training mismatch by Yao et al. 2025 ("Your
    efficient RL framework secretly brings you off-policy RL training").

    w = min(exp(logp - logp_behaviour), is_cap), detached; gradient = -w * A * grad(logp).
    The loss is written -w * A * exp(logp - sg(logp)): its gradient is exactly that of
    -w * A * logp, and its value (-w * A) is comparable with the PPO losses'. No clipping of the
    ratio (clip_eps, clip_eps_high and proximal_logprobs are ignored); is_cap=None means plain IS.
    clip_frac = 1 where the truncation applied (w > cap)."""
    _check_cap(is_cap)
    w, truncated = _truncated(logprobs - behavior_logprobs, is_cap)
    unit = torch.exp(logprobs - logprobs.detach())  # == 1, gradient grad(logp)
    loss = -w * advantages * unit
    return loss, {"clip_frac": truncated, "is_weight": w, "ratio": torch.exp(logprobs - behavior_logprobs).detach()}


@OFF_POLICY.register("decoupled_ppo")
def decoupled_ppo(logprobs: torch.Tensor, behavior_logprobs: torch.Tensor, advantages: torch.Tensor, *,
                  proximal_logprobs: torch.Tensor | None = None, clip_eps: float,
                  clip_eps_high: float | None = None, is_cap: float | None = 2.0,
                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Decoupled PPO objective (Hilton et al. 2022, "Batch size-invariance for policy optimization";
    used for asynchronous RL by AReaL, Fu et al. 2025): the trust region is taken around the
    proximal policy (the learner's weights before this step), not around the stale behaviour policy
    that sampled the data, and the behaviour mismatch is corrected by an importance weight:

        loss = -w * min(r * A, clip(r, 1-eps, 1+eps_high) * A),
        r = exp(logp - logp_proximal),  w = min(exp(logp_proximal - logp_behaviour), is_cap) (detached).

    clip_frac = where the clipped branch is taken (as in ppo_clip); is_weight = w; is_truncated = where
    the cap applied. Raises ValueError without `proximal_logprobs`."""
    if proximal_logprobs is None:
        raise ValueError("decoupled_ppo needs proximal_logprobs: the log-probs of the sampled tokens under "
                         "the learner's weights before this train step (recompute them with no_grad)")
    _check_cap(is_cap)
    proximal = proximal_logprobs.detach()
    w, truncated = _truncated(proximal - behavior_logprobs, is_cap)
    clipped_loss, stats = ppo_clip(logprobs, proximal, advantages, clip_eps=clip_eps, clip_eps_high=clip_eps_high)
    stats.update(is_weight=w, is_truncated=truncated)
    return w * clipped_loss, stats


# ---- KL estimators (Schulman 2020, "Approximating KL divergence") -----------------------------
# Per token, estimates of KL(pi || ref) from samples of pi, with r = ref_logp - logp.

@KL_ESTIMATORS.register("k1")
def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k1: -r = logp - ref. Unbiased, high variance, can be negative."""
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k2")
def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k2: r^2 / 2. Biased (low bias near ref), low variance, always >= 0."""
    return 0.5 * (ref_logprobs - logprobs) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref), per token: exp(r) - r - 1 with r = ref - logp.
    Unbiased and always >= 0."""
    r = ref_logprobs - logprobs
    return torch.exp(r) - r - 1
