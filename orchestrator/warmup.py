"""Supervised warm-up on the task's reference answers until a held-out accuracy target, cached so
later runs with the same model, data and warm-up settings start from it at once."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from orchestrator.data import PromptSampler


def cache_path(config) -> Path:
    """Cache key: everything that changes the warm model (not where the cache lives)."""
    key = {"model": config.model.model_dump(), "data": config.data.model_dump(), "seed": config.seed,
           "warmup": config.warmup.model_dump(exclude={"cache", "cache_dir"}),
           "files": [_stamp(p) for p in (config.data.path, config.data.eval_path, config.model.path) if p]}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return Path(config.warmup.cache_dir).expanduser() / digest


def _stamp(path: str) -> list:
    """An edited dataset or model directory must not reuse a stale warm model."""
    st = Path(path).expanduser().stat()
    return [str(Path(path).expanduser().resolve()), st.st_size, st.st_mtime_ns]


def cached(config) -> tuple[Path | None, dict]:
    path = cache_path(config)
    meta = path / "warmup.json"
    if config.warmup.cache and meta.is_file():
        return path, json.loads(meta.read_text())
    return None, {}


async def warm_up(ctx) -> dict:
    """SFT steps in blocks of `eval_every`; stop once greedy held-out accuracy reaches the target."""
    cfg = ctx.config.warmup
    sampler = PromptSampler(ctx.prompts.train, seed=ctx.config.seed + 1)
    ctx.progress.start("warm-up (SFT)", total=cfg.max_steps)
    start, steps, accuracy, loss = time.perf_counter(), 0, 0.0, float("nan")
    while steps < cfg.max_steps:
        block = min(cfg.eval_every, cfg.max_steps - steps)
        batches = [sampler.next(min(cfg.batch_size, ctx.prompts.train.num_rows)) for _ in range(block)]
        loss = await ctx.learner.sft_steps.remote(batches, cfg.lr)
        steps += block
        await ctx.publish()
        accuracy = (await ctx.evaluate())["eval/accuracy"]
        ctx.progress.update(steps, f"loss {loss:.3f}  acc {accuracy:.3f} (target {cfg.target_accuracy})",
                            force_line=True)
        if accuracy >= cfg.target_accuracy:
            break
    ctx.progress.stop()
    await ctx.learner.end_warmup.remote()
    info = {"warmup/steps": steps, "warmup/accuracy": accuracy, "warmup/loss": loss,
            "warmup/time_s": time.perf_counter() - start, "warmup/reached_target": accuracy >= cfg.target_accuracy}
    if not info["warmup/reached_target"]:
        ctx.progress.print(f"[yellow]warning:[/] warm-up stopped at warmup.max_steps={cfg.max_steps} with "
                           f"accuracy {accuracy:.3f} < target {cfg.target_accuracy}; GRPO starts from there")
    if cfg.cache:
        path = cache_path(ctx.config)
        await ctx.learner.save.remote(str(path), optimizer=False)
        (path / "warmup.json").write_text(json.dumps(info))
    return info
