"""The per-token `loss_mask` of multi-turn episodes (observation tokens are context, never trained on),
in the learner's padded and packed paths alike: what a masked token's behaviour log-prob or
advantage says changes nothing, the update equals the one computed by hand over the policy's
tokens, the packed path equals the padded one, and the credit step's process advantages skip the
masked tokens. The SFT warm-up's demonstrations train on the policy's tokens only."""

from __future__ import annotations

import copy

import numpy as np
import pyarrow as pa
import pytest
import torch

from actors import batch as B
from actors.learner import Learner
from rl_step import credited, train
from test_packing import config, table


def with_mask(t: pa.Table, seed: int = 0) -> pa.Table:
    """Every response gets a loss mask with runs of False inside it (observations), first token kept."""
    rng = np.random.default_rng(seed)
    lengths = t.column("response_ids").combine_chunks().value_lengths().to_numpy()
    values = np.concatenate([np.r_[True, rng.random(n - 1) > 0.4] if n else np.zeros(0, bool) for n in lengths])
    return t.append_column("loss_mask", B.list_column(values, lengths, pa.bool_()))


def perturbed(t: pa.Table) -> pa.Table:
    """The behaviour log-probs of the masked tokens set far off (a masked token's ratio would clip)."""
    lp = t.column("behavior_logprobs").combine_chunks()
    mask = t.column("loss_mask").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    values = np.where(mask, lp.flatten().to_numpy(), 3.0).astype(np.float32)
    return t.set_column(t.schema.get_field_index("behavior_logprobs"), "behavior_logprobs",
                        B.list_column(values, lp.value_lengths().to_numpy(), pa.float32()))


def step(t: pa.Table, packing: str) -> tuple[dict, dict]:
    cfg = config(packing=packing)
    learner = Learner(cfg, None, role={"threads": 1}, objectives=["policy_gradient"])
    grads = {}
    opt_step = learner.optimizer.step
    learner.optimizer.step = lambda *a, **k: (grads.update({n: p.grad.clone() for n, p in
                                                             learner.model.named_parameters()}), opt_step(*a, **k))[1]
    return train(learner, t), grads


@pytest.mark.parametrize("packing", ["off", "on"])
def test_masked_tokens_do_not_train(packing):
    t = with_mask(table(seed=3))
    (m, g), (m2, g2) = step(t, packing), step(perturbed(t), packing)
    for key in ("train/loss", "train/pg_loss", "train/clip_frac", "train/grad_norm"):
        assert m2[key] == pytest.approx(m[key], rel=1e-6, abs=1e-7), key
    for name, grad in g.items():
        torch.testing.assert_close(g2[name], grad, atol=1e-7, rtol=1e-6, msg=name)
    # the same perturbation without the mask reaches the loss: the mask is what keeps it out
    (u, _), (u2, _) = step(perturbed(t).drop_columns(["loss_mask"]), packing), step(t.drop_columns(["loss_mask"]), packing)
    assert u["train/clip_frac"] > u2["train/clip_frac"]


def test_the_packed_path_equals_the_padded_one_with_a_mask():
    t = with_mask(table(seed=5), seed=1)
    (m_pad, g_pad), (m_pack, g_pack) = step(t, "off"), step(t, "on")
    for key in ("train/loss", "train/pg_loss", "train/grad_norm", "train/neg_logprob"):
        assert m_pack[key] == pytest.approx(m_pad[key], rel=1e-5, abs=1e-6), key
    for name, g in g_pad.items():
        torch.testing.assert_close(g_pack[name], g, atol=1e-5, rtol=1e-4, msg=name)


def test_the_loss_is_the_token_mean_over_the_policys_tokens():
    """On-policy PPO-clip at ratio 1: the loss is -mean(advantage) over the unmasked tokens."""
    cfg = config()
    learner = Learner(cfg, None, role={"threads": 1}, objectives=["policy_gradient"])
    t = with_mask(table(seed=2))
    ids, mask, positions, r_ids, r_mask, p_width = learner._sequences(t)
    with torch.no_grad():  # behaviour log-probs = the learner's own: ratio 1
        lp = learner._token_logprobs(learner.model, ids, mask, positions, r_ids, p_width)
    lengths = r_mask.sum(1).numpy()
    t = t.set_column(t.schema.get_field_index("behavior_logprobs"), "behavior_logprobs",
                     B.list_column(lp[r_mask].numpy(), lengths, pa.float32()))
    batch, _ = credited(cfg, t)
    adv, _ = B.to_padded(batch.column("advantages"), 0.0, torch.float32)
    own = B.loss_mask(batch)
    metrics = learner.train_step(batch)
    assert metrics["train/pg_loss"] == pytest.approx(float(-(adv * own).sum() / own.sum()), abs=1e-5)
    assert metrics["samples/response_length"] == pytest.approx(float(own.sum()) / t.num_rows)


def test_process_advantages_skip_masked_tokens():
    t = with_mask(table(seed=4))
    lengths = t.column("response_ids").combine_chunks().value_lengths().to_numpy()
    dense = np.concatenate([np.arange(n, dtype=np.float32) for n in lengths])
    t = t.append_column("token_rewards", B.list_column(dense, lengths, pa.float32()))
    batch, _ = credited(config(), t)
    adv, _ = B.to_padded(batch.column("advantages"), 0.0, torch.float32)
    own, layout = B.loss_mask(batch), B.response_mask(batch)
    assert float(adv[layout & ~own].abs().sum()) == 0.0 and float(adv[own].abs().sum()) > 0


def test_sft_demonstrations_target_the_policys_tokens_only():
    from orchestrator.config import validate_config

    cfg = validate_config({"seed": 0, "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 4,
                                                         "intermediate_size": 64}},
                           "env": {"name": "calculator"}, "train": {"threads": 1}})
    learner = Learner(cfg, None, role={"threads": 1}, objectives=["sft"])
    rows = pa.table({"prompt": ["12*34=", "5+6="], "answer": ["408", "11"]})
    ids, targets = learner.objectives["sft"].packed_answers(rows)
    tok = learner.tokenizer
    text = tok.decode([i for i in ids[0].tolist() if i != tok.pad_token_id], skip_special_tokens=False)
    assert text == "12*34=<calc>12*34</calc><obs>408</obs>408"  # inputs: the last target (EOS) is not fed
    trained = tok.decode([t for t in targets[0].tolist() if t != -100], skip_special_tokens=False)
    assert trained == "<calc>12*34</calc>408<eos>"  # the observation is context, never a target
    before = copy.deepcopy(learner.model.state_dict())
    learner.sft_steps([rows], 1e-3)
    assert any(not torch.equal(before[k], v) for k, v in learner.model.state_dict().items())
