"""LaSeR's self-verification warm-up and class-balanced MSE, in-process (no Ray): the pairs it
trains on, the balanced weights against hand-computed values, that a few steps on the policy's own
labelled samples fit r to the labels, and the offset c, which the credit step keeps (not the learner)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from actors import batch as B
from actors.learner import Learner
from orchestrator.config import validate_config
from orchestrator.data import arithmetic
from pipelines.grpo import GRPO
from pipelines.laser_reward import SelfReward, save_c, with_offset
from pipelines.stages.laser import pair_batch, pair_indices
from rl_step import train
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


def laser_learner(cfg) -> Learner:
    """A policy learner as the recipe declares it: laser_align with the `laser` section's settings."""
    return Learner(cfg, objectives=GRPO.objectives(cfg))


def test_the_recipe_hands_laser_align_its_settings_as_arguments():
    cfg = laser_config(balance=True, beta=0.5, mse_weight=2.0, token="N")
    laser = laser_learner(cfg).objectives["laser_align"]
    assert (laser.balance, laser.beta, laser.mse_weight, laser.label) == (True, 0.5, 2.0, "correct")
    assert laser.token == laser.learner.tokenizer.convert_tokens_to_ids("N")


@pytest.mark.parametrize("balance", [False, True])
def test_the_mse_weights_sum_to_one_and_balance_the_classes(balance):
    laser = laser_learner(laser_config(balance=balance)).objectives["laser_align"]
    labels = torch.tensor([1.0, 1.0, 1.0, 0.0, float("nan")])
    weight = laser.class_weights(labels)(labels[:4])
    expected = [1 / 6, 1 / 6, 1 / 6, 1 / 2] if balance else [1 / 4] * 4
    assert weight.tolist() == pytest.approx(expected)
    one_class = torch.tensor([1.0, 1.0])
    assert laser.class_weights(one_class)(one_class).tolist() == pytest.approx([0.5, 0.5])


@pytest.fixture(scope="module")
def labelled():
    """The policy's own samples (with log pi(z | x, y)), labelled half right and half wrong: a random
    tiny policy gets 1-digit sums wrong, and the step must see both classes."""
    cfg = laser_config()
    table = rollout_and_score(cfg, arithmetic(1, ["+"], eval_size=10, seed=0).train.slice(0, 8))
    label = (np.arange(table.num_rows) % 2).astype(np.float32)
    return cfg, B.replace_column(table, "reward.correct", pa.array(label))


def test_the_warm_ups_nll_reads_the_correct_samples_or_every_sample(labelled):
    """laser.warmup_nll_on: "correct" teaches from the labels (a batch with no correct sample has no
    NLL), "all" is label-blind (the same batch has one)."""
    cfg, table = labelled
    c = float(np.nanmean(table.column("laser_logprob").to_numpy(zero_copy_only=False)))
    wrong = B.replace_column(with_offset(table, c), "reward.correct", pa.array(np.zeros(table.num_rows, np.float32)))
    learner = laser_learner(cfg)
    assert learner.call_objective("laser_align", "align_steps", [wrong], 1e-9, 0.05, "correct")["laser_warmup/nll"] == 0
    assert learner.call_objective("laser_align", "align_steps", [wrong], 1e-9, 0.05, "all")["laser_warmup/nll"] > 0


def test_the_warm_ups_nll_on_every_sample_weighs_each_kind_by_its_share_of_the_draw(labelled):
    """A batch of (correct, wrong) pairs is half correct; "all" with the draw's sample accuracy
    weighs the correct rows at that share, so its NLL is the policy's own samples' (label-blind)."""
    from actors.objectives.laser_align import draw_weights

    right = torch.tensor([1.0, 1.0, 0.0, 0.0])
    w = draw_weights(right, 0.1)
    assert float((w * right).sum() / w.sum()) == pytest.approx(0.1) and float(w.sum()) == pytest.approx(4)
    assert draw_weights(torch.ones(3), 0.2).tolist() == [1.0, 1.0, 1.0]  # one kind only: as it is
    cfg, table = labelled
    c = float(np.nanmean(table.column("laser_logprob").to_numpy(zero_copy_only=False)))
    batch = with_offset(table, c)
    learner = laser_learner(cfg)
    nll = {acc: learner.call_objective("laser_align", "align_steps", [batch], 1e-9, 0.05, "all",
                                       acc)["laser_warmup/nll"] for acc in (None, 0.5, 0.0, 1.0)}
    label = table.column("reward.correct").to_numpy(zero_copy_only=False)
    only = {k: learner.call_objective("laser_align", "align_steps", [batch.filter(pa.array(label == k))], 1e-9, 0.05,
                                      "all")["laser_warmup/nll"] for k in (0, 1)}
    assert nll[0.0] == pytest.approx(only[0], rel=1e-4) and nll[1.0] == pytest.approx(only[1], rel=1e-4)
    assert only[0] != pytest.approx(only[1], rel=1e-3) and nll[None] == pytest.approx(nll[0.5], rel=1e-4)


def test_self_verification_steps_fit_r_to_the_labels(labelled):
    cfg, table = labelled
    learner = laser_learner(cfg)
    laser = learner.objectives["laser_align"]
    c = float(np.nanmean(table.column("laser_logprob").to_numpy(zero_copy_only=False)))  # as the stage fixes it
    batch = with_offset(table, c)
    first = learner.call_objective("laser_align", "align_steps", [batch], 1e-2, 0.05)
    assert first["laser_warmup/nll"] > 0  # the correct samples' NLL is part of the loss
    last = learner.call_objective("laser_align", "align_steps", [batch] * 40, 1e-2, 0.05)
    assert last["laser_warmup/mse"] < 0.5 * first["laser_warmup/mse"]
    ids, mask, positions, _, _, p_width = learner._sequences(table)
    with torch.no_grad():
        _, tail = learner._response_logits(learner.model, ids, mask, positions, p_width, after=True)
    r = cfg.laser.beta * (torch.log_softmax(tail, -1)[:, laser.token] - c)
    label = torch.tensor(table.column("reward.correct").to_numpy())
    assert r[label == 1].mean() > r[label == 0].mean() + 0.5  # r now tells the two classes apart
    unlabelled = B.replace_column(batch, "reward.correct", pa.nulls(table.num_rows, pa.float32()))
    with pytest.raises(B.BatchError, match="reward.correct"):
        laser.align_steps([unlabelled], 1e-2, 0.05)
    with pytest.raises(B.BatchError, match=r"laser_align objective needs batch column\(s\) \['laser_c'\]"):
        laser.align_steps([table], 1e-2, 0.05)
    mixed = B.replace_column(batch, "laser_c", pa.array(np.arange(table.num_rows, dtype=np.float64)))
    with pytest.raises(B.BatchError, match="'laser_c' must hold one finite value for the whole batch"):
        laser.align_steps([mixed], 1e-2, 0.05)


def test_the_credit_step_fixes_c_from_the_first_batch_writes_r_and_keeps_c_through_a_checkpoint(labelled):
    cfg, table = labelled
    part = SelfReward(cfg)
    assert part.c is None
    out = part(table)
    lp = table.column("laser_logprob").to_numpy(zero_copy_only=False).astype(np.float64)
    c = float(np.nanmean(lp))
    assert part.c == c and out.column("laser_c").to_pylist() == [c] * table.num_rows
    expected = (cfg.laser.beta * (lp - c)).astype(np.float32)
    assert np.array_equal(out.column("reward.self").to_numpy(), expected)
    shifted = B.replace_column(table, "laser_logprob", pa.array((lp - 1.0).astype(np.float32)))
    assert part(shifted).column("laser_c")[0].as_py() == c  # fixed once
    import json

    resumed = SelfReward(cfg)
    resumed.load_state_dict(json.loads(json.dumps(part.state_dict())))  # as loop_state.json holds it
    assert resumed.c == c and part.metrics() == {"train/laser_c": c}
    with pytest.raises(B.BatchError, match="laser_logprob"):
        SelfReward(cfg)(table.drop_columns(["laser_logprob"]))


def test_a_warmed_models_c_is_the_one_the_run_keeps(tmp_path):
    """The warm-up saves its c beside the model (laser.json); a run from that model keeps it unless
    laser.c is set; a model without one leaves c to the first batch."""
    save_c(tmp_path / "aligned", -4.25)
    assert SelfReward(laser_config(), str(tmp_path / "aligned")).c == -4.25
    assert SelfReward(laser_config(c=-3.0), str(tmp_path / "aligned")).c == -3.0  # an explicit c wins
    assert SelfReward(laser_config(), str(tmp_path)).c is None


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
    learner = laser_learner(cfg)
    ids, mask, positions, _, _, p_width = learner._sequences(table)
    with torch.no_grad():
        _, tail = learner._response_logits(learner.model, ids, mask, positions, p_width, after=True)
    token = learner.objectives["laser_align"].token
    r = (cfg.laser.beta * (torch.log_softmax(tail, -1)[:, token] + 5.0)).numpy()
    ok = ~np.isnan(label)
    good, bad = ok & (label >= 0.5), ok & (label < 0.5)
    expected = 0.5 * np.mean((r[good] - 1) ** 2) + 0.5 * np.mean(r[bad] ** 2)
    metrics = train(learner, table)  # the credit step writes laser.c = -5 into the batch
    assert metrics["train/laser_mse"] == pytest.approx(expected, rel=1e-4) and metrics["train/laser_c"] == -5.0
