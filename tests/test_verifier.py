"""The Verifier actor in-process: reward columns, errors, labelled fractions, group functions,
per-reward args, and evaluation; the aggregation of its columns into `reward`."""

from __future__ import annotations

import textwrap

import numpy as np
import pyarrow as pa
import pytest

from actors import batch as B
from actors.rewards.aggregate import Aggregator
from actors.verifier import Verifier
from orchestrator.config import validate_config

USER_MODULE = '''
from actors.rewards import group_reward

def weighted(prompt, response, answer, **_):
    if response == "bad":
        raise ValueError("cannot score")
    return 1.0

def sleepy(prompt, response, answer, **_):
    import time
    time.sleep(30)
    return 1.0

def scaled(prompt, response, answer, factor=1.0, **_):
    return factor * float(response == answer)

@group_reward
def agree(prompt, responses, **_):
    """1 for responses equal to the group's most common one."""
    top = max(set(responses), key=responses.count)
    return [float(r == top) for r in responses]
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    name = f"coevo_verifier_rewards_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def rollouts(responses: list[str], answers: list[str], group_size: int = 2) -> pa.Table:
    n = len(responses)
    lengths = np.ones(n, dtype=np.int64)
    return B.rollout_table(
        uid=[f"u{i}" for i in range(n)], prompt_id=[f"p{i // group_size}" for i in range(n)],
        prompt=["q"] * n, response=responses,
        prompt_ids=B.list_column(np.ones(n, np.int32), lengths, pa.int32()),
        response_ids=B.list_column(np.ones(n, np.int32), lengths, pa.int32()),
        behavior_logprobs=B.list_column(np.zeros(n, np.float32), lengths, pa.float32()),
        policy_version=0, finish_reason=["stop"] * n,
        extra={"answer": pa.array(answers)},
    )


def config(rewards: list[dict], **verifier):
    return validate_config({"rewards": rewards, "verifier": verifier, "rollout": {"samples_per_prompt": 2}})


def score(cfg, table):
    verifier = Verifier(cfg)
    try:
        return verifier.score(table)
    finally:
        verifier.close()


def test_columns_errors_and_the_aggregate(user_module):
    cfg = config([{"name": "acc", "fn": "exact_match", "weight": 2.0},
                  {"name": "user", "fn": f"{user_module}:weighted", "weight": 0.5}], on_error=-1.0)
    table = rollouts(["7", "bad", "8", "9"], ["7", "bad", "9", "9"])
    scored, info = score(cfg, table)
    B.validate(scored)
    assert scored.column("reward.acc").to_pylist() == [1.0, 1.0, 0.0, 1.0]
    assert scored.column("reward_error.acc").to_pylist() == [None] * 4
    assert scored.column("reward.user").to_pylist() == [1.0, None, 1.0, 1.0]
    errors = scored.column("reward_error.user").to_pylist()
    assert errors[0] is None and "ValueError: cannot score" in errors[1]
    assert info["errors/user"] == 1 and info["errors/acc"] == 0 and info["busy_s"] > 0
    # what the run's check on failing sources reads (orchestrator.reward_health)
    assert info["scored/user"] == info["scored/acc"] == 4 and info["first_error/acc"] is None
    assert "ValueError: cannot score" in info["first_error/user"]
    assert "reward" not in scored.schema.names  # aggregation is the learner's stage
    # dataset and core columns pass through untouched
    assert scored.column("answer").to_pylist() == ["7", "bad", "9", "9"]
    assert scored.column("uid").to_pylist() == table.column("uid").to_pylist()
    # reward = 2 * acc + 0.5 * user, with on_error = -1 standing in for the failed user score
    aggregated, metrics = Aggregator(cfg.aggregate_spec()).apply(scored)
    assert np.allclose(aggregated.column("reward").to_numpy(), [2.5, 2 - 0.5, 0.5, 2.5])
    assert metrics["reward/user/errors"] == 1


def test_unlabelled_prompts_get_no_verifier_reward_and_no_error():
    cfg = config([{"name": "acc", "fn": "exact_match"}], fraction=0.5)
    table = rollouts(["7", "7", "8", "9"], ["7", "7", "8", "8"])
    table = table.append_column("labelled", pa.array([True, True, False, False]))
    scored, info = score(cfg, table)
    assert scored.column("reward.acc").to_pylist() == [1.0, 1.0, None, None]
    assert scored.column("reward_error.acc").to_pylist() == [None] * 4 and info["errors/acc"] == 0


def test_a_label_free_function_scores_the_unlabelled_prompts_and_can_fill_the_verifiers_place():
    """Majority vote reads no reference answer: with half the prompts labelled it still scores
    every group, so `aggregate.fill` can put it where the verifier gave no label."""
    cfg = validate_config({"rewards": [{"name": "acc", "fn": "exact_match"},
                                       {"name": "vote", "fn": "majority_vote", "weight": 0.0, "args": {"extract": "text"}}],
                           "verifier": {"fraction": 0.5, "accuracy_source": "acc"}, "aggregate": {"fill": {"acc": "vote"}},
                           "rollout": {"samples_per_prompt": 3}})
    assert [r.label_free for r in cfg.rewards] == [False, True]
    table = rollouts(["7", "7", "8", "9", "9", "4"], ["7", "7", "7", "8", "8", "8"], group_size=3)
    table = table.append_column("labelled", pa.array([True] * 3 + [False] * 3))
    scored, info = score(cfg, table)
    assert scored.column("reward.acc").to_pylist() == [1.0, 1.0, 0.0, None, None, None]
    assert scored.column("reward.vote").to_pylist() == [1.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    assert info["scored/acc"] == 3 and info["scored/vote"] == 6
    aggregated, _ = Aggregator(cfg.aggregate_spec()).apply(scored)
    assert aggregated.column("reward").to_pylist() == [1.0, 1.0, 0.0, 1.0, 1.0, 0.0]


def test_group_functions_see_every_response_of_a_prompt(user_module):
    cfg = config([{"name": "vote", "fn": f"{user_module}:agree"}])
    table = rollouts(["1", "1", "2", "5", "5", "5"], ["x"] * 6, group_size=3)
    scored, _ = score(cfg, table)
    assert scored.column("reward.vote").to_pylist() == [1.0, 1.0, 0.0, 1.0, 1.0, 1.0]


def test_args_reach_the_function_and_win_over_columns(user_module):
    cfg = config([{"name": "s", "fn": f"{user_module}:scaled", "args": {"factor": 3.0}}])
    table = rollouts(["7", "8"], ["7", "7"]).append_column("factor", pa.array([100.0, 100.0]))
    scored, _ = score(cfg, table)
    assert scored.column("reward.s").to_pylist() == [3.0, 0.0]


def test_evaluate_reads_the_accuracy_source(user_module):
    cfg = config([{"name": "user", "fn": f"{user_module}:weighted"}, {"name": "acc", "fn": "integer_match"}],
                 accuracy_source="acc")
    verifier = Verifier(cfg)
    try:
        metrics = verifier.evaluate(rollouts(["3", "4", "bad", "5"], ["3", "3", "3", "5"]))
    finally:
        verifier.close()
    assert metrics["accuracy"] == 0.5 and metrics["samples"] == 4
    assert metrics["errors/user"] == 1 and metrics["errors/acc"] == 0


@pytest.mark.parametrize("hang_first", [True, False])
def test_a_hanging_reward_does_not_zero_the_accuracy_source(user_module, hang_first):
    """Issue 15: a function that always hangs, listed before integer_match, nulled integer_match
    too and held-out accuracy read 0.000. Either order keeps the accuracy."""
    rewards = [{"name": "slow", "fn": f"{user_module}:sleepy", "timeout_s": 1},
               {"name": "acc", "fn": "integer_match"}]
    cfg = config(rewards if hang_first else rewards[::-1], accuracy_source="acc", max_workers=4)
    verifier = Verifier(cfg)
    try:
        metrics = verifier.evaluate(rollouts(["3", "4", "3", "5"] * 16, ["3", "3", "3", "5"] * 16))
    finally:
        verifier.close()
    assert metrics["accuracy"] == 0.75 and metrics["errors/acc"] == 0 and metrics["errors/slow"] == 64
