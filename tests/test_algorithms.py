"""Advantage estimators, policy losses and their registries against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from actors.algorithms import ADVANTAGES, KL_ESTIMATORS, OFF_POLICY, POLICY_LOSSES
from actors.algorithms.advantages import (combine_advantages, dr_grpo, group_stats, grpo, grpo_bernoulli,
                                          process_advantages, psr, rloo)
from actors.algorithms.losses import (corrected, decoupled_ppo, kl_k1, kl_k2, kl_k3, no_correction, ppo_clip,
                                     truncated_is)

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
# PSR: GRPO's positive advantages (the samples above their group's mean), 0 for the others.
PSR = [0.5 / (STD0 + EPS), 0.0, 0.0, 0.5 / (STD0 + EPS), 0.25 / (STD1 + EPS), 0.25 / (STD1 + EPS),
       0.25 / (STD1 + EPS), 0.0]
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


def test_psr_hand_computed():
    assert close(psr(REWARDS, GROUPS, eps=EPS), PSR)
    assert close(ADVANTAGES.get("psr")(REWARDS, GROUPS), PSR)
    graded = psr(torch.tensor([0.2, 0.5, 0.8]), torch.tensor([0, 0, 0]), eps=0.0)  # above the mean only
    assert close(graded, [0.0, 0.0, 0.3 / 0.3])


def test_grpo_bernoulli_is_grpo_on_labels():
    """On 0/1 rewards the std of 0/1 outcomes with the group's mean is the group's own: GRPO exactly."""
    assert close(grpo_bernoulli(REWARDS, GROUPS, eps=EPS), GRPO)
    assert close(ADVANTAGES.get("grpo_bernoulli")(REWARDS, GROUPS), GRPO)


def test_grpo_bernoulli_shrinks_an_unsure_judge():
    """Probabilities near their mean (an unsure judge) get small advantages, where GRPO scales the same
    spread up to unit size; probabilities near 0 and 1 (a sure judge) get nearly GRPO's."""
    groups = torch.tensor([0, 0, 0, 0])
    unsure = torch.tensor([0.45, 0.55, 0.45, 0.55])
    # by hand: mean 0.5, sqrt(0.25 * 4 / 3) = 0.57735; the deviations are +-0.05
    assert close(grpo_bernoulli(unsure, groups, eps=0.0), [-0.05 / 0.57735, 0.05 / 0.57735] * 2, tol=1e-4)
    assert grpo(unsure, groups).abs().min() > 0.8  # GRPO: +-0.866, the noise at unit size
    sure = torch.tensor([0.02, 0.98, 0.02, 0.98])
    assert torch.allclose(grpo_bernoulli(sure, groups), grpo(sure, groups), rtol=0.05)


@pytest.mark.parametrize("bad", [[1.5, 0.0], [-0.2, 0.3]])
def test_grpo_bernoulli_rejects_rewards_outside_unit_interval(bad):
    with pytest.raises(ValueError, match=r"grpo_bernoulli needs rewards in \[0, 1\]"):
        grpo_bernoulli(torch.tensor(bad), torch.tensor([0, 0]))


@pytest.mark.parametrize("name, expected", [("grpo", GRPO), ("dr_grpo", DR_GRPO), ("rloo", RLOO), ("psr", PSR),
                                            ("grpo_bernoulli", GRPO)])
def test_interleaved_groups(name, expected):
    """Group membership comes from `groups`, not from row order."""
    perm = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7])
    adv = ADVANTAGES.get(name)(REWARDS[perm], GROUPS[perm])
    assert close(adv, [expected[i] for i in perm.tolist()])


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "psr", "grpo_bernoulli"])
def test_equal_rewards_give_zero_advantage(name):
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    adv = ADVANTAGES.get(name)(rewards, groups)
    assert torch.all(torch.isfinite(adv))
    assert torch.equal(adv[:3], torch.zeros(3))  # the all-equal group
    assert adv[3:].abs().sum() > 0  # the mixed group still learns


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "psr", "grpo_bernoulli"])
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


def test_ppo_clip_clip_higher():
    # DAPO clip-higher: clip range [1 - 0.2, 1 + 0.28] = [0.8, 1.28].
    cases = [
        (1.25, 1.0, -1.25, 0.0),  # inside [0.8, 1.28]: unclipped (plain PPO would clip it to 1.2)
        (1.3, 1.0, -1.28, 1.0),   # above 1.28, A > 0: clipped to 1.28 * A
        (0.7, -1.0, 0.8, 1.0),    # the lower bound is still 1 - 0.2: clipped to 0.8 * A
    ]
    ratios = torch.tensor([[c[0] for c in cases]])
    old = torch.zeros_like(ratios)
    adv = torch.tensor([[c[1] for c in cases]])
    loss, stats = ppo_clip(torch.log(ratios), old, adv, clip_eps=0.2, clip_eps_high=0.28)
    assert close(loss[0], [c[2] for c in cases])
    assert close(stats["clip_frac"][0], [c[3] for c in cases])
    # default clip_eps_high = clip_eps: the first case is clipped at 1.2 again
    loss, stats = ppo_clip(torch.log(ratios), old, adv, clip_eps=0.2)
    assert close(loss[0], [-1.2, -1.2, 0.8])
    assert close(stats["clip_frac"][0], [1.0, 1.0, 1.0])


# ---- off-policy corrections --------------------------------------------------------------------
def test_off_policy_registry():
    assert OFF_POLICY.names() == ["decoupled_ppo", "none", "tis"]
    assert OFF_POLICY.get("none") is no_correction
    assert OFF_POLICY.get("tis") is truncated_is
    assert OFF_POLICY.get("decoupled_ppo") is decoupled_ppo


def with_ppo(name, logp, behaviour, adv, proximal=None, **kw):
    return corrected(ppo_clip, OFF_POLICY.get(name), logp, behaviour, adv, proximal_logprobs=proximal, **kw)


@pytest.mark.parametrize("name", ["none", "tis", "decoupled_ppo"])
def test_off_policy_on_policy_is_plain_policy_gradient(name):
    """logp == behaviour == proximal: clip_frac 0, is_weight 1, loss -A, gradient -A * grad(logp)."""
    torch.manual_seed(0)
    lp = -torch.rand(3, 5) * 3
    logp = lp.clone().requires_grad_(True)
    adv = torch.randn(3, 5)
    loss, stats = with_ppo(name, logp, lp.clone(), adv, lp.clone(), clip_eps=0.2, clip_eps_high=0.28)
    assert loss.shape == (3, 5)
    assert torch.equal(stats["clip_frac"], torch.zeros(3, 5))
    assert torch.equal(stats["is_weight"], torch.ones(3, 5))
    assert torch.allclose(loss.detach(), -adv)
    loss.sum().backward()
    assert torch.allclose(logp.grad, -adv)  # d(-A * logp)/dlogp


def test_none_is_ppo_clip_against_behaviour():
    logp = torch.log(torch.tensor([[1.1, 1.5, 0.5]]))
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    loss, stats = with_ppo("none", logp, torch.zeros_like(logp), adv, clip_eps=0.2)
    ref_loss, ref_stats = ppo_clip(logp, torch.zeros_like(logp), adv, clip_eps=0.2)
    assert torch.equal(loss, ref_loss) and torch.equal(stats["clip_frac"], ref_stats["clip_frac"])


def test_tis_hand_computed():
    # ratio = exp(logp - behaviour), w = min(ratio, cap = 2), loss = -w * A, gradient -w * A.
    cases = [  # (ratio, A, w, loss, truncated?)
        (0.5, 1.0, 0.5, -0.5, 0.0),
        (1.5, -2.0, 1.5, 3.0, 0.0),   # -1.5 * -2
        (3.0, 1.0, 2.0, -2.0, 1.0),   # truncated to the cap
    ]
    behaviour = torch.full((1, 3), -2.0)
    logp = (behaviour + torch.log(torch.tensor([[c[0] for c in cases]]))).requires_grad_(True)
    adv = torch.tensor([[c[1] for c in cases]])
    loss, stats = with_ppo("tis", logp, behaviour, adv, clip_eps=0.2, is_cap=2.0)
    assert close(loss[0].detach(), [c[3] for c in cases])
    assert close(stats["is_weight"][0], [c[2] for c in cases])
    assert close(stats["is_truncated"][0], [c[4] for c in cases])
    assert stats["clip_frac"].sum() == 0  # the loss is taken around the current weights: never clipped
    loss.sum().backward()
    assert close(logp.grad[0], [-c[2] * c[1] for c in cases])  # [-0.5, 3.0, -2.0]
    # is_cap=None: untruncated importance sampling, w = 3.0 on the last token
    loss, stats = with_ppo("tis", logp.detach(), behaviour, adv, clip_eps=0.2, is_cap=None)
    assert close(stats["is_weight"][0], [0.5, 1.5, 3.0])
    assert stats["is_truncated"].sum() == 0


def test_decoupled_ppo_hand_computed():
    # w = min(exp(prox - behaviour), cap = 2) (no gradient), r = exp(logp - prox) clipped to [0.8, 1.2]:
    # loss = -w * min(r * A, clip(r) * A).
    cases = [  # (w_raw, r, A, loss, gradient, clipped?, truncated?)
        (0.5, 1.1, 1.0, -0.5 * 1.1, -0.5 * 1.1 * 1.0, 0.0, 0.0),  # inside: gradient -w * r * A
        (3.0, 1.5, 1.0, -2.0 * 1.2, 0.0, 1.0, 1.0),               # w capped at 2, r clipped to 1.2
        (1.0, 0.5, -1.0, 0.8, 0.0, 1.0, 0.0),                     # -1 * min(-0.5, -0.8) = 0.8, clipped
        (1.5, 0.9, -2.0, 2.7, 2.7, 0.0, 0.0),                     # -1.5 * (0.9 * -2) = 2.7
    ]
    behaviour = torch.full((1, 4), -1.0)
    proximal = behaviour + torch.log(torch.tensor([[c[0] for c in cases]]))
    logp = (proximal + torch.log(torch.tensor([[c[1] for c in cases]]))).requires_grad_(True)
    adv = torch.tensor([[c[2] for c in cases]])
    loss, stats = with_ppo("decoupled_ppo", logp, behaviour, adv, proximal, clip_eps=0.2, is_cap=2.0)
    assert close(loss[0].detach(), [c[3] for c in cases])
    assert close(stats["clip_frac"][0], [c[5] for c in cases])
    assert close(stats["is_truncated"][0], [c[6] for c in cases])
    assert close(stats["is_weight"][0], [min(c[0], 2.0) for c in cases])
    assert close(stats["ratio"][0], [c[1] for c in cases])
    loss.sum().backward()
    assert close(logp.grad[0], [c[4] for c in cases])


def test_decoupled_ppo_with_proximal_equal_behaviour_is_ppo_clip():
    torch.manual_seed(1)
    behaviour = -torch.rand(2, 4) * 2
    logp = behaviour + torch.randn(2, 4) * 0.5
    adv = torch.randn(2, 4)
    loss, stats = with_ppo("decoupled_ppo", logp, behaviour, adv, behaviour.clone(), clip_eps=0.2)
    ref_loss, ref_stats = ppo_clip(logp, behaviour, adv, clip_eps=0.2)
    assert torch.allclose(loss, ref_loss)
    assert torch.equal(stats["clip_frac"], ref_stats["clip_frac"])


@pytest.mark.parametrize("name", ["none", "tis", "decoupled_ppo"])
def test_a_correction_composes_with_any_policy_loss(name):
    """A custom policy loss is the one called under every correction (async runs need one), around
    the correction's anchor, and weighted by its importance weight."""
    calls = []

    def plain_pg(logp, old, adv, clip_eps=0.2):  # REINFORCE with a ratio: -exp(logp - old) * A
        calls.append(old.clone())
        return -torch.exp(logp - old) * adv, {}

    behaviour = torch.tensor([[-1.0, -2.0]])
    proximal = torch.tensor([[-0.5, -2.5]])
    logp = torch.tensor([[-0.7, -2.2]])
    adv = torch.tensor([[1.0, -1.0]])
    loss, stats = corrected(plain_pg, OFF_POLICY.get(name), logp, behaviour, adv, proximal_logprobs=proximal,
                            is_cap=None, clip_eps=0.2)
    anchor = {"none": behaviour, "tis": logp, "decoupled_ppo": proximal}[name]
    weight = {"none": torch.ones(1, 2), "tis": torch.exp(logp - behaviour),
              "decoupled_ppo": torch.exp(proximal - behaviour)}[name]
    assert len(calls) == 1 and torch.allclose(calls[0], anchor)
    assert torch.allclose(loss, weight * -torch.exp(logp - anchor) * adv)
    assert torch.allclose(stats["is_weight"], weight) and torch.equal(stats["clip_frac"], torch.zeros(1, 2))


def test_decoupled_ppo_needs_proximal():
    lp = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="proximal_logprobs"):
        OFF_POLICY.get("decoupled_ppo")(lp, lp)


@pytest.mark.parametrize("name", ["none", "tis", "decoupled_ppo"])
def test_off_policy_rejects_bad_cap(name):
    lp = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="is_cap"):
        OFF_POLICY.get(name)(lp, lp, proximal_logprobs=lp, is_cap=0.0)


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


def test_kl_k1_k2_hand_computed():
    logp = torch.tensor([-1.0, -0.5, -2.0])
    ref = torch.tensor([-0.5, -1.5, -2.25])
    # k1 = logp - ref = [-0.5, 1.0, 0.25]; k2 = (ref - logp)^2 / 2 = [0.125, 0.5, 0.03125]
    assert close(kl_k1(logp, ref), [-0.5, 1.0, 0.25])
    assert close(kl_k2(logp, ref), [0.125, 0.5, 0.03125])


def test_kl_registry():
    assert KL_ESTIMATORS.get("k1") is kl_k1
    assert KL_ESTIMATORS.get("k2") is kl_k2
    assert KL_ESTIMATORS.get("k3") is kl_k3


# ---- token-level (process) advantages ----------------------------------------------------------
# Group 0 = samples 0, 1, 2; group 1 = sample 3 alone. Masked rewards and their per-token means:
#   s0: [1, 0, 2]   (3 tokens) mean 1
#   s1: [0.5, 0.5]  (2 tokens; the 9 is padding) mean 0.5
#   s2: [3]         (1 token) mean 3
#   s3: [2, 4]      (2 tokens) mean 3, singleton group
# Leave-one-out baselines: s0 (0.5 + 3) / 2 = 1.75, s1 (1 + 3) / 2 = 2, s2 (1 + 0.5) / 2 = 0.75, s3 its own 3.
# Centred rewards: s0 [-0.75, -1.75, 0.25], s1 [-1.5, -1.5, 0], s2 [2.25, 0, 0], s3 [-1, 1, 0].
TOKEN_REWARDS = torch.tensor([[1.0, 0.0, 2.0], [0.5, 0.5, 9.0], [3.0, 7.0, 7.0], [2.0, 4.0, 5.0]])
TOKEN_MASK = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0]])
TOKEN_GROUPS = torch.tensor([0, 0, 0, 1])
# gamma = 1: reward-to-go = reverse cumulative sums of the centred rewards.
PROCESS_G1 = [[-0.75 - 1.75 + 0.25, -1.75 + 0.25, 0.25],  # [-2.25, -1.5, 0.25]
              [-3.0, -1.5, 0.0],
              [2.25, 0.0, 0.0],
              [0.0, 1.0, 0.0]]
# gamma = 0.5: A_t = c_t + 0.5 * A_{t+1}.
PROCESS_G05 = [[-0.75 + 0.5 * (-1.75 + 0.5 * 0.25), -1.75 + 0.5 * 0.25, 0.25],  # [-1.5625, -1.625, 0.25]
               [-1.5 + 0.5 * -1.5, -1.5, 0.0],                                  # [-2.25, -1.5, 0]
               [2.25, 0.0, 0.0],
               [-1.0 + 0.5 * 1.0, 1.0, 0.0]]                                    # [-0.5, 1, 0]


def close2(a: torch.Tensor, expected: list[list[float]], tol: float = 1e-5) -> bool:
    return torch.allclose(a, torch.tensor(expected, dtype=a.dtype), atol=tol, rtol=0)


def test_process_advantages_hand_computed():
    assert close2(process_advantages(TOKEN_REWARDS, TOKEN_MASK, TOKEN_GROUPS), PROCESS_G1)
    assert close2(process_advantages(TOKEN_REWARDS, TOKEN_MASK, TOKEN_GROUPS, gamma=0.5), PROCESS_G05)


def test_process_advantages_groups_from_index_not_order():
    perm = torch.tensor([3, 1, 0, 2])
    adv = process_advantages(TOKEN_REWARDS[perm], TOKEN_MASK[perm], TOKEN_GROUPS[perm])
    assert close2(adv, [PROCESS_G1[i] for i in perm.tolist()])


def test_process_advantages_empty_response_not_in_baseline():
    # A fourth member of group 0 with no response tokens: the baselines of s0..s2 are unchanged.
    rewards = torch.cat([TOKEN_REWARDS, torch.tensor([[5.0, 5.0, 5.0]])])
    mask = torch.cat([TOKEN_MASK, torch.zeros(1, 3)])
    groups = torch.cat([TOKEN_GROUPS, torch.tensor([0])])
    adv = process_advantages(rewards, mask, groups)
    assert close2(adv, PROCESS_G1 + [[0.0, 0.0, 0.0]])


def test_combine_advantages():
    outcome = torch.tensor([1.0, -1.0])
    process = torch.tensor([[0.5, -0.5, 3.0], [2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1, 0], [1, 0, 0]])
    # (outcome broadcast + process) * mask: [1.5, 0.5, 0], [1.0, 0, 0]
    assert close2(combine_advantages(outcome, process, mask), [[1.5, 0.5, 0.0], [1.0, 0.0, 0.0]])


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
    monkeypatch.setattr(ADVANTAGES, "_items", ADVANTAGES.snapshot())
    monkeypatch.setattr(POLICY_LOSSES, "_items", POLICY_LOSSES.snapshot())


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


@pytest.mark.parametrize("name,divergence", [("k1", None), ("k2", "reverse"), ("k3", "forward")])
def test_kl_estimators_gradients_follow_their_divergence(name, divergence):
    """Used as a loss on samples of pi (pathwise through logp, samples fixed), each estimator's expected
    gradient, computed exactly over a 5-token vocabulary: k1 -> 0, k2 -> grad KL(pi || ref),
    k3 -> grad KL(ref || pi)."""
    torch.manual_seed(0)
    theta = torch.randn(5, requires_grad=True)
    ref = torch.log_softmax(torch.randn(5), 0)
    logp = torch.log_softmax(theta, 0)
    p = logp.exp().detach()
    expected_grad = torch.autograd.grad((p * KL_ESTIMATORS.get(name)(logp, ref)).sum(), theta)[0]
    pi = torch.log_softmax(theta, 0)
    if divergence is None:
        target = torch.zeros(5)
    elif divergence == "reverse":
        target = torch.autograd.grad((pi.exp() * (pi - ref)).sum(), theta)[0]
    else:
        target = torch.autograd.grad((ref.exp() * (ref - pi)).sum(), theta)[0]
    assert torch.allclose(expected_grad, target, atol=1e-6), (expected_grad, target)
    assert divergence is None or target.abs().max() > 1e-3  # a real gradient, not a trivial match


def test_gae_hand_worked_trajectory():
    """Two responses: 3 tokens with reward 1 at the end, values [0.5, 0.6, 0.8]; 2 tokens (one padded)
    with reward 0, values [0.2, 0.1]. gamma 0.9, lambda 0.5."""
    from actors.algorithms.advantages import gae_advantages

    values = torch.tensor([[0.5, 0.6, 0.8], [0.2, 0.1, 7.0]])  # 7.0 is padding: ignored
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    adv, ret = gae_advantages(torch.tensor([1.0, 0.0]), values, mask, gamma=0.9, lam=0.5)
    # response 1: delta = [0 + .9*.6 - .5, 0 + .9*.8 - .6, 1 + 0 - .8] = [0.04, 0.12, 0.2]
    #   A_2 = 0.2; A_1 = 0.12 + 0.45 * 0.2 = 0.21; A_0 = 0.04 + 0.45 * 0.21 = 0.1345
    # response 2: delta = [.9*.1 - .2, 0 - .1] = [-0.11, -0.1]; A_1 = -0.1; A_0 = -0.11 - 0.045 = -0.155
    assert close(adv, [[0.1345, 0.21, 0.2], [-0.155, -0.1, 0.0]])
    assert close(ret, [[0.6345, 0.81, 1.0], [0.045, 0.0, 0.0]])
