"""Pass@k training (Chen et al. 2025, "Pass@k Training for Adaptively Balancing Exploration and
Exploitation of Large Reasoning Models"), as a recipe file outside the package: GRPO whose group
reward is pass@k — did any of k samples of the prompt succeed — instead of each sample's own
reward. Its advantages have a closed form per group of n samples with c correct:

    mean   = 1 - C(n-c, k) / C(n, k)                   the group's pass@k
    std    = sqrt(mean * (1 - mean))
    A(correct) = (1 - mean) / std
    A(wrong)   = (1 - mean - C(n-c-1, k-1) / C(n-1, k-1)) / std

A wrong sample is penalised only by the share of k-subsets it sinks, so a prompt the policy already
solves sometimes keeps pushing for more distinct tries (exploration) rather than one sharp answer.
k = 1 is GRPO with binary rewards and a population std.

It needs nothing under orchestrator/ or actors/: the recipe owns its `pass_at_k` settings section;
the estimator is a plain function the learner finds by import path and hands the run's config.
Run it from the repository root: `coevo run examples/pass_at_k.yaml`.
"""

from __future__ import annotations

from math import comb

import torch
from pydantic import Field

from actors.algorithms.advantages import group_relative
from orchestrator.config import Section
from pipelines.grpo import GRPO

ESTIMATOR = "examples.pass_at_k:advantage"


class PassAtKConfig(Section):
    k: int = Field(4, ge=1)  # the k of pass@k; at most rollout.samples_per_prompt
    threshold: float = 0.5  # a sample is correct when its reward is >= this

    def cross_check(self, config) -> None:
        n = config.rollout.samples_per_prompt
        if self.k > n:
            raise ValueError(f"pass_at_k.k={self.k} needs at least k samples per prompt; "
                             f"rollout.samples_per_prompt is {n}")
        if config.algorithm.advantage != ESTIMATOR:
            raise ValueError(f"recipe pass_at_k trains with its own advantage: set algorithm.advantage "
                             f"to {ESTIMATOR!r} (got {config.algorithm.advantage!r})")


class PassAtK(GRPO):
    """GRPO's roles, channels and loop; only the advantage (and so the section) differs."""
    name = "pass_at_k"
    settings = {"pass_at_k": PassAtKConfig}


@group_relative
def advantage(rewards: torch.Tensor, groups: torch.Tensor, config) -> torch.Tensor:
    """Pass@k advantages [N] from rewards [N] and group indices [N] (config.pass_at_k: k, threshold)."""
    k, threshold = config.pass_at_k.k, config.pass_at_k.threshold
    correct = rewards >= threshold
    out = torch.zeros_like(rewards)
    for g in torch.unique(groups).tolist():
        rows = groups == g
        n, c = int(rows.sum()), int(correct[rows].sum())
        kk = min(k, n)
        mean = 1.0 - comb(n - c, kk) / comb(n, kk)
        std = (mean * (1.0 - mean)) ** 0.5
        if std == 0.0:  # all right or all wrong: no sample is better than another
            continue
        sink = comb(n - c - 1, kk - 1) / comb(n - 1, kk - 1) if n > c else 0.0
        out[rows & correct] = (1.0 - mean) / std
        out[rows & ~correct] = (1.0 - mean - sink) / std
    return out
