"""Outcome advantage estimators: one scalar per sample from its reward and its group.

Each takes `rewards` [N] and `groups` [N] (int group index, samples of one prompt share it) and
returns advantages [N].
"""

from __future__ import annotations

import torch

from actors.algorithms import ADVANTAGES


def group_stats(rewards: torch.Tensor, groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample group mean, unbiased group std and group size (vectorised, no Python loop)."""
    n_groups = int(groups.max()) + 1 if len(groups) else 0
    size = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, groups, torch.ones_like(rewards))
    total = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, groups, rewards)
    mean = total / size
    sq = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, groups, (rewards - mean[groups]) ** 2)
    std = torch.sqrt(sq / (size - 1).clamp(min=1))
    return mean[groups], std[groups], size[groups]


@ADVANTAGES.register("grpo")
def grpo(rewards: torch.Tensor, groups: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """GRPO (Shao et al. 2024, DeepSeekMath): (r - mean_group) / (std_group + eps)."""
    mean, std, _ = group_stats(rewards, groups)
    return (rewards - mean) / (std + eps)


@ADVANTAGES.register("dr_grpo")
def dr_grpo(rewards: torch.Tensor, groups: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025): r - mean_group, no std normalisation."""
    mean, _, _ = group_stats(rewards, groups)
    return rewards - mean


@ADVANTAGES.register("rloo")
def rloo(rewards: torch.Tensor, groups: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024): r minus the mean of the *other* samples of the group."""
    mean, _, size = group_stats(rewards, groups)
    return (rewards - mean) * size / (size - 1).clamp(min=1)
