"""Preference / reward-model losses, SFT NLL and RAFT selection against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from actors.algorithms import PREFERENCE_LOSSES
from actors.algorithms.preference import bradley_terry, dpo, ipo, raft_select, sft_nll, simpo


def softplus(x: float) -> float:
    """-log sigmoid(-x) = log(1 + e^x): so -log sigmoid(z) = softplus(-z)."""
    return math.log1p(math.exp(x))


def approx(t: torch.Tensor, value: float, tol: float = 1e-6) -> bool:
    return abs(float(t) - value) < tol


# ---- Bradley-Terry ----------------------------------------------------------------------------
def test_bradley_terry_hand_computed():
    chosen = torch.tensor([2.0, 0.0, 1.0])
    rejected = torch.tensor([1.0, 1.0, 1.0])
    # s_c - s_r = [1, -1, 0]; loss = mean(-log sig(1), -log sig(-1), -log sig(0))
    loss, stats = bradley_terry(chosen, rejected)
    assert approx(loss, (softplus(-1) + softplus(1) + math.log(2)) / 3)
    assert approx(stats["accuracy"], 1 / 3)  # the tie (0) is not a win
    assert approx(stats["margin"], 0.0)      # mean of [1, -1, 0]
    # margin 0.5: arguments [0.5, -1.5, -0.5]
    loss, _ = bradley_terry(chosen, rejected, margin=0.5)
    assert approx(loss, (softplus(-0.5) + softplus(1.5) + softplus(0.5)) / 3)
    # per-pair margin [1, 0, 0]: arguments [0, -1, 0]
    loss, _ = bradley_terry(chosen, rejected, margin=torch.tensor([1.0, 0.0, 0.0]))
    assert approx(loss, (math.log(2) + softplus(1) + math.log(2)) / 3)


def test_bradley_terry_gradient_pushes_chosen_up():
    chosen = torch.tensor([0.0], requires_grad=True)
    rejected = torch.tensor([0.0], requires_grad=True)
    bradley_terry(chosen, rejected)[0].backward()
    # d/ds_c of -log sig(s_c - s_r) = -(1 - sig(0)) = -0.5; the rejected gets +0.5
    assert approx(chosen.grad[0], -0.5) and approx(rejected.grad[0], 0.5)


# ---- DPO / IPO / SimPO ------------------------------------------------------------------------
PC = torch.tensor([-1.0, -3.0])     # policy chosen (summed)
PR = torch.tensor([-2.0, -1.0])     # policy rejected
RC = torch.tensor([-1.5, -2.0])     # reference chosen
RR = torch.tensor([-1.5, -1.5])     # reference rejected
LC = torch.tensor([2.0, 4.0])       # chosen lengths
LR = torch.tensor([1.0, 2.0])       # rejected lengths


def test_dpo_is_log2_when_policy_is_reference():
    lp = torch.tensor([-3.0, -7.5, -0.2])
    lr = torch.tensor([-1.0, -2.0, -9.0])
    loss, stats = dpo(lp, lr, lp.clone(), lr.clone(), beta=0.1)
    assert approx(loss, math.log(2))
    assert approx(stats["accuracy"], 0.0) and approx(stats["margin"], 0.0)


def test_dpo_hand_computed():
    # chosen rewards 0.1 * (PC - RC) = 0.1 * [0.5, -1] = [0.05, -0.1]
    # rejected rewards 0.1 * (PR - RR) = 0.1 * [-0.5, 0.5] = [-0.05, 0.05]; differences [0.1, -0.15]
    loss, stats = dpo(PC, PR, RC, RR, beta=0.1)
    assert approx(loss, (softplus(-0.1) + softplus(0.15)) / 2)
    assert approx(stats["accuracy"], 0.5)
    assert approx(stats["margin"], (0.1 - 0.15) / 2)
    assert approx(stats["chosen_reward"], (0.05 - 0.1) / 2)
    assert approx(stats["rejected_reward"], (-0.05 + 0.05) / 2)


def test_ipo_hand_computed_summed():
    # h = (PC - RC) - (PR - RR) = [0.5 - (-0.5), -1 - 0.5] = [1, -1.5]; target 1/(2*0.1) = 5
    loss, stats = ipo(PC, PR, RC, RR, tau=0.1)
    assert approx(loss, ((1 - 5) ** 2 + (-1.5 - 5) ** 2) / 2)  # (16 + 42.25) / 2 = 29.125
    assert approx(stats["accuracy"], 0.5) and approx(stats["margin"], (1 - 1.5) / 2)


def test_simpo_hand_computed():
    # averages: chosen [-1, -1.5], rejected [-1, -2]; beta (avg_c - avg_r) - gamma = 2 * [0, 0.5] - 0.5 = [-0.5, 0.5]
    loss, stats = simpo(torch.tensor([-1.0, -1.5]), torch.tensor([-1.0, -2.0]), beta=2.0, gamma=0.5)
    assert approx(loss, (softplus(0.5) + softplus(-0.5)) / 2)
    # rewards 2 * avg: chosen [-2, -3], rejected [-2, -4]: differences [0, 1]
    assert approx(stats["accuracy"], 0.5) and approx(stats["margin"], 0.5)


# ---- the registry's keyword interface ----------------------------------------------------------
ALL_INPUTS = dict(chosen_logps=PC, rejected_logps=PR, ref_chosen_logps=RC, ref_rejected_logps=RR,
                  chosen_lengths=LC, rejected_lengths=LR,
                  chosen_scores=torch.tensor([2.0, 0.0]), rejected_scores=torch.tensor([1.0, 1.0]))


def test_preference_registry_names():
    assert PREFERENCE_LOSSES.names() == ["bradley_terry", "dpo", "ipo", "simpo"]


@pytest.mark.parametrize("name", ["bradley_terry", "dpo", "ipo", "simpo"])
def test_every_loss_takes_every_input(name):
    """A learner may pass all it has; each loss uses what it needs."""
    loss, stats = PREFERENCE_LOSSES.get(name)(**ALL_INPUTS)
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert {"accuracy", "margin"} <= set(stats)


def test_registry_matches_direct_calls():
    get = PREFERENCE_LOSSES.get
    # scores [2, 0] vs [1, 1]: differences [1, -1]
    assert approx(get("bradley_terry")(**ALL_INPUTS)[0], (softplus(-1) + softplus(1)) / 2)
    assert approx(get("dpo")(**ALL_INPUTS, beta=0.1)[0], dpo(PC, PR, RC, RR, beta=0.1)[0])
    # ipo, averaged: chosen log-ratios (PC - RC) / LC = [0.5 / 2, -1 / 4] = [0.25, -0.25]
    # rejected (PR - RR) / LR = [-0.5 / 1, 0.5 / 2] = [-0.5, 0.25]; h = [0.75, -0.5]; target 1/(2*0.5) = 1
    assert approx(get("ipo")(**ALL_INPUTS, tau=0.5)[0], ((0.75 - 1) ** 2 + (-0.5 - 1) ** 2) / 2)  # 1.15625
    # ipo, summed (the paper's literal formula): h = [1, -1.5]
    assert approx(get("ipo")(**ALL_INPUTS, tau=0.5, average=False)[0], ((1 - 1) ** 2 + (-1.5 - 1) ** 2) / 2)
    # simpo: averages chosen PC / LC = [-0.5, -0.75], rejected PR / LR = [-2, -0.5];
    # beta (avg_c - avg_r) - gamma = 2 * [1.5, -0.25] - 0.5 = [2.5, -1]
    assert approx(get("simpo")(**ALL_INPUTS)[0], (softplus(-2.5) + softplus(1)) / 2)


def test_registry_missing_input_is_a_clear_error():
    with pytest.raises(ValueError, match="'dpo' needs ref_chosen_logps, ref_rejected_logps"):
        PREFERENCE_LOSSES.get("dpo")(chosen_logps=PC, rejected_logps=PR, ref_chosen_logps=None)
    with pytest.raises(ValueError, match="chosen_lengths"):
        PREFERENCE_LOSSES.get("simpo")(chosen_logps=PC, rejected_logps=PR)
    with pytest.raises(ValueError, match="chosen_scores"):
        PREFERENCE_LOSSES.get("bradley_terry")(chosen_logps=PC, rejected_logps=PR)


def test_registry_unknown_parameter_is_refused():
    with pytest.raises(TypeError, match="betta"):
        PREFERENCE_LOSSES.get("dpo")(**ALL_INPUTS, betta=0.2)


def test_zero_length_does_not_divide_by_zero():
    loss, _ = PREFERENCE_LOSSES.get("simpo")(chosen_logps=torch.tensor([0.0]), rejected_logps=torch.tensor([-1.0]),
                                             chosen_lengths=torch.tensor([0]), rejected_lengths=torch.tensor([1]))
    assert torch.isfinite(loss)


# ---- SFT and RAFT ------------------------------------------------------------------------------
def test_sft_nll_token_mean():
    logps = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -9.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert approx(sft_nll(logps, mask), (1 + 2 + 0.5) / 3)  # three target tokens, the -9s are padding
    assert approx(sft_nll(logps, torch.zeros_like(mask)), 0.0)


RAFT_REWARDS = torch.tensor([1.0, 3.0, 3.0, 0.0, float("nan"), 5.0, 2.0, 2.0, 2.0])
RAFT_GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2, 2])


def test_raft_select_top_k_per_group():
    # group 0 rewards [1, 3, 3, 0] at 0..3: top-2 = the two 3s, indices 1, 2
    # group 1 [nan, 5] at 4, 5: only 5 is scored -> 5
    # group 2 [2, 2, 2] at 6..8: all tied -> the lower indices 6, 7
    out = raft_select(RAFT_REWARDS, RAFT_GROUPS, k=2)
    assert out.dtype == torch.long
    assert out.tolist() == [1, 2, 5, 6, 7]
    assert raft_select(RAFT_REWARDS, RAFT_GROUPS, k=1).tolist() == [1, 5, 6]  # tie 3 vs 3 -> index 1
    assert raft_select(RAFT_REWARDS, RAFT_GROUPS, k=10).tolist() == [0, 1, 2, 3, 5, 6, 7, 8]
    assert raft_select(RAFT_REWARDS, RAFT_GROUPS, k=0).tolist() == []


def test_raft_select_interleaved_groups():
    rewards = torch.tensor([0.1, 0.9, 0.5, 0.2, 0.7, 0.3])
    groups = torch.tensor([0, 1, 0, 1, 0, 1])
    # group 0: indices 0, 2, 4 with rewards 0.1, 0.5, 0.7 -> top-2 = 4, 2
    # group 1: indices 1, 3, 5 with rewards 0.9, 0.2, 0.3 -> top-2 = 1, 5
    assert raft_select(rewards, groups, k=2).tolist() == [1, 2, 4, 5]
    with pytest.raises(ValueError):
        raft_select(rewards, groups, k=-1)
