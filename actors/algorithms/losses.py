"""Policy losses (per token) and the KL estimator. The learner aggregates with a token mean."""

from __future__ import annotations

import torch

from actors.algorithms import POLICY_LOSSES


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
             clip_eps: float = 0.2) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate (Schulman et al. 2017) as used by GRPO, per token:
    -min(ratio * A, clip(ratio, 1-eps, 1+eps) * A), ratio = exp(logp - logp_behaviour).
    `advantages` broadcasts ([B, 1] for sequence-level). Returns loss [B, T] and per-token stats."""
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * advantages
    loss = -torch.minimum(unclipped, clipped)
    return loss, {"clip_frac": (clipped < unclipped).float(), "ratio": ratio.detach()}


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref), per token: exp(r) - r - 1 with r = ref - logp.
    Unbiased and always >= 0."""
    r = ref_logprobs - logprobs
    return torch.exp(r) - r - 1
