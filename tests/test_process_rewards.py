"""Process rewards: responses split into steps, one reward per step at the step's last token,
shaped by the aggregation stage (clip / delta) into `token_rewards`."""

from __future__ import annotations

import textwrap

import numpy as np
import pyarrow as pa
import pytest

from actors import batch as B
from actors.modeling import char_tokenizer
from actors.rewards.aggregate import Aggregator
from actors.rewards.process import split_steps, step_pattern, token_positions
from orchestrator.config import ConfigError, load_config, validate_config
from test_verifier import score  # a throwaway Verifier scores one table


def test_split_steps_keeps_the_delimiter_and_skips_empty_pieces():
    assert split_steps("a=1\nb=2\n\nc", "\n") == [("a=1\n", 4), ("b=2\n", 8), ("c", 10)]
    assert split_steps("a=1\n", "\n") == [("a=1\n", 4)]
    assert split_steps("", "\n") == []
    assert split_steps("x;;y;", ";;") == [("x;;", 3), ("y;", 5)]
    # cumulative decoded lengths of the tokens -> the token that completes each step
    assert token_positions(np.array([1, 2, 4, 5]), [2, 5]).tolist() == [1, 3]


def test_step_pattern_scores_each_step():
    assert step_pattern("q", "r", ["1+1=2\n", "so\n", "=3"], pattern="=") == [1.0, 0.0, 1.0]
    assert step_pattern("q", "r", ["a", "b"]) == [1.0, 1.0]


def rollouts(responses: list[str]) -> pa.Table:
    tok = char_tokenizer()
    ids = [tok(r, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for r in responses]
    n = len(responses)
    lengths = np.array([len(i) for i in ids], dtype=np.int64)
    return B.rollout_table(
        uid=[f"u{i}" for i in range(n)], prompt_id=[f"p{i // 2}" for i in range(n)], prompt=["1+1="] * n,
        response=responses,
        prompt_ids=B.list_column(np.ones(n, np.int32), np.ones(n, np.int64), pa.int32()),
        response_ids=B.list_column(np.concatenate(ids).astype(np.int32), lengths, pa.int32()),
        behavior_logprobs=B.list_column(np.zeros(int(lengths.sum()), np.float32), lengths, pa.float32()),
        policy_version=0, finish_reason=["stop"] * n, extra={"answer": pa.array(["2"] * n)},
    )


def process_config(**process):
    rewards = [{"name": "correct", "fn": "integer_match"},
               {"name": "steps", "fn": "step_pattern", "step_delimiter": " ", "weight": 0.5}]
    return validate_config({"rewards": rewards, "rollout": {"samples_per_prompt": 2},
                            "aggregate": {"process": {"steps": process}} if process else {}})


def test_verifier_places_step_rewards_on_the_last_token_of_each_step():
    cfg = process_config()
    assert [r.name for r in cfg.fn_rewards()] == ["correct"] and [r.name for r in cfg.process_rewards()] == ["steps"]
    scored, info = score(cfg, rollouts(["2 a b", "2", "", "3 x"]))
    assert "reward.steps" not in scored.schema.names  # no scalar column for a process source
    tr = scored.column("token_rewards.steps").to_pylist()
    # "2 a b" + eos: steps "2 " (ends at token 1), "a " (token 3), "b" (token 4); eos carries nothing
    assert tr[0] == [None, 1.0, None, 1.0, 1.0, None]
    assert tr[1] == [1.0, None]
    assert tr[2] is None and "empty" in scored.column("reward_error.steps")[2].as_py()
    assert tr[3] == [None, 1.0, 1.0, None]
    assert info["errors/steps"] == 1
    assert scored.column("reward.correct").to_pylist() == [1.0, 1.0, 0.0, 0.0]

    # aggregation: the scalar reward is the outcome only; token_rewards holds weight x step rewards
    out, metrics = Aggregator(cfg.aggregate_spec()).apply(scored)
    assert out.column("reward").to_pylist() == [1.0, 1.0, 0.0, 0.0]
    assert out.column("token_rewards").to_pylist()[0] == [0.0, 0.5, 0.0, 0.5, 0.5, 0.0]
    assert metrics["token_rewards/steps/steps_mean"] == pytest.approx((3 + 1 + 2) / 3)


def test_clip_and_delta_bound_what_more_steps_earn():
    """The naive reward grows with the number of steps; clipped at eta=1 or telescoped (delta), a
    response with more steps earns no more than one with fewer."""
    table = rollouts(["2 a b c d", "2"])
    returns = {}
    for name, process in (("naive", {}), ("clip", {"transform": "clip", "eta": 1.0}), ("delta", {"transform": "delta"})):
        cfg = process_config(**process)
        out, _ = Aggregator(cfg.aggregate_spec()).apply(score(cfg, table)[0])
        returns[name] = [sum(r) for r in out.column("token_rewards").to_pylist()]
    assert returns["naive"][0] > returns["naive"][1]
    assert returns["clip"][0] <= returns["clip"][1]
    assert returns["delta"][0] == pytest.approx(returns["delta"][1])


def test_every_token_a_step_with_the_empty_delimiter():
    cfg = validate_config({"rewards": [{"name": "correct", "fn": "integer_match"},
                                       {"name": "len", "fn": "step_pattern", "step_delimiter": ""}],
                           "rollout": {"samples_per_prompt": 2}})
    scored, _ = score(cfg, rollouts(["2 a", "3"]))
    assert scored.column("token_rewards.len").to_pylist() == [[1.0, 0.0, 1.0, None], [1.0, None]]


PROCESS_MODULE = """
from actors.rewards import process_reward

@process_reward
def wrong_count(prompt, response, steps, **_):
    return [1.0]  # one value, whatever the number of steps

@process_reward
def raises(prompt, response, steps, **_):
    raise RuntimeError("no verdict for " + response)
"""


def test_a_process_function_that_misbehaves_gives_a_null_row_and_a_reason(tmp_path, monkeypatch):
    (tmp_path / "coevo_process_user.py").write_text(textwrap.dedent(PROCESS_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = validate_config({"rewards": [{"name": "correct", "fn": "integer_match"},
                                       {"name": "count", "fn": "coevo_process_user:wrong_count", "step_delimiter": " "},
                                       {"name": "boom", "fn": "coevo_process_user:raises", "step_delimiter": " "}],
                           "rollout": {"samples_per_prompt": 2}})
    scored, info = score(cfg, rollouts(["2 a b", "2"]))
    count = scored.column("reward_error.count").to_pylist()
    assert "returned 1 values for 3 steps" in count[0] and count[1] is None
    assert scored.column("token_rewards.count").to_pylist() == [None, [1.0, None]]
    assert all("RuntimeError: no verdict" in e for e in scored.column("reward_error.boom").to_pylist())
    assert info["errors/boom"] == 2


def test_process_config_errors_name_the_source():
    with pytest.raises(ConfigError, match=r"rewards\[correct\]: step_delimiter applies to process"):
        load_config(None, ["rewards=[{name: correct, fn: integer_match, step_delimiter: ';'}]"])
    with pytest.raises(ConfigError, match="every verifier is a process reward"):
        load_config(None, ["rewards=[{name: s, fn: step_pattern}]"])
    with pytest.raises(ConfigError, match=r"rewards\[s\]: a process reward is not normalised"):
        load_config(None, ["rewards=[{name: c, fn: integer_match}, {name: s, fn: step_pattern, normalize: group}]"])
