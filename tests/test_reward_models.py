"""Reward-model actors in-process: all-or-nothing weight updates, scoring with clear nulls for
samples that cannot be scored, and the Bradley-Terry learner (pairs, held-out accuracy, saving)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from actors import batch as B
from actors.modeling import char_tokenizer, tiny_model
from actors.reward_learner import RewardLearner
from actors.reward_model import RewardModel
from actors.weights import WeightMismatchError, export_state, load_state
from orchestrator.config import validate_config

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    """A causal LM directory: what a reward model starts from (its body; the head is new)."""
    path = tmp_path_factory.mktemp("policy")
    tok = char_tokenizer()
    tiny_model(tok, **TINY).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def config(**reward_model):
    return validate_config({"model": {"tiny": TINY}, "train": {"threads": 1},
                            "rewards": [{"name": "rm", "model": "auto"}, {"name": "correct", "fn": "integer_match"}],
                            "reward_model": {"lr": 3e-3, "batch_pairs": 32, **reward_model}})


def rm_learner(cfg, model_source: str) -> RewardLearner:
    """A reward-model learner as its recipes declare it: the reward_model section as its spec."""
    return RewardLearner(cfg, model_source, **cfg.reward_model.learner_args(cfg))


def rollouts(responses: list[str], answers: list[str], group: int = 4) -> pa.Table:
    n = len(responses)
    ones = np.ones(n, dtype=np.int64)
    return B.rollout_table(
        uid=[f"u{i}" for i in range(n)], prompt_id=[f"p{i // group}" for i in range(n)],
        prompt=[f"{i // group}+1=" for i in range(n)], response=responses,
        prompt_ids=B.list_column(np.ones(n, np.int32), ones, pa.int32()),
        response_ids=B.list_column(np.ones(n, np.int32), ones, pa.int32()),
        behavior_logprobs=B.list_column(np.zeros(n, np.float32), ones, pa.float32()),
        policy_version=0, finish_reason=["stop"] * n, extra={"answer": pa.array(answers)})


def test_a_weight_update_that_does_not_fit_loads_nothing():
    tok = char_tokenizer()
    model = tiny_model(tok, **TINY)
    other = tiny_model(tok, **{**TINY, "hidden_size": 64, "num_heads": 4})
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(WeightMismatchError, match="shape") as e:
        load_state(model, export_state(other, 1), 1)
    assert "nothing was loaded" in str(e.value)
    payload = export_state(model, 2)
    del payload["state"]["model.norm.weight"]
    payload["state"]["extra.weight"] = np.zeros(3, np.float32)
    with pytest.raises(WeightMismatchError, match="missing 1 keys.*unexpected 1 keys"):
        load_state(model, payload, 2)
    payload = export_state(model, 3)
    payload["state"] = {k: v.astype(np.float16) for k, v in payload["state"].items()}
    with pytest.raises(WeightMismatchError, match="dtype float16"):
        load_state(model, payload, 3)
    with pytest.raises(WeightMismatchError, match="says version 3 but was sent as version 4"):
        load_state(model, export_state(model, 3), 4)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    load_state(model, export_state(other.__class__(model.config), 5), 5)  # a fitting update loads


def test_scoring_gives_null_and_a_reason_for_what_cannot_be_scored(policy_dir):
    scorer = RewardModel(config(), {"rm": str(policy_dir)}, template=config().reward_model.template)
    table = rollouts(["2", "", "3", "x" * 400], ["2", "2", "2", "2"])
    # a response that is not valid UTF-8 (Arrow can carry such bytes in a string column)
    bad = pa.array([b"2", b"", b"\xff\xfe", b"x" * 400], pa.binary()).view(pa.string())
    table = table.set_column(table.schema.get_field_index("response"), "response", bad)
    scored, info = scorer.score(table)
    values, errors = scored.column("reward.rm").to_pylist(), scored.column("reward_error.rm").to_pylist()
    assert values[0] is not None and errors[0] is None
    assert values[1] is None and errors[1] == "empty response"
    assert values[2] is None and "not valid UTF-8" in errors[2] and "0xff" in errors[2]
    assert values[3] is None and "more than the reward model's" in errors[3]
    assert info["errors/rm"] == 3 and scored.column("reward_model_version").to_pylist() == [0] * 4
    # it accepts a versioned update from a learner of the same model, and stamps the version
    learner = rm_learner(config(), str(policy_dir))
    scorer.update_weights(7, learner.publish() | {"version": 7})
    assert scorer.score(table)[0].column("reward_model_version").to_pylist() == [7] * 4


def test_bradley_terry_learner_learns_pairs_and_saves_a_transformers_classifier(policy_dir, tmp_path):
    learner = rm_learner(config(), str(policy_dir))
    prompts = [f"{a}+{b}=" for a in range(10) for b in range(10)]
    answers = [str(a + b) for a in range(10) for b in range(10)]
    pairs = B.pair_table(prompts, answers, [str(int(x) + 5) + "7" for x in answers])
    before = learner.evaluate_pairs(pairs)["rm/eval_pair_accuracy"]
    for _ in range(15):
        metrics = learner.train_pairs(pairs)
    after = learner.evaluate_pairs(pairs)
    assert metrics["rm/version"] == 15 and metrics["rm/optimizer_steps"] == 4  # 100 pairs, 32 a step
    assert after["rm/eval_pair_accuracy"] >= 0.9 > before or after["rm/eval_pair_accuracy"] > before + 0.3
    out = learner.save(str(tmp_path / "rm"))
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model, tok = AutoModelForSequenceClassification.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    with torch.no_grad():
        logits = model(**tok(["3+4=7"], return_tensors="pt", add_special_tokens=False)).logits
    assert logits.shape == (1, 1)


def test_pairs_from_rollouts_take_the_hardest_wrong_response(policy_dir):
    learner = rm_learner(config(pairs_per_group=1), str(policy_dir))
    table = rollouts(["1", "5", "6", "7", "2", "2", "9", "9"], ["1"] * 4 + ["2"] * 4)
    table = table.append_column("reward.correct", pa.array([1, 0, 0, 0, 1, 1, 0, 0], pa.float32()))
    table = table.append_column("reward.rm", pa.array([0.5, 0.1, 0.9, 0.3, 0.0, 0.2, 0.4, 0.1], pa.float32()))
    pairs, stats = learner.pairs_from_rollouts(table, "hardest")
    assert stats["pairs"] == 2
    # group 0: the only correct "1" against "6", the wrong one scored highest; group 1: the
    # lowest-scored correct "2" (0.0) against the highest-scored wrong "9" (0.4)
    assert pairs.column("chosen").to_pylist() == ["1", "2"] and pairs.column("rejected").to_pylist() == ["6", "9"]
    metrics = learner.update_from_rollouts(table)
    # before the update: group 0 orders 2 of its 3 correct-vs-wrong pairs right (0.5 > 0.1, 0.3; not
    # 0.9), group 1 only 1 of 4 (0.2 > 0.1): 3 of 7
    assert metrics["rm/batch_pair_accuracy"] == pytest.approx(3 / 7) and metrics["rm/batch_labelled_pairs"] == 7
    assert metrics["rm/version"] == 1
