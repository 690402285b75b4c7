"""Stages: what a recipe runs before its RL loop (SFT, reward-model, judging and self-verification
warm-ups). A stage is an object with its own inputs (the model sources so far), cache key, borrowed
roles and resume point (its marker: a finished stage is a cache hit, so a new run after a Ctrl-C
goes on from the first unfinished stage). A recipe lists its stages (`Recipe.stages`); the driver
(orchestrator.stage_driver) runs them in order. The built-in stages live in pipelines/stages/ and are named here by import
path only, like the built-in recipes: the control plane never imports them until a run asks."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from actors.registry import LazyRegistry
from orchestrator.progress import estimate

STAGES = LazyRegistry("stage")
BUILT_IN = {
    "reward_models": "pipelines.stages.reward_model:RewardModels",
    "sft": "pipelines.stages.sft:SFTWarmup",
    "judge": "pipelines.stages.judge:JudgeWarmup",
    "laser": "pipelines.stages.laser:LaserWarmup",
}
STAGES.register_paths(BUILT_IN)
DEFAULT = tuple(BUILT_IN)  # every recipe's stages unless it says otherwise; each runs only if enabled
POLICY_ROLES = ("generator", "verifier", "policy_learner")


class Stopped(Exception):
    """A stop was requested (SIGINT/SIGTERM) where no checkpoint can be taken."""

    def __init__(self, signame: str, message: str):
        super().__init__(message)
        self.signame = signame


def stopped_in_stage(signame: str, what: str, where: str = "") -> Stopped:
    return Stopped(signame, f"stopped by {signame} during the {what}{where}: the warm-up stages that finished "
                            "before it are cached, this one starts over; the same command goes on from there "
                            "(reusing an --output-dir)")


def stop_if_requested(ctx, what: str, step: int) -> None:
    """Between a stage's blocks: end the run on SIGINT/SIGTERM (a stage has no checkpoint)."""
    if ctx.stop_requested:
        ctx.progress.stop()
        raise stopped_in_stage(ctx.stop_requested, what, f", at step {step}")


async def until_stopped(run, work, what: str, message: str | None = None):
    """Await `work` (a stage) unless a stop is requested first (SIGINT, or SIGTERM from `ray job
    stop`): then it is cancelled at once, wherever it waits (a block of learner steps, sampling, a
    nested run), and Stopped is raised, so a stage never holds a stop for more than a moment."""
    task = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(run.stopping().wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this wait itself cancelled (an outer stage's stop): the work goes with it
        task.cancel()
        raise
    finally:
        stop.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.wait({task}, timeout=5.0)  # let it unwind (its Ray calls are only awaited, never blocked on)
    run.progress.stop()
    if message is not None:
        raise Stopped(run._pending_stop, f"stopped by {run._pending_stop} during the {what}: {message}")
    where = f", at step {run.stage_step[0]} of {run.stage_step[1]}" if run.stage_step else ""
    raise stopped_in_stage(run._pending_stop, what, where)


class StageProgress:
    """A stage's budget, said when it starts, and its progress with an estimate of what is left:
    "about" for a fixed number of steps, the latest it ends for a stage that ends early at its
    target (orchestrator.progress.estimate). The run's progress bar counts the steps; each update
    is also a line in logs."""

    def __init__(self, ctx, title: str, total: int, budget: str, early_stop: bool = False):
        self.ctx, self.title, self.total, self.early_stop = ctx, title, total, early_stop
        self.started = time.perf_counter()
        ctx.progress.print(f"{title}: {budget}")
        ctx.progress.start(title, total=total)
        self._at(0)

    def _at(self, step: int) -> None:
        run = getattr(self.ctx, "run", None)
        if run is not None:
            run.stage_step = (step, self.total)

    def update(self, step: int, info: str) -> None:
        self._at(step)
        left = estimate(time.perf_counter() - self.started, step, self.total, self.early_stop)
        self.ctx.progress.update(step, f"{info}  [{left}]", force_line=True)

    def done(self) -> float:
        self.ctx.progress.stop()
        run = getattr(self.ctx, "run", None)
        if run is not None:
            run.stage_step = None
        return time.perf_counter() - self.started


class Stage:
    """Base class: a warm-up that fine-tunes the policy (`sources.policy`) into a new model directory.
    Subclasses set the names and implement `enabled`, `cache_path` and `train`."""

    name = "stage"  # its output folder in the run directory when caching is off
    label = "stage"  # how messages name it
    marker = "stage.json"  # written last into its output: the stage finished (its resume point)
    borrows: tuple[str, ...] = POLICY_ROLES  # the pools it trains with (the recipe's, or temporary ones)
    settings: dict = {}  # config sections it owns: name -> pydantic model (orchestrator.settings)
    # the reward kinds (orchestrator.config.RewardSpec.kind) it serves: its sections join a config only
    # where a reward source of one of them is (a config holds the sections of the stages it can run);
    # () for always. A recipe that reads such a section without that reward lists it in its own settings
    rewards: tuple[str, ...] = ()

    def enabled(self, config, recipe) -> bool:
        return True

    def borrowed(self, config) -> tuple[str, ...]:
        """The pools it trains with for this config (default: `borrows`)."""
        return self.borrows

    def cache_path(self, config, sources) -> Path | None:
        """Where its output is cached: a hash of everything that changes it (None: nothing to train)."""
        raise NotImplementedError

    def caching(self, config) -> bool:
        return config.warmup.cache

    def output_dir(self, config, cache_path: Path, run_dir: Path) -> Path:
        return cache_path if self.caching(config) else run_dir / self.name

    async def train(self, ctx, out_dir: Path, sources) -> dict:
        """Run the stage with the borrowed pools in `ctx`; save to `out_dir` with its marker; the info."""
        raise NotImplementedError

    def hands_on(self, config) -> bool:
        """Whether the pools it trained go on into the run holding its model (False: they hold weights
        the run does not start from, and the driver restarts them from the sources)."""
        return True

    def policy_accuracy(self, info: dict) -> float | None:
        """Held-out greedy accuracy of the policy this stage hands on (None: it does not train the
        policy): the warm start the RL loop begins from when this is the last such stage."""
        return info.get(f"{self.name}/accuracy_after")

    def apply(self, config, sources, out_dir: Path | None, info: dict) -> dict:
        """Point the sources at the stage's output; return the info that goes into the run's summary."""
        sources.policy = str(out_dir)
        return info

    def cached_message(self, config, path: Path, info: dict) -> str:
        after = {k.split("/", 1)[1]: v for k, v in info.items() if v is not None and k.split("/", 1)[1] in
                 ("accuracy_after", "auroc_after", "self_reward_auroc_after", "best_of_n_gain_after")}
        return (f"{self.label}: using cached model {path} ("
                + ", ".join(f"{k} {v:.3f}" for k, v in sorted(after.items())) + ")")
