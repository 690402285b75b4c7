"""What a `coevo run` command says it did (orchestrator.session): its steps, wall time and phases,
restarts and the checkpoint a --resume started from; and the stage progress's estimates."""

from __future__ import annotations

import time

from orchestrator.progress import estimate
from orchestrator.session import PHASES, Session, timing_text


def _summary(session: Session, last_step: int) -> dict:
    return session.summary(last_step)


def test_a_plain_run_names_its_phases_and_only_the_warm_up_that_ran() -> None:
    s = Session()
    s.add("ray_start", 3.0)
    s.add("actors", 4.0)
    s.add("train", 20.0)
    s.add("finish", 1.0)
    text = timing_text(_summary(s, 150))
    assert text.startswith("150 steps in ") and "(Ray 3.0s, actors 4.0s, training 20.0s, saving 1.0s)" in text
    assert "warm-up" not in text  # warmup.enabled=false: no stage ran, none is named
    s.stage("warm-up", 22.5, cached=False)
    assert "(Ray 3.0s, warm-up 22.5s, actors 4.0s" in timing_text(_summary(s, 150))
    cached = Session()
    cached.stage("warm-up", 0.2, cached=True)
    assert "warm-up 0.2s (cached)" in timing_text(_summary(cached, 1))


def test_a_resumed_session_counts_its_own_steps() -> None:
    s = Session(resumed_from="step_100", first_step=101)
    s.add("train", 5.0)
    summary = _summary(s, 150)
    assert summary["steps_this_session"] == 50 and summary["first_step"] == 101
    assert timing_text(summary).startswith("steps 101-150, resumed from step_100, in ")
    nothing = _summary(Session(resumed_from="final", first_step=151), 150)  # stopped again at once
    assert timing_text(nothing).startswith("no step, resumed from final at step 150, in ")


def test_restarts_are_counted_and_their_time_is_in_the_wall_time() -> None:
    s = Session()
    s.restarted(at_step=6, from_step=4, checkpoint="step_4", error="role 'policy_learner' died\ndetail")
    s.add("restart", 2.0)
    time.sleep(0.01)
    summary = _summary(s, 9)
    assert summary["restarts"] == 1 and summary["steps_redone"] == 2
    assert summary["restart_history"] == [{"at_step": 6, "from_step": 4, "checkpoint": "step_4",
                                           "error": "role 'policy_learner' died"}]
    assert summary["time/wall_s"] >= 0.01 and summary["time/total_s"] == summary["time/wall_s"]
    assert "9 steps in " in timing_text(summary) and ", after 1 learner restart (2 steps redone)" in timing_text(summary)
    assert "restarting 2.0s" in timing_text(summary)
    assert set(PHASES) <= {k[5:-2] for k in summary if k.startswith("time/") and k.endswith("_s")}


def test_estimates_say_about_or_the_latest() -> None:
    assert estimate(10.0, 0, 100, at_most=False) == "10 s so far"
    assert estimate(10.0, 10, 100, at_most=False) == "10 s so far, about 1 min 30 s left"
    assert estimate(60.0, 100, 3000, at_most=True) == "1 min so far, 0.6 s/step; ends at its target, at the latest in 29 min"
    assert estimate(600.0, 10, 3000, at_most=True) == "10 min so far, 60 s/step; ends at its target, at the latest in 49.8 h"


def test_the_loop_estimates_from_the_recipes_own_step_budget() -> None:
    """self_rewarding ends after its iterations (3 x 2 epochs x 4 batches of 64 of 256 prompts = 24
    steps), not at train.max_steps=1000: its estimate must not say hours."""
    from orchestrator.config import load_config
    from orchestrator.recipes import RECIPES

    cfg = load_config("self_rewarding")
    assert RECIPES.get(cfg.recipe)().step_budget(cfg) == (24, True)
    default = load_config(None)
    assert RECIPES.get(default.recipe)().step_budget(default) == (150, True)  # stops at 0.8 or step 150
    assert RECIPES.get("grpo")().step_budget(load_config(None, ["train.stop_at_accuracy=null"]))[1] is False
