"""The learner's loss controls: the aggregation of per-token losses (`algorithm.loss_agg`), the KL
estimator (`algorithm.kl_estimator`), and a custom policy loss under an off-policy correction."""

from __future__ import annotations

import math

import numpy as np
from types import SimpleNamespace

import pytest
import torch

from actors.learner import Learner
from actors.objectives.policy_gradient import PolicyGradient
from orchestrator.config import AlgorithmConfig
from rl_step import train
from test_learner import make_config
from user_module import on_path
from test_learner import config, prompts, reward_fn, scored  # noqa: F401  (fixtures shared with test_learner)

USER_MODULE = """
import torch
CALLS = []

def plain_pg(logp, old, adv, clip_eps=0.2):
    CALLS.append(tuple(old.shape))
    return -torch.exp(logp - old) * adv, {}

def constant_kl(logp, ref):
    return torch.full_like(logp, 0.25)
"""


@pytest.fixture(scope="module")
def user_module(tmp_path_factory):
    with on_path(tmp_path_factory, "coevo_test_loss_controls", USER_MODULE):
        import coevo_test_loss_controls
        yield coevo_test_loss_controls


def row_weights(mode: str, lengths: list[int], max_new_tokens: int = 8) -> list[float]:
    algo = AlgorithmConfig(loss_agg=mode)
    learner = SimpleNamespace(algo=algo, config=SimpleNamespace(rollout=SimpleNamespace(max_new_tokens=max_new_tokens)))
    pg = PolicyGradient.__new__(PolicyGradient)
    pg.learner = learner
    r_mask = torch.tensor([[1] * n + [0] * (4 - n) for n in lengths], dtype=torch.bool)
    return pg._row_weights(torch.arange(len(lengths)), r_mask).tolist()


def test_loss_aggregations_hand_computed() -> None:
    """Rows of 2 and 4 tokens: each row's weight on its summed token losses."""
    assert row_weights("token_mean", [2, 4]) == pytest.approx([1 / 6, 1 / 6])
    assert row_weights("seq_mean_token_mean", [2, 4]) == pytest.approx([1 / (2 * 2), 1 / (4 * 2)])
    assert row_weights("seq_mean_token_sum", [2, 4]) == pytest.approx([1 / 2, 1 / 2])
    assert row_weights("seq_sum_constant", [2, 4], max_new_tokens=8) == pytest.approx([1 / 16, 1 / 16])


def test_each_method_has_its_own_aggregation() -> None:
    assert AlgorithmConfig().aggregation() == "token_mean"
    assert AlgorithmConfig(advantage="dr_grpo").aggregation() == "seq_sum_constant"
    assert AlgorithmConfig(advantage="dr_grpo", loss_agg="token_mean").aggregation() == "token_mean"
    with pytest.raises(Exception, match="loss_agg"):
        AlgorithmConfig(loss_agg="token_sum")


@pytest.mark.parametrize("mode", ["seq_mean_token_sum", "seq_sum_constant"])
def test_an_aggregation_scales_the_gradient_as_its_normaliser_says(reward_fn, scored, mode) -> None:
    """Uniform row weights: the pre-clipping gradient norm is the token mean's times tokens / normaliser."""
    norms = {m: train(Learner(make_config(reward_fn, loss_agg=m)), scored)["train/grad_norm"]
             for m in ("token_mean", mode)}
    tokens = sum(len(r) for r in scored.column("response_ids").to_pylist())
    n, budget = scored.num_rows, make_config(reward_fn).rollout.max_new_tokens
    normaliser = n if mode == "seq_mean_token_sum" else n * budget
    assert norms[mode] == pytest.approx(norms["token_mean"] * tokens / normaliser, rel=1e-4)


def test_the_chosen_kl_estimator_is_the_one_used(reward_fn, scored, user_module) -> None:
    learner = Learner(make_config(reward_fn, kl_coef=0.1, kl_estimator="coevo_test_loss_controls:constant_kl"))
    assert train(learner, scored)["train/kl"] == pytest.approx(0.25)
    with pytest.raises(Exception, match="kl_estimator"):
        make_config(reward_fn, kl_estimator="k4")


@pytest.mark.parametrize("correction", ["tis", "decoupled_ppo"])
def test_a_custom_policy_loss_is_called_under_an_off_policy_correction(reward_fn, scored, user_module,
                                                                        correction) -> None:
    """Async runs need a correction; the user's loss is still the one that trains."""
    user_module.CALLS.clear()
    learner = Learner(make_config(reward_fn, off_policy=correction,
                                  policy_loss="coevo_test_loss_controls:plain_pg"))
    metrics = train(learner, scored)
    assert user_module.CALLS, "the custom policy loss was never called"
    assert metrics["train/is_weight_mean"] == pytest.approx(1.0, abs=1e-4)  # on-policy here


@pytest.mark.parametrize("algorithm", [{"policy_loss": "gspo", "clip_eps": 3e-4, "clip_eps_high": 4e-4},
                                       {"policy_loss": "gmpo", "clip_eps": 0.4}, {"policy_loss": "cispo"},
                                       {"policy_loss": "topr"}, {"advantage": "reinforce_pp"},
                                       {"advantage": "reinforce_pp_baseline", "off_policy": "tis"}])
def test_every_method_trains_a_step(reward_fn, scored, algorithm) -> None:
    learner = Learner(make_config(reward_fn, **algorithm))
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    metrics = train(learner, scored)
    assert metrics["train/step_skipped"] == 0 and metrics["train/clip_frac"] == 0  # on-policy: nothing clipped
    assert any(not torch.equal(before[k], v) for k, v in learner.model.state_dict().items())


def test_an_entropy_bonus_trains_even_where_every_advantage_is_zero(reward_fn, scored) -> None:
    """Uniform rewards give no policy gradient; the entropy bonus alone still moves the weights."""
    import pyarrow as pa

    flat = scored.set_column(scored.schema.get_field_index("reward.varied"), "reward.varied",
                             pa.array([1.0] * scored.num_rows, pa.float32()))
    for coef, moves in ((0.0, False), (0.5, True)):
        learner = Learner(make_config(reward_fn, entropy_coef=coef))
        before = {k: v.clone() for k, v in learner.model.state_dict().items()}
        metrics = train(learner, flat)
        assert any(not torch.equal(before[k], v) for k, v in learner.model.state_dict().items()) == moves
        if coef:
            vocab = learner.model.config.vocab_size
            assert 0 < metrics["train/entropy"] <= math.log(vocab)


def test_the_self_judge_objective_trains_the_policy_as_its_own_judge(reward_fn, scored) -> None:
    """SPARK: its loss is the judge's cross-entropy on the batch's verifier labels (P(Y) vs P(N)
    after the judge prompt), here over all 16 labelled rollouts, read before the update."""
    from actors.judging import render, single_token, yes_probability
    from pipelines.stages.judge import JudgeConfig

    config = make_config(reward_fn)
    learner = Learner(config, objectives=["policy_gradient", {"name": "self_judge", "per_update": 64}])
    tok = learner.tokenizer
    texts = [render(JudgeConfig().template, p, r) for p, r in zip(scored.column("prompt").to_pylist(),
                                                                  scored.column("response").to_pylist())]
    p_yes = yes_probability(learner.model, tok, texts, single_token(tok, "Y", "yes"), single_token(tok, "N", "no"), "cpu")
    correct = np.array(scored.column("reward.varied").to_pylist()) >= 0.5
    expected = float(np.mean(-np.log(np.where(correct, p_yes, 1 - p_yes))))
    metrics = train(learner, scored)
    assert metrics["self_judge/loss"] == pytest.approx(expected, rel=1e-4)
    assert 0 <= metrics["self_judge/accuracy"] <= 1
    with pytest.raises(ValueError, match="coef > 0"):
        Learner(config, objectives=[{"name": "self_judge", "coef": 0}])
