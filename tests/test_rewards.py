"""Reward functions: built-ins and the sandboxed runner for user code."""

from __future__ import annotations

import textwrap
import time

import numpy as np
import pyarrow as pa
import pytest

from actors.rewards import REWARD_FUNCTIONS
from actors.rewards.builtins import exact_match, integer_match, math_equivalence, normalized_match
from actors.sandbox import RewardPool
from actors import batch as B


# ---- built-ins ---------------------------------------------------------------------------------
def test_exact_match():
    assert exact_match("q", " 42\n", answer="42") == 1.0
    assert exact_match("q", "42.", answer="42") == 0.0
    assert exact_match("q", "Paris", answer="paris") == 0.0


def test_normalized_match():
    assert normalized_match("q", "The  Eiffel Tower!", answer="eiffel tower") == 1.0
    assert normalized_match("q", "an apple", answer="Apple.") == 1.0
    assert normalized_match("q", "eiffel towers", answer="eiffel tower") == 0.0


def test_integer_match():
    assert integer_match("1+2=", "3", answer="3") == 1.0
    assert integer_match("1+2=", "3<eos>junk 4", answer="3") == 1.0  # first integer counts
    assert integer_match("5-7=", "-2", answer="-2") == 1.0
    assert integer_match("5-7=", "2", answer="-2") == 0.0
    assert integer_match("1+2=", "no number", answer="3") == 0.0
    assert integer_match("1+2=", "4 3", answer=3) == 0.0


def test_math_verify():
    assert math_equivalence("q", "0.5", answer="\\frac{1}{2}") == 1.0
    assert math_equivalence("q", "The answer is $\\frac{1}{2}$", answer="0.5") == 1.0
    assert math_equivalence("q", "0.6", answer="\\frac{1}{2}") == 0.0
    assert math_equivalence("q", "", answer="\\frac{1}{2}") == 0.0


def test_builtins_registered():
    for name in ("exact_match", "normalized_match", "integer_match", "math_verify"):
        assert name in REWARD_FUNCTIONS.names()
    with pytest.raises(KeyError, match="integer_match"):
        REWARD_FUNCTIONS.get("no_such_reward")


# ---- sandbox -----------------------------------------------------------------------------------
USER_MODULE = """
import sys, time

def ok(prompt, response, answer, **_):
    return float(response.strip() == answer)

def boom(prompt, response, answer, **_):
    if response == "bad":
        raise ZeroDivisionError("user code broke on purpose")
    return 1.0

def hang(prompt, response, answer, **_):
    if response == "slow":
        time.sleep(60)
    return 0.25

def nan(prompt, response, answer, **_):
    return float("nan")

def text(prompt, response, answer, **_):
    return "one"

def numpy_scalar(prompt, response, answer, **_):
    import numpy as np
    return np.float32(0.5) if response == "f" else np.int64(1)

def inf(prompt, response, answer, **_):
    return float("-inf")

def flag(prompt, response, answer, **_):
    return response == answer  # a bool is accepted as 0.0 / 1.0

def chatty(prompt, response, answer, **_):
    # Text that looks like a frame header on stdout, from Python and from the C level.
    print("\\x05\\x00\\x00\\x00hello" * 50)
    sys.stdout.flush()
    import os
    os.write(1, b"\\x10\\x00\\x00\\x00raw bytes on fd 1\\n")
    return 0.5 if response == answer else 0.0

def dies(prompt, response, answer, **_):
    if response == "die":
        import os
        os._exit(3)  # takes the reward process down, not just this call
    return 1.0

def weighted(prompt, response, answer, **_):
    if response == "bad":
        raise ValueError("cannot score")
    return 1.0
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    name = f"coevo_user_rewards_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def item(source, response, answer="x", **extra):
    return (source, {"prompt": "p", "response": response, "answer": answer, **extra})


def test_sandbox_scores_user_function(user_module):
    sb = RewardPool({"ok": f"{user_module}:ok", "flag": f"{user_module}:flag"})
    try:
        out = sb.score([item("ok", "x"), item("ok", "y"), item("flag", "x"), item("flag", "z")],
                       {"ok": 5.0, "flag": 5.0})
    finally:
        sb.close()
    assert out == [(1.0, None), (0.0, None), (1.0, None), (0.0, None)]


def test_sandbox_process_death_marks_sample_and_restarts(user_module):
    sb = RewardPool({"d": f"{user_module}:dies"})
    try:
        out = sb.score([item("d", "a"), item("d", "die"), item("d", "b")], {"d": 5.0})
    finally:
        sb.close()
    assert out[0] == (1.0, None) and out[2] == (1.0, None)
    assert out[1][0] is None and "worker died (exit code 3)" in out[1][1]
    assert sb.stats()["restarts"] == 1


def test_sandbox_exception_becomes_error(user_module):
    sb = RewardPool({"boom": f"{user_module}:boom"})
    try:
        out = sb.score([item("boom", "good"), item("boom", "bad"), item("boom", "good")], {"boom": 5.0})
    finally:
        sb.close()
    assert out[0] == (1.0, None) and out[2] == (1.0, None)
    value, err = out[1]
    assert value is None
    assert "ZeroDivisionError" in err and "user code broke on purpose" in err
    assert sb.stats()["restarts"] == 0  # an exception does not cost a process restart


def test_sandbox_timeout_then_continues(user_module):
    sb = RewardPool({"hang": f"{user_module}:hang", "ok": f"{user_module}:ok"})
    items = [item("hang", "fast"), item("hang", "slow"), item("hang", "fast"),
             item("ok", "x"), item("ok", "y")]
    try:
        start = time.monotonic()
        out = sb.score(items, {"hang": 0.5, "ok": 5.0})
        elapsed = time.monotonic() - start
    finally:
        sb.close()
    assert out[0] == (0.25, None)
    assert out[1][0] is None and out[1][1].startswith("timed out") and "0.5s" in out[1][1]
    assert out[2:] == [(0.25, None), (1.0, None), (0.0, None)]
    assert sb.stats()["restarts"] == 1
    assert elapsed < 30  # nowhere near the 60 s sleep


def test_sandbox_accepts_numpy_scalars(user_module):
    sb = RewardPool({"np": f"{user_module}:numpy_scalar"})
    try:
        out = sb.score([item("np", "f"), item("np", "i")], {"np": 5.0})
    finally:
        sb.close()
    assert out == [(0.5, None), (1.0, None)]
    assert all(type(v) is float for v, _ in out)


@pytest.mark.parametrize("fn, shown", [("nan", "nan"), ("inf", "-inf"), ("text", "'one'")])
def test_sandbox_non_number_is_error(user_module, fn, shown):
    sb = RewardPool({fn: f"{user_module}:{fn}"})
    try:
        out = sb.score([item(fn, "x"), item(fn, "y")], {fn: 5.0})
    finally:
        sb.close()
    for value, err in out:
        assert value is None
        assert shown in err and "finite number" in err


def test_sandbox_stdout_does_not_corrupt(user_module):
    sb = RewardPool({"chatty": f"{user_module}:chatty"})
    try:
        out = sb.score([item("chatty", "x"), item("chatty", "y"), item("chatty", "x")], {"chatty": 5.0})
        # the same process keeps serving later requests correctly
        out2 = sb.score([item("chatty", "y"), item("chatty", "x")], {"chatty": 5.0})
    finally:
        sb.close()
    assert out == [(0.5, None), (0.0, None), (0.5, None)]
    assert out2 == [(0.0, None), (0.5, None)]
    assert sb.stats()["restarts"] == 0


def test_sandbox_bad_import_path_fails_to_start(user_module):
    sb = RewardPool({"x": f"{user_module}:does_not_exist"})
    with pytest.raises(RuntimeError, match="failed to start"):
        sb.score([item("x", "x")], {"x": 5.0})
    sb.close()
