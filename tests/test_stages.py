"""The stage driver without Ray: which stages a recipe runs, in order, cached (a finished stage is
a hit for the next run, so a run stopped in a later stage goes on from there), and the error when
a stage needs roles the recipe cannot provide."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.data import load_prompts
from orchestrator.recipes import RECIPES, Recipe, Sources
from orchestrator.run import Run
from orchestrator.stage_driver import StageDriver
from orchestrator.stages import Stage



def enabled_names(config_name: str | None, *overrides: str) -> list[str]:
    cfg = load_config(config_name, list(overrides))
    recipe = RECIPES.get(cfg.recipe)
    return [s.name for s in recipe.stages(cfg) if s.enabled(cfg, recipe)]


def test_every_recipe_keeps_todays_warm_ups() -> None:
    assert enabled_names(None) == ["warmup"]  # GRPO: the SFT warm-up only
    assert enabled_names(None, "warmup.enabled=false") == []
    assert enabled_names("laser") == ["warmup", "laser_warmup"]
    assert enabled_names("self_judged_grpo") == ["warmup", "judge_warmup"]
    assert enabled_names("cooper") == ["reward_models", "warmup"]


class Counting(Stage):
    """A stage that writes its output and marker and counts its runs; it needs no pools."""
    borrows = ()
    label = "counting stage"
    runs: list[str] = []

    def __init__(self, name: str, fail: bool = False, accuracy: float = 0.5):
        self.name, self.marker, self.fail, self.accuracy = name, f"{name}.json", fail, accuracy

    def cache_path(self, config, sources) -> Path:
        return Path(config.warmup.cache_dir) / f"{self.name}-from-{Path(sources.policy or 'base').name}"

    async def train(self, ctx, out_dir: Path, sources) -> dict:
        Counting.runs.append(self.name)
        if self.fail:
            raise KeyboardInterrupt  # as a Ctrl-C that ends the run inside this stage
        out_dir.mkdir(parents=True)
        info = {f"{self.name}/accuracy_after": self.accuracy}
        (out_dir / self.marker).write_text(json.dumps(info))
        return info


def two_stage_run(tmp_path: Path, fail_second: bool) -> Run:
    cfg = load_config(None, [f"warmup.cache_dir={tmp_path / 'cache'}"])

    class TwoStages(RECIPES.get("grpo")):
        @classmethod
        def stages(cls, config) -> list:
            return [Counting("first"), Counting("second", fail=fail_second, accuracy=0.6)]

    run = Run(cfg, tmp_path / "run", resume=False)
    run.recipe = TwoStages()
    return run


def driven(run: Run) -> tuple:
    cfg = run.config
    return run, load_prompts(cfg.data, cfg.seed, cfg.verifier.fraction), True


def test_stages_run_in_order_and_a_new_run_goes_on_from_the_unfinished_one(tmp_path, capsys) -> None:
    Counting.runs = []
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(StageDriver(*driven(two_stage_run(tmp_path, True))).run_all(Sources()))
    assert Counting.runs == ["first", "second"]
    Counting.runs = []
    sources = Sources()
    pools, info = asyncio.run(StageDriver(*driven(two_stage_run(tmp_path, False))).run_all(sources))
    assert Counting.runs == ["second"]  # the first stage is a cache hit
    assert "counting stage: using cached model" in capsys.readouterr().out
    assert sources.policy == str(tmp_path / "cache" / "second-from-first-from-base")  # each feeds the next
    # the warm start is the last stage's accuracy, a cache hit or not
    assert info == {"first/accuracy_after": 0.5, "second/accuracy_after": 0.6, "warm_start/accuracy": 0.6,
                    "warm_start/stage": "counting stage", "warm_start/skipped": False} and pools == {}


def test_a_stage_that_needs_roles_nobody_declares_says_which(tmp_path) -> None:
    class NoPolicy(Recipe):
        name = "no_policy"

        @classmethod
        def roles(cls, config, sources):
            return {}

        @classmethod
        def stage_roles(cls, config, sources):
            return {}

    run = two_stage_run(tmp_path, False)
    run.recipe = NoPolicy()
    stage = RECIPES.get("grpo").stages(run.config)[1]  # the SFT warm-up borrows the policy roles
    with pytest.raises(ValueError, match=r"recipe 'grpo': a stage needs the roles \['generator', 'verifier', "
                                         r"'policy_learner'\], which neither its roles nor its stage_roles"):
        asyncio.run(StageDriver(run, None, True)._borrow(stage.borrows, Sources()))


def test_a_stop_cancels_a_stage_where_it_waits(tmp_path) -> None:
    """SIGTERM (`ray job stop`) or Ctrl-C during a stage: the stage is cancelled at once, wherever it
    waits (here a 60 s call), not at its next block; Stopped names the stage and its step."""
    import time

    from orchestrator.stages import Stopped, until_stopped

    run = Run(load_config(None, [f"warmup.cache_dir={tmp_path}"]), tmp_path / "run", resume=False)
    cancelled = []

    async def stage():
        run.stage_step = (40, 3000)
        try:
            await asyncio.sleep(60)  # a block of learner steps
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def main():
        asyncio.get_running_loop().call_later(0.2, run.request_stop, "SIGTERM")
        return await until_stopped(run, stage(), "SFT warm-up")

    started = time.monotonic()
    with pytest.raises(Stopped) as e:
        asyncio.run(main())
    assert time.monotonic() - started < 5 and cancelled == [True]
    assert e.value.signame == "SIGTERM" and "during the SFT warm-up, at step 40 of 3000" in str(e.value)

    async def done_first():  # a stage that finishes is not disturbed
        return await until_stopped(run, asyncio.sleep(0, result={"ok": 1}), "stage", message="unused")

    run._pending_stop, run._stop_event = None, None
    assert asyncio.run(done_first()) == {"ok": 1}


def test_a_stage_that_does_not_hand_its_model_on_leaves_no_pool_holding_it(tmp_path) -> None:
    """A stage that trained the borrowed policy pools but does not hand its model on (the judging
    warm-up with judge.separate) has them restarted from the sources; one that hands it on keeps them."""

    class Pool:
        def __init__(self):
            self.stopped = False

        def shutdown(self):
            self.stopped = True

    class Trains(Counting):
        borrows = ("generator", "verifier", "policy_learner")

        def __init__(self, name: str, hands: bool):
            super().__init__(name)
            self.hands = hands

        def hands_on(self, config) -> bool:
            return self.hands

    for hands in (True, False):
        run = two_stage_run(tmp_path / str(hands), False)

        class OneStage(RECIPES.get("grpo")):
            @classmethod
            def stages(cls, config) -> list:
                return [Trains("judging", hands)]

        run.recipe = OneStage()
        driver = StageDriver(*driven(run))
        pools = {role: Pool() for role in ("generator", "verifier", "policy_learner")}
        driver.pools = dict(pools)
        kept, _ = asyncio.run(driver.run_all(Sources()))
        held = {"generator", "policy_learner"}
        assert {r for r, p in pools.items() if p.stopped} == (set() if hands else held)
        assert set(kept) == ({"generator", "verifier", "policy_learner"} if hands else {"verifier"})
