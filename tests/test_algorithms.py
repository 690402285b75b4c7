"""Advantage estimators, policy losses and their registries against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from actors.algorithms import ADVANTAGES, POLICY_LOSSES
from actors.algorithms.advantages import dr_grpo, group_stats, grpo, rloo
from actors.algorithms.losses import kl_k3, ppo_clip

EPS = 1e-4
# Two groups of four: group 0 rewards [1, 0, 0, 1], group 1 rewards [1, 1, 1, 0].
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0])
GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])

# By hand. Group 0: mean 0.5, squared deviations 4 * 0.25 = 1, unbiased var 1/3.
# Group 1: mean 0.75, squared deviations 3 * 0.0625 + 0.5625 = 0.75, unbiased var 0.25, std 0.5.
STD0, STD1 = math.sqrt(1 / 3), 0.5
GRPO = [0.5 / (STD0 + EPS), -0.5 / (STD0 + EPS), -0.5 / (STD0 + EPS), 0.5 / (STD0 + EPS),
        0.25 / (STD1 + EPS), 0.25 / (STD1 + EPS), 0.25 / (STD1 + EPS), -0.75 / (STD1 + EPS)]
DR_GRPO = [0.5, -0.5, -0.5, 0.5, 0.25, 0.25, 0.25, -0.75]
# RLOO: own reward minus the mean of the other three in the group.
RLOO = [1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3, 1 - 2 / 3, 1 - 2 / 3, 1 - 2 / 3, 0 - 1.0]


def close(a: torch.Tensor, expected: list[float], tol: float = 1e-5) -> bool:
    return torch.allclose(a, torch.tensor(expected, dtype=a.dtype), atol=tol, rtol=0)


def test_group_stats():
    mean, std, size = group_stats(REWARDS, GROUPS)
    assert close(mean, [0.5] * 4 + [0.75] * 4)
    assert close(std, [STD0] * 4 + [STD1] * 4)
    assert close(size, [4.0] * 8)


def test_grpo_hand_computed():
    assert close(grpo(REWARDS, GROUPS, eps=EPS), GRPO)
    assert close(ADVANTAGES.get("grpo")(REWARDS, GROUPS), GRPO)  # default eps is 1e-4


def test_dr_grpo_hand_computed():
    assert close(dr_grpo(REWARDS, GROUPS), DR_GRPO)


def test_rloo_hand_computed():
    assert close(rloo(REWARDS, GROUPS), RLOO)


@pytest.mark.parametrize("name, expected", [("grpo", GRPO), ("dr_grpo", DR_GRPO), ("rloo", RLOO)])
def test_interleaved_groups(name, expected):
    """Group membership comes from `groups`, not from row order."""
    perm = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7])
    adv = ADVANTAGES.get(name)(REWARDS[perm], GROUPS[perm])
    assert close(adv, [expected[i] for i in perm.tolist()])


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_equal_rewards_give_zero_advantage(name):
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    adv = ADVANTAGES.get(name)(rewards, groups)
    assert torch.all(torch.isfinite(adv))
    assert torch.equal(adv[:3], torch.zeros(3))  # the all-equal group
    assert adv[3:].abs().sum() > 0  # the mixed group still learns


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_singleton_group_is_finite(name):
    adv = ADVANTAGES.get(name)(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 1, 1]))
    assert torch.all(torch.isfinite(adv))
    assert adv[0] == 0


# ---- PPO clip ----------------------------------------------------------------------------------
def test_ppo_clip_hand_computed():
    # (ratio, advantage) -> loss, clipped?  with clip_eps = 0.2 -> clip range [0.8, 1.2]
    cases = [
        (1.1, 1.0, -1.1, 0.0),   # inside the range: plain ratio * A
        (1.5, 1.0, -1.2, 1.0),   # above the range, A > 0: clipped to 1.2 * A
        (0.5, 1.0, -0.5, 0.0),   # below the range, A > 0: min picks the unclipped (pessimistic)
        (1.5, -1.0, 1.5, 0.0),   # above the range, A < 0: unclipped is the minimum
        (0.5, -1.0, 0.8, 1.0),   # below the range, A < 0: clipped to 0.8 * A
        (0.9, -2.0, 1.8, 0.0),   # inside the range, A < 0
    ]
    ratios = torch.tensor([[c[0] for c in cases]])
    old = torch.full_like(ratios, -1.0)
    logp = (old + torch.log(ratios)).requires_grad_(True)
    adv = torch.tensor([[c[1] for c in cases]])
    loss, stats = ppo_clip(logp, old, adv, clip_eps=0.2)
    assert loss.shape == (1, len(cases))
    assert close(loss[0].detach(), [c[2] for c in cases])
    assert close(stats["clip_frac"][0], [c[3] for c in cases])
    assert close(stats["ratio"][0], [c[0] for c in cases])
    # Clipped tokens carry no gradient; the others have d(-ratio*A)/dlogp = -ratio*A.
    loss.sum().backward()
    expected_grad = [0.0 if c[3] else -c[0] * c[1] for c in cases]
    assert close(logp.grad[0], expected_grad)


def test_ppo_clip_broadcasts_sequence_advantage():
    logp = torch.zeros(2, 3)
    adv = torch.tensor([[2.0], [-1.0]])
    loss, stats = ppo_clip(logp, logp, adv)
    assert torch.allclose(loss, torch.tensor([[-2.0] * 3, [1.0] * 3]))
    assert stats["clip_frac"].sum() == 0


def test_ppo_clip_registered():
    assert POLICY_LOSSES.get("ppo_clip") is ppo_clip


# ---- KL ----------------------------------------------------------------------------------------
def test_kl_k3_zero_when_equal():
    lp = torch.tensor([[-0.3, -2.0, -0.01]])
    assert torch.equal(kl_k3(lp, lp.clone()), torch.zeros_like(lp))


def test_kl_k3_hand_computed():
    logp = torch.tensor([-1.0, -0.5, -2.0])
    ref = torch.tensor([-0.5, -1.5, -2.25])
    expected = []
    for a, b in zip(logp.tolist(), ref.tolist()):
        r = b - a
        expected.append(math.exp(r) - r - 1)
    out = kl_k3(logp, ref)
    assert close(out, expected)
    assert torch.all(out > 0)


# ---- registries --------------------------------------------------------------------------------
def test_unknown_advantage_lists_registered_names():
    with pytest.raises(KeyError) as e:
        ADVANTAGES.get("nope")
    msg = str(e.value)
    assert "'nope'" in msg
    for name in ("grpo", "dr_grpo", "rloo"):
        assert name in msg


def test_unknown_policy_loss_lists_registered_names():
    with pytest.raises(KeyError, match="ppo_clip"):
        POLICY_LOSSES.get("nope")


@pytest.fixture
def scratch_registries(monkeypatch):
    """Registrations made in a test are undone afterwards."""
    monkeypatch.setattr(ADVANTAGES, "_items", dict(ADVANTAGES._items))
    monkeypatch.setattr(POLICY_LOSSES, "_items", dict(POLICY_LOSSES._items))


def test_user_can_register_estimator(scratch_registries):
    @ADVANTAGES.register("mine")
    def mine(rewards, groups, eps=1e-4):
        return rewards * 2

    assert "mine" in ADVANTAGES.names()
    assert ADVANTAGES.get("mine") is mine
    assert torch.equal(ADVANTAGES.get("mine")(REWARDS, GROUPS), REWARDS * 2)
    # the typed config accepts it by name
    from orchestrator.config import AlgorithmConfig
    assert AlgorithmConfig(advantage="mine").advantage == "mine"
    # a second, different object under the same name is refused
    with pytest.raises(ValueError, match="already registered"):
        ADVANTAGES.register("mine")(lambda r, g: r)


def test_import_path_lookup():
    assert ADVANTAGES.get("actors.algorithms.advantages:rloo") is rloo
    with pytest.raises(ImportError, match="no attribute"):
        ADVANTAGES.get("actors.algorithms.advantages:missing")
