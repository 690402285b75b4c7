"""LaSeR's self-verification warm-up and class-balanced MSE, in-process (no Ray): the pairs it
trains on, the balanced weights against hand-computed values, and that a few steps on the policy's
own labelled samples fit r to the labels."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from actors import batch as B
from actors.learner import Learner
from orchestrator.config import validate_config
from orchestrator.data import arithmetic
from pipelines.stages.laser import pair_batch, pair_indices
from test_learner import rollout_and_score

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}


def laser_config(**laser):
    return validate_config({"model": {"tiny": TINY}, "train": {"threads": 1},
                            "rollout": {"samples_per_prompt": 8, "max_new_tokens": 3, "temperature": 1.0},
                            "rewards": [{"name": "correct", "fn": "integer_match"},
                                        {"name": "self", "laser": True, "weight": 0}],
                            "aggregate": {"fill": {"correct": "self"}}, "laser": laser})


def test_pairs_come_only_from_prompts_with_a_correct_and_a_wrong_labelled_sample():
    label = np.array([1, 0, 1, 1, 0, 0, np.nan, 1, np.nan, 0])
    groups = np.array([0, 0, 0, 1, 1, 2, 2, 3, 3, 3])
    pairs = pair_indices(label, groups)
    # group 2 has one wrong and one unlabelled sample: no pair; the NaN of group 3 joins neither side
    assert [(g.tolist(), b.tolist()) for g, b in pairs] == [([0, 2], [1]), ([3], [4]), ([7], [9])]
    table = pa.table({"row": list(range(10))})
    batch = pair_batch(table, pairs, 2, np.random.default_rng(0)).column("row").to_pylist()
    good, bad = batch[:2], batch[2:]
    assert all(label[i] == 1 for i in good) and all(label[i] == 0 for i in bad)
    assert [groups[i] for i in good] == [groups[i] for i in bad]  # each pair is one prompt's
    assert len(pair_batch(table, pairs, 10, np.random.default_rng(0))) == 6  # at most one pair a prompt


@pytest.mark.parametrize("balance", [False, True])
def test_the_mse_weights_sum_to_one_and_balance_the_classes(balance):
    learner = Learner(laser_config(balance=balance))
    labels = torch.tensor([1.0, 1.0, 1.0, 0.0, float("nan")])
    weight = learner._laser_class_weights(labels)(labels[:4])
    expected = [1 / 6, 1 / 6, 1 / 6, 1 / 2] if balance else [1 / 4] * 4
    assert weight.tolist() == pytest.approx(expected)
    one_class = torch.tensor([1.0, 1.0])
    assert learner._laser_class_weights(one_class)(one_class).tolist() == pytest.approx([0.5, 0.5])


@pytest.fixture(scope="module")
def labelled():
    """The policy's own samples (with log pi(z | x, y)), labelled half right and half wrong: a random
    tiny policy gets 1-digit sums wrong, and the step must see both classes."""
    cfg = laser_config()
    table = rollout_and_score(cfg, arithmetic(1, ["+"], eval_size=10, seed=0).train.slice(0, 8))
    label = (np.arange(table.num_rows) % 2).astype(np.float32)
    return cfg, B.replace_column(table, "reward.correct", pa.array(label))


def test_self_verification_steps_fit_r_to_the_labels_and_fix_c(labelled):
    cfg, table = labelled
    learner = Learner(cfg)
    assert learner.laser_c is None
    first = learner.laser_align_steps([table], lr=1e-2, nll_weight=0.05)
    c = first["laser_warmup/c"]
    expected_c = float(np.nanmean(table.column("laser_logprob").to_numpy(zero_copy_only=False)))
    assert c == pytest.approx(expected_c, rel=1e-6)
    assert first["laser_warmup/nll"] > 0  # the correct samples' NLL is part of the loss
    last = learner.laser_align_steps([table] * 40, lr=1e-2, nll_weight=0.05)
    assert last["laser_warmup/c"] == c  # fixed once, as in RL
    assert last["laser_warmup/mse"] < 0.5 * first["laser_warmup/mse"]
    ids, mask, positions, _, _, p_width = learner._sequences(table)
    with torch.no_grad():
        _, tail = learner._response_logits(learner.model, ids, mask, positions, p_width, after=True)
    r = cfg.laser.beta * (torch.log_softmax(tail, -1)[:, learner.laser_token] - c)
    label = torch.tensor(table.column("reward.correct").to_numpy())
    assert r[label == 1].mean() > r[label == 0].mean() + 0.5  # r now tells the two classes apart
    unlabelled = B.replace_column(table, "reward.correct", pa.nulls(table.num_rows, pa.float32()))
    with pytest.raises(B.BatchError, match="reward.correct"):
        learner.laser_align_steps([unlabelled], lr=1e-2, nll_weight=0.05)
    with pytest.raises(B.BatchError, match="laser_logprob"):
        learner.laser_align_steps([table.drop_columns(["laser_logprob"])], lr=1e-2, nll_weight=0.05)


def test_the_saved_model_keeps_c_and_a_learner_built_from_it_uses_it(tmp_path, labelled):
    cfg, table = labelled
    learner = Learner(cfg)
    learner.laser_align_steps([table], lr=1e-2, nll_weight=0.05)
    out = learner.save(str(tmp_path / "aligned"), optimizer=False)
    assert Learner(cfg, model_source=out).laser_c == learner.laser_c
    assert Learner(laser_config(c=-3.0), model_source=out).laser_c == -3.0  # an explicit c wins
    # a configured c is not the model's: saving it must not hand it to a run that leaves c open
    configured = Learner(laser_config(c=-3.0)).save(str(tmp_path / "configured"), optimizer=False)
    assert Learner(cfg, model_source=configured).laser_c is None


@pytest.mark.parametrize("micro_batch_size", [1, 64])
def test_the_balanced_mse_is_one_mean_over_the_update_whatever_the_micro_batches(labelled, micro_batch_size):
    """Half the rows unlabelled, and the labelled ones 1:2 correct:wrong; the balanced MSE weighs
    each class half over the whole update, not per micro-batch."""
    cfg, table = labelled
    cfg = cfg.model_copy(update={"laser": cfg.laser.model_copy(update={"balance": True, "c": -5.0}),
                                 "algorithm": cfg.algorithm.model_copy(update={"micro_batch_size": micro_batch_size})})
    n = table.num_rows
    label = np.where(np.arange(n) % 2 == 0, np.nan, (np.arange(n) % 3 == 0).astype(np.float32))
    table = B.replace_column(table, "reward.correct", pa.array(label, pa.float32(), mask=np.isnan(label)))
    learner = Learner(cfg)
    ids, mask, positions, _, _, p_width = learner._sequences(table)
    with torch.no_grad():
        _, tail = learner._response_logits(learner.model, ids, mask, positions, p_width, after=True)
    r = (cfg.laser.beta * (torch.log_softmax(tail, -1)[:, learner.laser_token] + 5.0)).numpy()
    ok = ~np.isnan(label)
    good, bad = ok & (label >= 0.5), ok & (label < 0.5)
    expected = 0.5 * np.mean((r[good] - 1) ** 2) + 0.5 * np.mean(r[bad] ** 2)
    metrics = learner.train_step(table)
    assert metrics["train/laser_mse"] == pytest.approx(expected, rel=1e-4)
