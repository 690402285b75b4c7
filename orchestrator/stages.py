"""Stages: what a recipe runs before its RL loop (SFT, reward-model, judging and self-verification
warm-ups). A stage is an object with its own inputs (the model sources so far), cache key, borrowed
roles and resume point (its marker: a finished stage is a cache hit, so a new run after a Ctrl-C
goes on from the first unfinished stage). A recipe lists its stages (`Recipe.stages`); the driver
(orchestrator.stage_driver) runs them in order. The built-in stages live in pipelines/stages/ and are named here by import
path only, like the built-in recipes: the control plane never imports them until a run asks."""

from __future__ import annotations

from pathlib import Path

from actors.registry import LazyRegistry

STAGES = LazyRegistry("stage")
BUILT_IN = {
    "reward_models": "pipelines.stages.reward_model:RewardModels",
    "sft": "pipelines.stages.sft:SFTWarmup",
    "judge": "pipelines.stages.judge:JudgeWarmup",
    "laser": "pipelines.stages.laser:LaserWarmup",
}
for _name, _path in BUILT_IN.items():
    STAGES.register(_name)(_path)
DEFAULT = tuple(BUILT_IN)  # every recipe's stages unless it says otherwise; each runs only if enabled
POLICY_ROLES = ("generator", "verifier", "policy_learner")


class Stopped(Exception):
    """A stop was requested (SIGINT/SIGTERM) where no checkpoint can be taken."""

    def __init__(self, signame: str, message: str):
        super().__init__(message)
        self.signame = signame


def stop_if_requested(ctx, what: str, step: int) -> None:
    """Between a stage's blocks: end the run on SIGINT/SIGTERM (a stage has no checkpoint)."""
    if ctx.stop_requested:
        ctx.progress.stop()
        raise Stopped(ctx.stop_requested, f"stopped by {ctx.stop_requested} during the {what}, at step {step}; "
                      "nothing was saved; the same command starts it again (reusing an --output-dir)")


class Stage:
    """Base class: a warm-up that fine-tunes the policy (`sources.policy`) into a new model directory.
    Subclasses set the names and implement `enabled`, `cache_path` and `train`."""

    name = "stage"  # its output folder in the run directory when caching is off
    label = "stage"  # how messages name it
    marker = "stage.json"  # written last into its output: the stage finished (its resume point)
    borrows: tuple[str, ...] = POLICY_ROLES  # the pools it trains with (the recipe's, or temporary ones)
    settings: dict = {}  # config sections it owns: name -> pydantic model (orchestrator.settings)

    def enabled(self, config, recipe) -> bool:
        return True

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
