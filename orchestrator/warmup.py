"""Supervised warm-up on the task's reference answers until a held-out accuracy target, cached so
later runs with the same model, data and warm-up settings start from it at once."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from orchestrator.data import PromptSampler
from orchestrator.evaluation import greedy_accuracy


class Stopped(Exception):
    """A stop was requested (SIGINT/SIGTERM) where no checkpoint can be taken."""

    def __init__(self, signame: str, message: str):
        super().__init__(message)
        self.signame = signame


def stop_if_requested(ctx, what: str, step: int) -> None:
    """Between a warm-up's blocks: end the run on SIGINT/SIGTERM (a warm-up has no checkpoint)."""
    if ctx.stop_requested:
        ctx.progress.stop()
        raise Stopped(ctx.stop_requested, f"stopped by {ctx.stop_requested} during the {what}, at step {step}; "
                      "nothing was saved; the same command starts it again (reusing an --output-dir)")


def cache_key(config, extra: dict | None = None) -> str:
    """Everything that changes the warm model (not where the cache lives)."""
    key = {"model": config.model.model_dump(), "data": config.data.model_dump(exclude={"analogs"}),
           "seed": config.seed,
           "warmup": config.warmup.model_dump(exclude={"cache", "cache_dir"}),
           "files": [_stamp(p) for p in (config.data.path, config.data.eval_path, config.model.path) if p],
           **(extra or {})}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cache_path(config) -> Path:
    return Path(config.warmup.cache_dir).expanduser() / cache_key(config)


def _stamp(path: str) -> list:
    """An edited dataset or model directory must not reuse a stale warm model."""
    st = Path(path).expanduser().stat()
    return [str(Path(path).expanduser().resolve()), st.st_size, st.st_mtime_ns]


def stage_path(config, kind: str, source: str | None, label: str | None, extra: dict) -> Path:
    """Cache directory of a warm-up stage that fine-tunes `source` (the previous stage's model) on
    samples labelled by the verifier source `label`: everything that changes its result is in the key."""
    spec = next((r.model_dump() for r in config.rewards if r.name == label), None)
    return (Path(config.warmup.cache_dir).expanduser().parent / kind /
            cache_key(config, {"kind": kind, "source": source, "label": spec, "rollout": config.rollout.model_dump(),
                               "verifier_fraction": config.verifier.fraction, **extra}))


def cached_stage(path: Path, marker: str, config) -> dict | None:
    """The info of a finished warm-up stage cached at `path` (None: not cached, or caching is off)."""
    if config.warmup.cache and (path / marker).is_file():
        return json.loads((path / marker).read_text())
    return None


async def save_stage(learner, path: Path, marker: str, info: dict) -> dict:
    """Save a warm-up stage's model where the next stage or the run loads it, and its info last (the
    marker that makes it a cache hit)."""
    await learner.call("save", str(path), False, table=False)
    (Path(path) / marker).write_text(json.dumps(info))
    return info


def fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def cached(config) -> tuple[Path | None, dict]:
    path = cache_path(config)
    meta = path / "warmup.json"
    if config.warmup.cache and meta.is_file():
        return path, json.loads(meta.read_text())
    return None, {}


async def warm_up(ctx, fallback_dir: Path) -> dict:
    """SFT steps in blocks of `eval_every`; stop once greedy held-out accuracy reaches the target.
    The warm model is saved to the cache (or `fallback_dir` with warmup.cache=false); the returned
    info has its `path`."""
    from orchestrator.channels import Channel

    cfg = ctx.config.warmup
    learner = ctx.pools["policy_learner"]
    channel = Channel("policy", learner, [ctx.pools["generator"]])
    # prompts and answers only: pairs (data.analogs) must not change the warm-up's batches
    sampler = PromptSampler(ctx.prompts.train.select(["prompt", "answer"]), seed=ctx.config.seed + 1)
    ctx.progress.start("warm-up (SFT)", total=cfg.max_steps)
    start, steps, accuracy, loss = time.perf_counter(), 0, 0.0, float("nan")
    held_out = ctx.prompts.eval.select(["prompt", "answer"])
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
            accuracy = (await greedy_accuracy(ctx))["eval/accuracy"]
        kind = "greedy acc" if accuracy is not exact else "exact answers"
        ctx.progress.update(steps, f"loss {loss:.3f}  {kind} {accuracy:.3f} (target {cfg.target_accuracy})",
                            force_line=True)
        if accuracy >= cfg.target_accuracy:
            break
    ctx.progress.stop()
    await learner.call("end_warmup", table=False)
    info = {"warmup/steps": steps, "warmup/accuracy": accuracy, "warmup/loss": loss,
            "warmup/time_s": time.perf_counter() - start, "warmup/reached_target": accuracy >= cfg.target_accuracy}
    if not info["warmup/reached_target"]:
        ctx.progress.print(f"[yellow]warning:[/] warm-up stopped at warmup.max_steps={cfg.max_steps} with "
                           f"accuracy {accuracy:.3f} < target {cfg.target_accuracy}; RL starts from there")
    path = cache_path(ctx.config) if cfg.cache else Path(fallback_dir)
    await learner.call("save", str(path), False, table=False)
    (path / "warmup.json").write_text(json.dumps(info))
    return {**info, "path": str(path)}
