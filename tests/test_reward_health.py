"""Failing reward sources are loud: every sample failing for N steps stops the run, a high error rate
warns (rate-limited). The end-to-end stop is in test_train_integration."""

from __future__ import annotations

import pytest

from orchestrator.reward_health import RewardFailure, RewardHealth, health_info, step_counts

FNS = {"bad": "my_rewards:score", "im": "integer_match"}


def test_every_sample_failing_for_n_steps_stops_with_the_function_and_its_first_error():
    health = RewardHealth(FNS, max_failed_steps=3)
    fine = (32, 0, None)
    health.observe(1, {"bad": (32, 32, "ValueError: boom"), "im": fine}, now=0)
    health.observe(2, {"bad": (32, 32, "ValueError: later"), "im": fine}, now=1)
    with pytest.raises(RewardFailure) as e:
        health.observe(3, {"bad": (32, 32, "TypeError: other"), "im": fine}, now=2)
    msg = str(e.value)
    assert "'bad'" in msg and "'my_rewards:score'" in msg and "3 steps in a row (steps 1-3)" in msg
    assert "its first error: ValueError: boom" in msg and "verifier.max_failed_steps=0" in msg


def test_a_step_with_one_good_sample_resets_the_count():
    health = RewardHealth(FNS, max_failed_steps=2)
    health.observe(1, {"bad": (32, 32, "ValueError: boom")}, now=0)
    health.observe(2, {"bad": (32, 31, "ValueError: boom")}, now=1)  # one sample scored
    health.observe(3, {"bad": (0, 0, None)}, now=2)  # nothing labelled: neither resets nor counts
    health.observe(4, {"bad": (32, 32, "KeyError: 'x'")}, now=3)
    with pytest.raises(RewardFailure, match=r"steps 4-5\); its first error: KeyError: 'x'"):
        health.observe(5, {"bad": (32, 32, "ValueError: boom")}, now=4)


def test_zero_disables_the_stop():
    health = RewardHealth(FNS, max_failed_steps=0)
    for step in range(1, 20):
        health.observe(step, {"bad": (8, 8, "ValueError: boom")}, now=step)


def test_a_high_error_rate_warns_once_per_interval():
    health = RewardHealth(FNS, max_failed_steps=0, warn_rate=0.2, warn_every_s=60)
    assert health.observe(1, {"im": (100, 20, "x")}, now=0) == []  # 20%: not above the rate
    [warning] = health.observe(2, {"im": (100, 21, "ValueError: no digits"), "bad": (100, 0, None)}, now=1)
    assert warning.startswith("warning: reward source 'im' (function 'integer_match') failed on 21/100 samples at step 2 (21%)")
    assert "first error: ValueError: no digits" in warning and "reward_error.im" in warning
    assert health.observe(3, {"im": (100, 50, "x")}, now=30) == []  # within the interval
    assert len(health.observe(4, {"im": (100, 50, "x")}, now=61)) == 1


def test_step_counts_sum_the_pieces_verifier_info():
    pieces = [health_info({"busy_s": 1.0, "seconds/im": 0.1, "scored/im": 16, "errors/im": 0, "first_error/im": None}),
              health_info({"scored/im": 16, "errors/im": 4, "first_error/im": "ValueError: a"}),
              {"generate_s": 1.0}]  # a piece of a recipe without a verifier
    assert pieces[0] == {"scored/im": 16, "errors/im": 0, "first_error/im": None}
    assert step_counts(pieces) == {"im": (32, 4, "ValueError: a")}
