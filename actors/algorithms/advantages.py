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


def group_relative(fn):
    """Marks an estimator that compares the samples of one prompt with each other: it needs at least
    two samples per prompt, and gives exactly 0 to every sample of a group whose rewards are equal."""
    fn.group_relative = True
    return fn


@ADVANTAGES.register("grpo")
@group_relative
def grpo(rewards: torch.Tensor, groups: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """GRPO (Shao et al. 2024, DeepSeekMath): (r - mean_group) / (std_group + eps)."""
    mean, std, _ = group_stats(rewards, groups)
    return (rewards - mean) / (std + eps)


@ADVANTAGES.register("grpo_bernoulli")
@group_relative
def grpo_bernoulli(rewards: torch.Tensor, groups: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """GRPO for rewards that are probabilities of being right (a verifier's 0/1, a calibrated
    judge's P(correct)): (r - mean_group) / (s_group + eps), where s is the std that 0/1 outcomes
    with the group's mean would have, sqrt(mean (1 - mean) n / (n - 1)). On 0/1 rewards that is the
    group's own (unbiased) std, so this is GRPO exactly; on probabilities it is larger than their
    spread (Var(p) <= mean (1 - mean) for p in [0, 1]), so an unsure judge whose values sit near
    their mean gets small advantages and a sure one (values near 0 and 1) GRPO's unit-size ones.
    GRPO's own std would scale any spread, noise or not, up to unit size (issue 32: rewards from a
    judge carry their confidence). Rewards outside [0, 1] have no such std: an error."""
    lo, hi = (float(rewards.min()), float(rewards.max())) if len(rewards) else (0.0, 1.0)
    if lo < 0 or hi > 1:
        raise ValueError(f"grpo_bernoulli needs rewards in [0, 1] (0/1 labels or probabilities); got values in "
                         f"[{lo:.4g}, {hi:.4g}] (the aggregated reward: the sources' "
                         "weights, penalties and normalisation set its range): use grpo or dr_grpo, or rewards that "
                         "are probabilities (judge_credit.confidence: calibrated or gated)")
    mean, _, size = group_stats(rewards, groups)
    std = torch.sqrt((mean * (1 - mean)).clamp(min=0) * size / (size - 1).clamp(min=1))
    return (rewards - mean) / (std + eps)


@ADVANTAGES.register("psr")
@group_relative
def psr(rewards: torch.Tensor, groups: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """Positive sample reinforcement with GRPO's weights: only the samples better than their group's
    mean are reinforced, each with its GRPO advantage (r - mean_group) / (std_group + eps); the
    others get 0 and carry no gradient (the learner skips their forward pass). Zhu et al. 2025 ("The
    Surprising Effectiveness of Negative Reinforcement in LLM Reasoning") split RL with verifiable
    rewards into reinforcing correct samples (PSR) and penalising wrong ones (NSR), and found PSR
    alone raises greedy accuracy (pass@1) fastest while narrowing pass@k at large k. Their PSR gives
    every correct sample weight 1; here a sample that beats a mostly-wrong group counts more, and a
    group whose samples all tie counts 0, as in GRPO (docs/benchmarks.md measures both)."""
    return grpo(rewards, groups, eps).clamp(min=0)


@ADVANTAGES.register("dr_grpo")
@group_relative
def dr_grpo(rewards: torch.Tensor, groups: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025): r - mean_group, no std normalisation."""
    mean, _, _ = group_stats(rewards, groups)
    return rewards - mean


@ADVANTAGES.register("rloo")
@group_relative
def rloo(rewards: torch.Tensor, groups: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024): r minus the mean of the *other* samples of the group."""
    mean, _, size = group_stats(rewards, groups)
    return (rewards - mean) * size / (size - 1).clamp(min=1)


@ADVANTAGES.register("reinforce_pp")
def reinforce_pp(rewards: torch.Tensor, groups: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """REINFORCE++ (Hu 2025): no critic and no group baseline; the rewards are normalised over the
    whole train batch, (r - mean_batch) / (std_batch + eps)."""
    if len(rewards) < 2:
        return torch.zeros_like(rewards)
    return (rewards - rewards.mean()) / (rewards.std() + eps)


@ADVANTAGES.register("reinforce_pp_baseline")
@group_relative
def reinforce_pp_baseline(rewards: torch.Tensor, groups: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """REINFORCE++ with the group baseline (Hu 2025): r - mean_group, then normalised over the whole
    train batch, a / (std_batch(a) + eps) (its batch mean is 0 already)."""
    mean, _, _ = group_stats(rewards, groups)
    a = rewards - mean
    if len(a) < 2:
        return torch.zeros_like(a)
    return (a - a.mean()) / (a.std() + eps)


@ADVANTAGES.register("gae")
def gae(rewards: torch.Tensor, groups: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """PPO's generalised advantage estimation needs a critic's values per token (`needs_values`): the
    credit step that has them (orchestrator.credit.GAE, recipe ppo) calls `gae_advantages`, and no
    other credit step accepts this name (orchestrator.credit.check_advantages), so this is never run."""
    raise NotImplementedError("gae is computed by the credit step from a critic's values (gae_advantages)")


gae.needs_values = True


def gae_advantages(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
                   lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) per response token, with the outcome
    reward `rewards` [N] on each response's last token and the critic's values [N, T] (V of the
    state before each token; 0 after the last): delta_t = r_t + gamma V_{t+1} - V_t,
    A_t = delta_t + gamma lam A_{t+1}. Returns (advantages, returns = A + V), 0 outside `mask`."""
    m = mask.to(values.dtype)
    v = values * m
    n, width = v.shape
    lengths = m.sum(1).long()
    r = torch.zeros_like(v)
    has = lengths > 0
    r[has.nonzero().squeeze(1), (lengths[has] - 1)] = rewards[has].to(v.dtype)
    adv = torch.zeros_like(v)
    running = torch.zeros(n, dtype=v.dtype)
    for t in range(width - 1, -1, -1):
        following = v[:, t + 1] if t + 1 < width else torch.zeros(n, dtype=v.dtype)
        delta = r[:, t] + gamma * following - v[:, t]
        running = (delta + gamma * lam * running) * m[:, t]
        adv[:, t] = running
    return adv, (adv + v) * m


# ---- token-level (process) advantages ---------------------------------------------------------
def process_advantages(token_rewards: torch.Tensor, mask: torch.Tensor, groups: torch.Tensor,
                       gamma: float = 1.0) -> torch.Tensor:
    """Per-token advantages from dense (process) rewards, as PRIME computes them for implicit process
    rewards (Cui et al. 2025, "Process Reinforcement through Implicit Rewards", Sec. 3: a Monte Carlo
    return with a leave-one-out baseline, computed separately from the outcome advantage and summed
    with it, see `combine_advantages`).

    For sample i of group G(i), with response tokens t = 0..L_i-1 (mask = 1) and rewards r_{i,t}:

        mean_i = (1 / L_i) * sum_t r_{i,t}                         # length-normalised process reward
        b_i    = 1 / (K_i - 1) * sum_{j in G(i), j != i} mean_j     # leave-one-out baseline
        A_{i,t} = sum_{s >= t} gamma^(s - t) * (r_{i,s} - b_i)      # reward-to-go of centred rewards

    K_i counts the group's samples with at least one response token. The baseline averages the others'
    *per-token* (length-normalised) process reward, not their summed return, because it is subtracted
    from every token's reward: it must be on the per-token scale, and a summed return would make it
    grow with the other responses' lengths (PRIME: "use the averaged implicit process rewards to
    calculate the leave-one-out baseline"). With no other sample in the group (K_i = 1) the baseline
    is the sample's own mean, so (for gamma = 1) its first-token return is 0, as RLOO gives a singleton
    advantage 0. Returns [N, T], zero outside `mask`.
    """
    m = mask.to(token_rewards.dtype)
    r = token_rewards * m
    length = m.sum(1)
    valid = (length > 0).to(r.dtype)
    mean = r.sum(1) / length.clamp(min=1)
    n_groups = int(groups.max()) + 1 if len(groups) else 0
    count = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, groups, valid)
    total = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, groups, mean * valid)
    others = count[groups] - valid
    baseline = torch.where(others > 0, (total[groups] - mean * valid) / others.clamp(min=1), mean)
    centred = (r - baseline[:, None]) * m
    if gamma == 1.0:
        returns = centred.flip(1).cumsum(1).flip(1)
    else:
        returns = torch.zeros_like(centred)
        running = torch.zeros_like(centred[:, 0])
        for t in range(centred.shape[1] - 1, -1, -1):
            running = centred[:, t] + gamma * running
            returns[:, t] = running
    return returns * m


def combine_advantages(outcome: torch.Tensor, process: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """PRIME's combination (Cui et al. 2025): the outcome advantage [N] (any estimator above) is
    broadcast to every response token and added to the process advantage [N, T]; zero outside mask."""
    return (outcome[:, None] + process) * mask.to(process.dtype)
