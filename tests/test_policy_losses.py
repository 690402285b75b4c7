"""GSPO, GMPO, CISPO and TOPR, and REINFORCE++'s advantages, against hand-computed values on small
batches (two or three responses with masks), value and gradient."""

from __future__ import annotations

import math

import pytest
import torch

from actors.algorithms import ADVANTAGES, POLICY_LOSSES
from actors.algorithms.losses import corrected, no_correction
from orchestrator.config import AlgorithmConfig


def run(name, log_ratios, adv, mask, **kw):
    """(loss, stats, d loss.sum() / d logp) with old = 0 and logp = the log-ratios."""
    logp = torch.tensor(log_ratios).requires_grad_(True)
    old = torch.zeros_like(logp)
    loss, stats = POLICY_LOSSES.get(name)(logp, old, torch.tensor(adv), mask=torch.tensor(mask), **kw)
    (loss * torch.tensor(mask)).sum().backward()
    return loss.detach(), stats, logp.grad


def close(a, b, tol=1e-4):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float32), torch.tensor(b, dtype=torch.float32), atol=tol)


def test_gspo_clips_the_whole_response_by_its_sequence_ratio():
    # response 1: mean log-ratio 0.2 -> s = e^0.2 = 1.2214 > 1.2 with A = 1: clipped, loss -1.2, no gradient
    # response 2: mean log-ratio 0 -> s = 1, A = -2: loss 2 per token, gradient -A * s = 2 per token
    loss, stats, grad = run("gspo", [[0.1, 0.3, 0.0], [-0.1, 0.0, 0.1]], [[1.0], [-2.0]],
                            [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], clip_eps=0.2)
    assert close(loss[0, :2], [-1.2, -1.2]) and close(loss[1], [2.0, 2.0, 2.0])
    assert close(stats["clip_frac"][0, :2], [1, 1]) and close(stats["clip_frac"][1], [0, 0, 0])
    assert close(grad[0, :2], [0, 0]) and close(grad[1], [2.0, 2.0, 2.0])
    assert close(stats["ratio"][0, 0], math.exp(0.2))


def test_gmpo_is_the_geometric_mean_of_the_clipped_token_ratios():
    # A = +1, log-ratios [0.5, 0.1] -> clipped [0.4, 0.1], G = e^0.25; A = -1, [-0.6, 0.2, 0.0] ->
    # [-0.4, 0.2, 0.0] (pessimistic for A < 0: the larger), G = e^(-0.2/3)
    g1, g2 = math.exp(0.25), math.exp(-0.2 / 3)
    loss, stats, grad = run("gmpo", [[0.5, 0.1, 0.0], [-0.6, 0.2, 0.0]], [[1.0], [-1.0]],
                            [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], clip_eps=0.4)
    assert close(loss[0, :2], [-g1, -g1]) and close(loss[1], [g2, g2, g2])
    assert close(stats["clip_frac"][0, :2], [1, 0]) and close(stats["clip_frac"][1], [1, 0, 0])
    assert close(grad[0, :2], [0.0, -g1]) and close(grad[1], [0.0, g2, g2])  # clipped tokens: no gradient


def test_cispo_keeps_every_tokens_gradient():
    # ratios 1.5, 0.5, 1.1 with A = 1, -1, 2 and eps 0.2 / eps_high 0.28: weights 1.28, 0.8, 1.1
    loss, stats, grad = run("cispo", [[math.log(1.5), math.log(0.5), math.log(1.1)]], [[1.0, -1.0, 2.0]],
                            [[1.0, 1.0, 1.0]], clip_eps=0.2, clip_eps_high=0.28)
    assert close(loss[0], [-1.28, 0.8, -2.2]) and close(grad[0], [-1.28, 0.8, -2.2])
    assert close(stats["clip_frac"][0], [1, 1, 0])


def test_topr_tapers_only_negative_samples():
    # A > 0: plain -A grad(logp) whatever the ratio; A < 0: weight min(pi(y)/mu(y), 1) of the response
    loss, stats, grad = run("topr", [[0.5, 0.5, 0.0], [0.3, -0.1, 0.0], [-0.3, -0.2, 9.0]],
                            [[1.0], [-1.0], [-1.0]], [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    w3 = math.exp(-0.5)  # the masked 9.0 does not count
    assert close(loss[0, :2], [-1, -1]) and close(loss[1], [1, 1, 1]) and close(loss[2, :2], [w3, w3])
    assert close(grad[0, :2], [-1, -1]) and close(grad[1], [1, 1, 1]) and close(grad[2, :2], [w3, w3])
    assert close(stats["clip_frac"][:, 0], [0, 1, 0])


def test_a_loss_without_a_mask_keyword_is_called_without_one():
    def tokenwise(logp, old, adv, clip_eps=0.2):
        return -adv * torch.exp(logp - old), {}

    lp = torch.zeros(1, 2)
    loss, _ = corrected(tokenwise, no_correction, lp, lp, torch.ones(1, 1), mask=torch.ones(1, 2), clip_eps=0.2)
    assert torch.equal(loss, -torch.ones(1, 2))


def test_reinforce_pp_normalises_over_the_batch():
    rewards, groups = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1])
    # mean 0.75, unbiased std 0.5
    assert close(ADVANTAGES.get("reinforce_pp")(rewards, groups), [0.5, -1.5, 0.5, 0.5], tol=1e-3)
    # group baseline first: [0.5, -0.5, 0, 0], then / its std sqrt(0.5 / 3)
    s = math.sqrt(0.5 / 3)
    assert close(ADVANTAGES.get("reinforce_pp_baseline")(rewards, groups), [0.5 / s, -0.5 / s, 0, 0], tol=1e-3)


@pytest.mark.parametrize("loss,agg", [("gspo", "seq_mean_token_mean"), ("gmpo", "seq_mean_token_mean"),
                                      ("topr", "seq_mean_token_sum"), ("cispo", "token_mean")])
def test_each_loss_aggregates_as_its_paper(loss, agg):
    assert AlgorithmConfig(policy_loss=loss).aggregation() == agg


# logp, a log-ratio delta (old = logp - delta) and a per-response advantage: covariance
# (logp - mean) * (A - mean) = [[0.625, -0.375], [-1.125, 1.375]]
COV_LOGP = [[-1.0, -2.0], [-0.5, -3.0]]
COV_DELTA = [[0.1, -0.2], [0.0, 0.3]]
COV_ADV = [[1.0], [-1.0]]


def run_cov(name, **params):
    logp = torch.tensor(COV_LOGP).requires_grad_(True)
    old = logp.detach() - torch.tensor(COV_DELTA)
    loss, stats = POLICY_LOSSES.get(name)(logp, old, torch.tensor(COV_ADV), mask=torch.ones(2, 2), **params)
    loss.sum().backward()
    return loss.detach(), stats, logp.grad


def test_kl_cov_ties_the_top_covariance_tokens_to_the_old_policy():
    loss, stats, grad = run_cov("kl_cov", ratio=0.25, coef=1.0)  # 1 of 4 tokens: cov 1.375
    r = [[math.exp(0.1), math.exp(-0.2)], [1.0, math.exp(0.3)]]
    assert close(loss, [[-r[0][0], -r[0][1]], [1.0, r[1][1] + 0.3]])
    assert close(stats["clip_frac"], [[0, 0], [0, 1]])
    assert close(grad, [[-r[0][0], -r[0][1]], [1.0, r[1][1] + 1.0]])  # + coef * sign(logp - old)


def test_clip_cov_holds_back_tokens_in_the_covariance_band():
    loss, stats, grad = run_cov("clip_cov", ratio=0.25, lower=0.5, upper=1.0)  # only cov 0.625 qualifies
    r = [[math.exp(0.1), math.exp(-0.2)], [1.0, math.exp(0.3)]]
    assert close(loss, [[-r[0][0], -r[0][1]], [1.0, r[1][1]]])  # PPO-clip's values (all inside the range)
    assert close(grad, [[0.0, -r[0][1]], [1.0, r[1][1]]])  # the held-back token: no gradient
    assert close(stats["clip_frac"], [[1, 0], [0, 0]])


def test_token_entropy_of_the_sampling_distribution():
    from actors.sampling import token_entropy

    logits = torch.zeros(1, 1, 4)  # uniform over 4
    assert close(token_entropy(logits), [[math.log(4)]])
    assert close(token_entropy(logits + torch.tensor([3.0, 2.0, 0.0, 0.0]), top_k=1), [[0.0]])
    p = torch.softmax(torch.tensor([1.0, 0.0, 0.0, 0.0]) / 0.5, 0)
    assert close(token_entropy(torch.tensor([[[1.0, 0.0, 0.0, 0.0]]]), temperature=0.5), [[-(p * p.log()).sum()]])


def test_loss_params_are_checked_against_the_loss():
    with pytest.raises(Exception, match=r"policy loss 'kl_cov' takes no 'lower'; it takes \['ratio', 'coef'\]"):
        AlgorithmConfig(policy_loss="kl_cov", loss_params={"lower": 1.0})
    assert AlgorithmConfig(policy_loss="clip_cov", loss_params={"ratio": 1e-3}).loss_params == {"ratio": 1e-3}
