"""Verifier-labelled near misses for a judge (`judge.near_misses`, orchestrator/near_misses.py)."""

from __future__ import annotations

import asyncio

import numpy as np
import pyarrow as pa
import pytest

from orchestrator.near_misses import candidates, edits, with_near_misses


def test_edits_are_distinct_one_character_changes_that_leave_whitespace_alone() -> None:
    rng = np.random.default_rng(0)
    for text in ["012345", "1 2 3", "x = 41", "aab"]:
        out = edits(text, 5, rng)
        assert 0 < len(out) <= 5 and len(set(out)) == len(out) and text not in out
        for new in out:
            assert abs(len(new) - len(text)) <= 1
            assert [i for i, c in enumerate(new) if c.isspace()] in (
                [i for i, c in enumerate(text) if c.isspace()],  # same places, or shifted by the edit
                [i - 1 for i, c in enumerate(text) if c.isspace()] if len(new) < len(text) else None,
                [i + 1 for i, c in enumerate(text) if c.isspace()] if len(new) > len(text) else None) \
                or len(new) != len(text)
            assert set(new) <= set(text)  # no character the answer did not have
    assert edits("   ", 3, rng) == [] and edits("", 3, rng) == []
    assert edits("012345", 0, rng) == []


def test_every_edit_of_a_sorted_answer_is_one_the_sorting_verifier_rejects() -> None:
    from actors.rewards.sorting import sorted_digits

    rng = np.random.default_rng(1)
    for prompt, answer in [("503412>", "012345"), ("9911>", "1199")]:
        assert sorted_digits(prompt, answer) == 1.0
        out = edits(answer, 6, rng)
        assert out and all(sorted_digits(prompt, e) == 0.0 for e in out)


def test_candidates_edit_only_the_verifier_correct_non_empty_rows() -> None:
    table = pa.table({"prompt": ["a", "b", "c", "d"], "response": ["12", "34", "", "56"],
                      "extra": [1, 2, 3, 4], "reward.ok": pa.array([1.0, 0.0, 1.0, None], pa.float32())})
    out = candidates(table, "ok", 2, np.random.default_rng(0))
    assert set(out.column("prompt").to_pylist()) == {"a"} and out.column("extra").to_pylist() == [1] * out.num_rows
    assert out.num_rows == 2 and "12" not in out.column("response").to_pylist()
    assert candidates(table, "ok", 0, np.random.default_rng(0)) is None
    assert candidates(table, "missing", 2, np.random.default_rng(0)) is None


class _LocalVerifierPool:
    """The verifier pool's call interface over a real Verifier in this process."""

    def __init__(self, verifier):
        self.verifier, self.calls = verifier, 0

    async def call(self, method, *args):
        self.calls += 1
        table, info = getattr(self.verifier, method)(*args)

        async def ref():
            return table
        return ref(), info


class _Ctx:
    def __init__(self, pool):
        self.pools = {"verifier": pool}


def test_near_misses_are_scored_by_the_verifier_and_only_the_wrong_ones_join() -> None:
    from actors.verifier import Verifier
    from orchestrator.config import validate_config

    verifier = Verifier(validate_config({"rewards": [{"name": "sorted", "fn": "sorted_digits"}]}))
    pool = _LocalVerifierPool(verifier)
    from actors import batch as B

    prompts, responses = ["503412>", "21>", "11>"], ["012345", "21", "11"]
    ones = np.ones(3, np.int64)
    table = B.rollout_table(
        uid=["u0", "u1", "u2"], prompt_id=["p0", "p1", "p2"], prompt=prompts, response=responses,
        prompt_ids=B.list_column(np.ones(3, np.int32), ones, pa.int32()),
        response_ids=B.list_column(np.ones(3, np.int32), ones, pa.int32()),
        behavior_logprobs=B.list_column(np.zeros(3, np.float32), ones, pa.float32()),
        policy_version=0, finish_reason=["stop"] * 3)
    table = table.append_column("reward.sorted", pa.array([1.0, 0.0, 1.0], pa.float32()))
    edited = candidates(table, "sorted", 2, np.random.default_rng(0))
    assert len(set(edited.column("uid").to_pylist())) == edited.num_rows  # rows of their own
    try:
        out, near = asyncio.run(with_near_misses(_Ctx(pool), table, "sorted", 2, np.random.default_rng(0)))
    finally:
        verifier.close()
    assert pool.calls == 1 and out.column_names == ["prompt", "response", "reward.sorted"]
    assert out.slice(0, 3).to_pylist() == table.select(out.column_names).to_pylist()  # the batch's rows first
    added = out.slice(3).to_pylist()
    assert near == len(added) >= 3 and all(r["reward.sorted"] == 0.0 for r in added)
    assert {r["prompt"] for r in added} == {"503412>", "11>"}  # the right answers' prompts only
    # k = 0: the table as it was, no verifier call
    same, none = asyncio.run(with_near_misses(_Ctx(pool), table, "sorted", 0, np.random.default_rng(0)))
    assert same is table and none == 0 and pool.calls == 1


def test_near_misses_need_something_that_trains_the_judge_and_key_the_warm_up_cache() -> None:
    from orchestrator.config import ConfigError, load_config
    from pipelines.stages.judge import cache_path

    judged = ["rewards=[{name: judge, judge: true}, {name: correct, fn: integer_match, weight: 0}]",
              "warmup.enabled=false"]
    with pytest.raises(ConfigError, match=r"judge.near_misses=2 adds examples to the judge's training, and nothing "
                                          r"trains the judge"):
        load_config(None, [*judged, "judge.near_misses=2"])
    with pytest.raises(ConfigError, match=r"judge.near_misses: Input should be greater than or equal to 0"):
        load_config(None, [*judged, "judge.warmup_steps=5", "judge.near_misses=-1"])
    plain = load_config(None, [*judged, "judge.warmup_steps=5"])
    assert cache_path(plain, "s") == cache_path(load_config(None, [*judged, "judge.warmup_steps=5",
                                                                   "judge.near_misses=0"]), "s")
    assert cache_path(plain, "s") != cache_path(load_config(None, [*judged, "judge.warmup_steps=5",
                                                                   "judge.near_misses=1"]), "s")
