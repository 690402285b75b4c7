"""The critic's value loss (PPO): per token, the worse of the unclipped and the clipped squared error,
with the new value clipped to within `clip_eps` of the value at sampling time."""

from __future__ import annotations

import torch


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       clip_eps: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`max((V - R)^2, (clip(V, V_old - eps, V_old + eps) - R)^2) / 2` per token [B, T]; stats:
    `clip_frac`, 1 where the clipped error is the larger (its gradient is then zero)."""
    clipped = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
    unclipped_err = (values - returns) ** 2
    clipped_err = (clipped - returns) ** 2
    loss = 0.5 * torch.maximum(unclipped_err, clipped_err)
    return loss, {"clip_frac": (clipped_err > unclipped_err).float()}
