"""Pairwise preference and reward-model losses, supervised NLL and RAFT selection.

Each loss takes P pairs (chosen, rejected) and returns (loss scalar, stats), the stats being detached
0-d tensors (no GPU sync; call .item() to log). Accuracy counts strict wins: a tie is not a win.

The registry PREFERENCE_LOSSES gives every loss one keyword interface, so a learner can hold any of
them by name and pass what it has:

    PREFERENCE_LOSSES.get(name)(
        chosen_logps=..., rejected_logps=...,           # [P] policy log-prob of each response, SUMMED over its tokens
        ref_chosen_logps=..., ref_rejected_logps=...,   # [P] the same under the reference model
        chosen_lengths=..., rejected_lengths=...,       # [P] response token counts
        chosen_scores=..., rejected_scores=...,         # [P] scalar reward-model scores
        **params)                                       # the loss's hyper-parameters (beta, tau, ...)

Log-probs always come in summed; a loss that needs per-token averages divides by the lengths itself.
An input a loss does not use is ignored; one it needs but is missing (or None) raises ValueError; an
unknown keyword raises TypeError. What each needs:

    bradley_terry  chosen_scores, rejected_scores                         margin=0.0
    dpo            chosen/rejected_logps, ref_chosen/rejected_logps       beta=0.1
    ipo            dpo's + chosen/rejected_lengths (if average=True)      tau=0.1, average=True
    simpo          chosen/rejected_logps, chosen/rejected_lengths         beta=2.0, gamma=0.5
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from actors.algorithms import PREFERENCE_LOSSES

Stats = dict[str, torch.Tensor]


def _pair_stats(chosen_reward: torch.Tensor, rejected_reward: torch.Tensor) -> Stats:
    diff = (chosen_reward - rejected_reward).detach()
    return {"accuracy": (diff > 0).float().mean(), "margin": diff.mean(),
            "chosen_reward": chosen_reward.detach().mean(), "rejected_reward": rejected_reward.detach().mean()}


def bradley_terry(chosen_scores: torch.Tensor, rejected_scores: torch.Tensor,
                  margin: float | torch.Tensor = 0.0) -> tuple[torch.Tensor, Stats]:
    """Bradley-Terry pairwise loss for a scalar reward model (Bradley & Terry 1952; the RM loss of
    Ouyang et al. 2022): mean over pairs of -log sigmoid(s_c - s_r - m). The margin m (a float or a
    [P] tensor) is Llama 2's (Touvron et al. 2023): a larger margin for more clearly separated pairs.
    Stats: accuracy (s_c > s_r), margin (mean s_c - s_r), chosen_reward, rejected_reward (means)."""
    loss = -F.logsigmoid(chosen_scores - rejected_scores - margin).mean()
    return loss, _pair_stats(chosen_scores, rejected_scores)


def dpo(policy_chosen_logps: torch.Tensor, policy_rejected_logps: torch.Tensor,
        ref_chosen_logps: torch.Tensor, ref_rejected_logps: torch.Tensor,
        beta: float = 0.1) -> tuple[torch.Tensor, Stats]:
    """DPO (Rafailov et al. 2023): mean of -log sigmoid(beta * [(pi_c - ref_c) - (pi_r - ref_r)]),
    with sequence log-probs (summed over tokens). The implicit rewards beta * (pi - ref) give the
    stats: accuracy (chosen reward > rejected), margin, chosen_reward, rejected_reward. Equals log 2
    when the policy equals the reference."""
    chosen_reward = beta * (policy_chosen_logps - ref_chosen_logps)
    rejected_reward = beta * (policy_rejected_logps - ref_rejected_logps)
    loss = -F.logsigmoid(chosen_reward - rejected_reward).mean()
    return loss, _pair_stats(chosen_reward, rejected_reward)


def ipo(policy_chosen_logps: torch.Tensor, policy_rejected_logps: torch.Tensor,
        ref_chosen_logps: torch.Tensor, ref_rejected_logps: torch.Tensor,
        tau: float = 0.1) -> tuple[torch.Tensor, Stats]:
    """IPO (Azar et al. 2023, "A General Theoretical Paradigm to Understand Learning from Human
    Preferences", Eq. 17): mean of (h - 1/(2 tau))^2, h = (pi_c - ref_c) - (pi_r - ref_r). It regresses
    the log-ratio gap to a fixed target instead of pushing it to infinity as DPO can.

    This function uses the log-probs it is given. The paper writes h with sequence probabilities
    (summed log-probs); the registry entry passes per-token AVERAGED log-probs by default, as the IPO
    authors advised Hugging Face (TRL #1265, "Preference tuning" blog), so that the target 1/(2 tau)
    does not depend on response length. Stats: accuracy (h > 0), margin (mean h), and the per-pair
    log-ratios as chosen_reward / rejected_reward."""
    chosen_reward = policy_chosen_logps - ref_chosen_logps
    rejected_reward = policy_rejected_logps - ref_rejected_logps
    h = chosen_reward - rejected_reward
    loss = ((h - 1 / (2 * tau)) ** 2).mean()
    return loss, _pair_stats(chosen_reward, rejected_reward)


def simpo(policy_chosen_avg_logps: torch.Tensor, policy_rejected_avg_logps: torch.Tensor,
          beta: float = 2.0, gamma: float = 0.5) -> tuple[torch.Tensor, Stats]:
    """SimPO (Meng et al. 2024): reference-free and length-normalised, mean of
    -log sigmoid(beta * (avg_c - avg_r) - gamma), avg = log-prob averaged over the response tokens,
    gamma a target reward margin. Stats from the rewards beta * avg."""
    chosen_reward = beta * policy_chosen_avg_logps
    rejected_reward = beta * policy_rejected_avg_logps
    loss = -F.logsigmoid(chosen_reward - rejected_reward - gamma).mean()
    return loss, _pair_stats(chosen_reward, rejected_reward)


# ---- the registry's common keyword interface (see the module docstring) ------------------------
def _need(loss: str, **inputs: torch.Tensor | None) -> None:
    missing = [k for k, v in inputs.items() if v is None]
    if missing:
        raise ValueError(f"preference loss {loss!r} needs {', '.join(missing)}")


def _average(logps: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Summed log-probs -> per-token means (an empty response counts as length 1: no division by 0)."""
    return logps / lengths.to(logps.dtype).clamp(min=1)


@PREFERENCE_LOSSES.register("bradley_terry")
def bradley_terry_loss(*, chosen_scores=None, rejected_scores=None, margin: float | torch.Tensor = 0.0,
                       chosen_logps=None, rejected_logps=None, ref_chosen_logps=None, ref_rejected_logps=None,
                       chosen_lengths=None, rejected_lengths=None) -> tuple[torch.Tensor, Stats]:
    """`bradley_terry` on reward-model scores."""
    _need("bradley_terry", chosen_scores=chosen_scores, rejected_scores=rejected_scores)
    return bradley_terry(chosen_scores, rejected_scores, margin=margin)


@PREFERENCE_LOSSES.register("dpo")
def dpo_loss(*, chosen_logps=None, rejected_logps=None, ref_chosen_logps=None, ref_rejected_logps=None,
             beta: float = 0.1, chosen_lengths=None, rejected_lengths=None,
             chosen_scores=None, rejected_scores=None) -> tuple[torch.Tensor, Stats]:
    """`dpo` on summed log-probs."""
    _need("dpo", chosen_logps=chosen_logps, rejected_logps=rejected_logps,
          ref_chosen_logps=ref_chosen_logps, ref_rejected_logps=ref_rejected_logps)
    return dpo(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta=beta)


@PREFERENCE_LOSSES.register("ipo")
def ipo_loss(*, chosen_logps=None, rejected_logps=None, ref_chosen_logps=None, ref_rejected_logps=None,
             chosen_lengths=None, rejected_lengths=None, tau: float = 0.1, average: bool = True,
             chosen_scores=None, rejected_scores=None) -> tuple[torch.Tensor, Stats]:
    """`ipo` on per-token averaged log-probs (average=True, default) or on summed ones (average=False,
    the paper's literal formula)."""
    _need("ipo", chosen_logps=chosen_logps, rejected_logps=rejected_logps,
          ref_chosen_logps=ref_chosen_logps, ref_rejected_logps=ref_rejected_logps)
    if average:
        _need("ipo (average=True)", chosen_lengths=chosen_lengths, rejected_lengths=rejected_lengths)
        chosen_logps = _average(chosen_logps, chosen_lengths)
        ref_chosen_logps = _average(ref_chosen_logps, chosen_lengths)
        rejected_logps = _average(rejected_logps, rejected_lengths)
        ref_rejected_logps = _average(ref_rejected_logps, rejected_lengths)
    return ipo(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, tau=tau)


@PREFERENCE_LOSSES.register("simpo")
def simpo_loss(*, chosen_logps=None, rejected_logps=None, chosen_lengths=None, rejected_lengths=None,
               beta: float = 2.0, gamma: float = 0.5, ref_chosen_logps=None, ref_rejected_logps=None,
               chosen_scores=None, rejected_scores=None) -> tuple[torch.Tensor, Stats]:
    """`simpo` on summed log-probs divided by the lengths; needs no reference model."""
    _need("simpo", chosen_logps=chosen_logps, rejected_logps=rejected_logps,
          chosen_lengths=chosen_lengths, rejected_lengths=rejected_lengths)
    return simpo(_average(chosen_logps, chosen_lengths), _average(rejected_logps, rejected_lengths),
                 beta=beta, gamma=gamma)


# ---- supervised fine-tuning and rejection sampling ---------------------------------------------
def sft_nll(logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-mean negative log-likelihood of the target tokens: -sum(logp * mask) / sum(mask)
    (maximum likelihood / supervised fine-tuning). An all-zero mask gives 0."""
    m = mask.to(logps.dtype)
    return -(logps * m).sum() / m.sum().clamp(min=1)


def raft_select(rewards: torch.Tensor, groups: torch.Tensor, k: int) -> torch.Tensor:
    """RAFT, reward-ranked fine-tuning (Dong et al. 2023): keep the k highest-reward samples of each
    group (prompt) for supervised fine-tuning (with `sft_nll`). Ties go to the lower index; NaN rewards
    (unscored) are never selected; a group with fewer than k scored samples keeps them all.
    Returns the selected indices, ascending (LongTensor)."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    idx = torch.nonzero(~torch.isnan(rewards)).squeeze(1)  # ascending
    r, g = rewards[idx], groups[idx]
    # Stable sorts, last key first: by group, then reward descending, then index (already ascending).
    order = torch.sort(-r, stable=True).indices
    order = order[torch.sort(g[order], stable=True).indices]
    g_sorted = g[order]
    start = torch.searchsorted(g_sorted, g_sorted, side="left")  # first position of each row's group
    rank = torch.arange(len(order), device=rewards.device) - start
    return torch.sort(idx[order[rank < k]]).values
