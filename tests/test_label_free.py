"""Label-free group rewards: majority vote (with ties) and Co-Reward's cross-question agreement,
through the sandboxed pool as the verifier runs them, and on bad input."""

from __future__ import annotations

import pytest

from actors.rewards import REWARD_FUNCTIONS
from actors.rewards.label_free import co_reward, majority, majority_vote


def test_majority_vote_rewards_the_majority_answer():
    assert majority_vote("3+4=", ["7", "7", "8", "7 apples", "x"]) == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert majority_vote("q", ["Paris.", "paris", "Rome"], extract="text") == [1.0, 1.0, 0.0]


def test_a_tie_for_the_majority_labels_nothing():
    assert majority(["7", "8", "7", "8", None]) is None
    assert majority_vote("3+4=", ["7", "8", "7", "8"]) == [0.0] * 4
    assert majority_vote("3+4=", ["", "no number", ""]) == [0.0] * 3  # nothing to vote on


def test_co_reward_crosses_the_labels_of_a_question_pair():
    prompts = ["3+4="] * 3 + ["4+3="] * 3
    # 3+4= votes 8 (wrongly), 4+3= votes 7: each question is rewarded by its twin's label, so
    # 3+4='s lone 7 is the one rewarded there, and nothing of 4+3= agrees with 3+4='s 8
    responses = ["8", "8", "7", "7", "7", "9"]
    assert co_reward("3+4=", responses, prompts=prompts) == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    # a pair of one (3+3) falls back to its own majority
    assert co_reward("3+3=", ["6", "6", "5"], prompts=["3+3="] * 3) == [1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="3 questions"):
        co_reward("a", ["1", "2", "3"], prompts=["a", "b", "c"])
    with pytest.raises(ValueError, match="needs `prompts`"):
        co_reward("a", ["1", "2"])


@pytest.mark.parametrize("name", ["majority_vote", "co_reward"])
def test_registered_as_group_functions_and_bad_input(name):
    fn = REWARD_FUNCTIONS.get(name)
    assert fn.reward_scope == "group"
    huge = "1" * 10_000_000  # an enormous response: one long integer, handled in linear time
    out = fn("q", ["", "\udcff", huge, huge], prompts=["q"] * 4)
    assert out == [0.0, 0.0, 1.0, 1.0]


def test_through_the_verifier_with_a_pair_column(tmp_path):
    import numpy as np
    import pyarrow as pa

    from actors import batch as B
    from actors.verifier import Verifier
    from orchestrator.config import validate_config

    cfg = validate_config({"rewards": [{"name": "co", "fn": "co_reward", "group_by": "pair_id"},
                                       {"name": "vote", "fn": "majority_vote"}],
                           "rollout": {"samples_per_prompt": 3}})
    prompts = ["3+4="] * 3 + ["4+3="] * 3
    n = len(prompts)
    ones = np.ones(n, np.int64)
    table = B.rollout_table(
        uid=[f"u{i}" for i in range(n)], prompt_id=prompts, group_id=[p + "g" for p in prompts], prompt=prompts,
        response=["8", "8", "7", "7", "7", "9"],
        prompt_ids=B.list_column(np.ones(n, np.int32), ones, pa.int32()),
        response_ids=B.list_column(np.ones(n, np.int32), ones, pa.int32()),
        behavior_logprobs=B.list_column(np.zeros(n, np.float32), ones, pa.float32()),
        policy_version=0, finish_reason=["stop"] * n, extra={"pair_id": pa.array(["3+4"] * n)})
    verifier = Verifier(cfg)
    try:
        scored, _ = verifier.score(table)
    finally:
        verifier.close()
    assert scored.column("reward.co").to_pylist() == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert scored.column("reward.vote").to_pylist() == [1.0, 1.0, 0.0, 1.0, 1.0, 0.0]
