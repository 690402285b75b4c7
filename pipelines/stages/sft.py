"""Supervised warm-up on the task's reference answers until a held-out accuracy target, cached so
later runs with the same model, data and warm-up settings start from it at once."""

from __future__ import annotations

import json
import time
from pathlib import Path

from orchestrator.data import PromptSampler
from orchestrator.evaluation import greedy_accuracy
from orchestrator.stage_cache import cache_key, read_marker, save_stage
from orchestrator.stages import Stage, StageProgress, stop_if_requested

MARKER = "warmup.json"


def cache_path(config) -> Path:
    return Path(config.warmup.cache_dir).expanduser() / cache_key(config)


def cached(config) -> tuple[Path | None, dict]:
    """The cached warm model and its info, if there is one (and caching is on)."""
    path = cache_path(config)
    info = read_marker(path, MARKER) if config.warmup.cache else None
    return (path, info) if info is not None else (None, {})


class SFTWarmup(Stage):
    name, label, marker = "warmup", "warm-up", MARKER

    def enabled(self, config, recipe) -> bool:
        return recipe.needs_warm_policy(config) and config.warmup.enabled

    def cache_path(self, config, sources) -> Path:
        return cache_path(config)  # the first stage: it starts from config.model

    def cached_message(self, config, path: Path, info: dict) -> str:
        if info.get("warmup/skipped"):
            return (f"warm-up: skipped (measured before, {path}): the model already has held-out greedy accuracy "
                    f"{info['warmup/accuracy']:.3f} >= warmup.target_accuracy {config.warmup.target_accuracy}")
        return f"warm-up: using cached model {path} (accuracy {info['warmup/accuracy']:.3f})"

    def policy_accuracy(self, info: dict) -> float | None:
        return info.get("warmup/accuracy")

    def apply(self, config, sources, out_dir: Path | None, info: dict) -> dict:
        if info.get("warmup/skipped"):  # RL starts from the model as given
            sources.policy = str(Path(config.model.path).expanduser().resolve()) if config.model.path else None
            return info
        return super().apply(config, sources, out_dir, info)

    async def train(self, ctx, out_dir: Path, sources) -> dict:
        return await warm_up(ctx, out_dir)


def warmup_prompts(ctx):
    """The warm-up's prompt splits: warmup.data's task where it is set, else the run's."""
    from orchestrator.data import load_prompts

    cfg = ctx.config
    return ctx.prompts if cfg.warmup.data is None else load_prompts(cfg.warmup.data, cfg.seed)


def warmup_columns(config, table) -> list[str]:
    """Prompts and answers only (pairs, data.analogs, must not change the warm-up's batches); with an
    environment, also the columns its episodes read (kv_store's `store`, ...)."""
    if config.env.name is None:  # with the worked `solution` where the data has one: the SFT target
        return [c for c in ("prompt", "answer", "solution") if c in table.schema.names]
    return [c for c in table.schema.names if c not in ("pair_id", "labelled")]


def _model_text(config) -> str:
    return f"model.path={config.model.path}" if config.model.path else "the freshly built tiny model"


async def warm_up(ctx, out_dir: Path) -> dict:
    """Measure the start; if it is below the target, SFT steps in blocks of `eval_every` until
    greedy held-out accuracy reaches it. The warm model is saved to `out_dir` (the cache, or the run
    directory with warmup.cache=false); a start already at the target is not trained (only its
    measurement is kept, so the next run skips the stage too)."""
    from orchestrator.channels import Channel

    cfg = ctx.config.warmup
    learner = ctx.pools["policy_learner"]
    channel = Channel("policy", learner, [ctx.pools["generator"]])
    started = time.perf_counter()
    data = warmup_prompts(ctx)  # warmup.data's task where it is set, else the run's
    own = None if cfg.data is None else data.eval
    # the generators hold the model as given: its greedy accuracy decides whether it is trained at all
    before = (await greedy_accuracy(ctx, own))["eval/accuracy"]
    model = _model_text(ctx.config)
    if before >= cfg.target_accuracy:
        ctx.progress.print(f"warm-up (SFT): skipped: {model} has held-out greedy accuracy {before:.3f} >= "
                           f"warmup.target_accuracy {cfg.target_accuracy}; RL starts from it as given")
        info = {"warmup/steps": 0, "warmup/accuracy": before, "warmup/accuracy_before": before,
                "warmup/loss": None, "warmup/time_s": time.perf_counter() - started, "warmup/reached_target": True,
                "warmup/skipped": True}
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / MARKER).write_text(json.dumps(info))
        return info
    if ctx.config.model.path:  # the user's own model is trained before RL: say so, and how not to
        ctx.progress.print(f"warm-up (SFT): {model} has held-out greedy accuracy {before:.3f} < "
                           f"warmup.target_accuracy {cfg.target_accuracy}: fine-tuning it on the task's reference "
                           f"answers before RL (warmup.enabled=false starts RL from it as given)")
    progress = StageProgress(
        ctx, "warm-up (SFT)", cfg.max_steps, early_stop=True,
        budget=f"{model} at held-out greedy accuracy {before:.3f}: SFT on the reference answers until "
               f"{cfg.target_accuracy} (warmup.target_accuracy), checked every {cfg.eval_every} steps, at most "
               f"{cfg.max_steps} steps of {cfg.batch_size} prompts; cached, so later runs with the same model, data "
               "and warm-up settings skip it")
    columns = warmup_columns(ctx.config, data.train)
    sampler = PromptSampler(data.train.select(columns), seed=ctx.config.seed + 1)
    steps, accuracy, loss = 0, before, float("nan")
    held_out = data.eval.select([c for c in columns if c in data.eval.schema.names])
    while steps < cfg.max_steps:
        stop_if_requested(ctx, "SFT warm-up", steps)
        block = min(cfg.eval_every, cfg.max_steps - steps)
        batches = [sampler.next(min(cfg.batch_size, ctx.prompts.train.num_rows)) for _ in range(block)]
        loss = await learner.call("sft_steps", batches, cfg.lr, table=False)
        steps += block
        # The learner's teacher-forced check (exact answers, a lower bound of greedy accuracy) is
        # a forward pass; the real greedy evaluation runs only once it reaches the target.
        exact = await learner.call("answer_accuracy", held_out, table=False)
        accuracy = exact
        if exact >= cfg.target_accuracy or steps >= cfg.max_steps:
            await channel.publish(0)
            accuracy = (await greedy_accuracy(ctx, None if cfg.data is None else data.eval))["eval/accuracy"]
        kind = "greedy acc" if accuracy is not exact else "exact answers"
        progress.update(steps, f"loss {loss:.3f}  {kind} {accuracy:.3f} (target {cfg.target_accuracy})")
        if accuracy >= cfg.target_accuracy:
            break
    progress.done()
    await learner.call("end_warmup", table=False)
    info = {"warmup/steps": steps, "warmup/accuracy": accuracy, "warmup/accuracy_before": before, "warmup/loss": loss,
            "warmup/time_s": time.perf_counter() - started, "warmup/reached_target": accuracy >= cfg.target_accuracy}
    if cfg.data is not None:  # warmed up on another task: the run's own task, measured once
        info["warmup/data_accuracy"] = accuracy
        info["warmup/accuracy"] = (await greedy_accuracy(ctx))["eval/accuracy"]
        ctx.progress.print(f"warm-up: {accuracy:.3f} on its own task (warmup.data), {info['warmup/accuracy']:.3f} on "
                           "the run's task")
    if not info["warmup/reached_target"]:
        ctx.progress.print(f"[yellow]warning:[/] warm-up stopped at warmup.max_steps={cfg.max_steps} with "
                           f"accuracy {accuracy:.3f} < target {cfg.target_accuracy}; RL starts from there")
    return await save_stage(learner, out_dir, MARKER, info)
