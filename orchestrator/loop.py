"""The one orchestration loop every pipeline shares.

An asyncio driver: sample prompts, let the recipe launch its rollout stages (generation, scoring)
as Ray object refs, wait for them without fetching the data, train, publish weights, evaluate,
checkpoint and report. Recipes differ in the stages they plug in, not in copies of this loop.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import ray

from orchestrator.config import Config
from orchestrator.data import PromptSampler, PromptSet
from orchestrator.metrics import MetricsSink
from orchestrator.progress import RunProgress


class Recipe(Protocol):
    name: str

    def rollout(self, ctx: "RunContext", prompts: pa.Table) -> dict[str, list[ray.ObjectRef]]:
        """Launch the step's stages; returns refs per stage name, in pipeline order. The last
        stage's refs are the scored batches the learner trains on."""

    def learn(self, ctx: "RunContext", batches: list[ray.ObjectRef], dump_path: str | None) -> ray.ObjectRef:
        """Launch the learner step; the ref resolves to a metrics dict."""


@dataclass
class RunContext:
    config: Config
    run_dir: Path
    prompts: PromptSet
    sampler: PromptSampler
    generators: list[Any]
    verifiers: list[Any]
    learner: Any
    metrics: MetricsSink
    progress: RunProgress
    step: int = 0
    version: int = 0
    started: float = field(default_factory=time.perf_counter)
    offset_s: float = 0.0  # wall time of earlier sessions of a resumed run
    last_eval: dict = field(default_factory=dict)

    def elapsed(self) -> float:
        return self.offset_s + time.perf_counter() - self.started

    def split(self, table: pa.Table, pieces: int) -> list[pa.Table]:
        """Contiguous slices of whole prompts (a prompt's samples stay in one group)."""
        pieces = max(1, min(pieces, table.num_rows))
        size = -(-table.num_rows // pieces)
        return [table.slice(i, size) for i in range(0, table.num_rows, size)]

    async def publish(self) -> None:
        """Send the learner's current weights, as one object-store ref, to every generator."""
        weights = self.learner.publish.remote()
        await asyncio.gather(*[g.update_weights.remote(self.version, weights) for g in self.generators])

    async def evaluate(self) -> dict[str, float]:
        """Greedy accuracy on the held-out split, spread over the generators."""
        chunks = self.split(self.prompts.eval, len(self.generators))
        results = await asyncio.gather(*[
            self.verifiers[i % len(self.verifiers)].evaluate.remote(
                self.generators[i % len(self.generators)].generate.remote(chunk, greedy=True))
            for i, chunk in enumerate(chunks)])
        n = sum(r["samples"] for r in results)
        out = {"eval/accuracy": sum(r["accuracy"] * r["samples"] for r in results) / n}
        for key in {k for r in results for k in r if k.startswith("errors/")}:
            out[f"eval/{key}"] = sum(r.get(key, 0) for r in results)
        self.last_eval = out
        return out


async def wait_all(refs: list[ray.ObjectRef]) -> None:
    """Wait until refs are ready without pulling their data into the driver."""
    if refs:
        await asyncio.to_thread(ray.wait, refs, num_returns=len(refs), fetch_local=False)


def step_info(row: dict) -> str:
    acc = row.get("eval/accuracy")
    return (f"reward {row['reward/mean']:.3f}  "
            f"acc {'-' if acc is None else f'{acc:.3f}'}  "
            f"{row['throughput/samples_per_s']:.0f} samples/s  {row['throughput/tokens_per_s']:.0f} tok/s")


async def train(ctx: RunContext, recipe: Recipe, checkpoint) -> dict:
    """Run steps until max_steps (or stop_at_accuracy); returns the last metrics row."""
    cfg = ctx.config
    ctx.progress.start(f"{recipe.name}", total=cfg.train.max_steps, completed=ctx.step)
    row: dict = {}
    while ctx.step < cfg.train.max_steps:
        step = ctx.step + 1
        t0 = time.perf_counter()
        stages = recipe.rollout(ctx, ctx.sampler.next(cfg.rollout.prompts_per_step))
        timings, mark = {}, t0
        for name, refs in stages.items():
            await wait_all(refs)
            timings[f"time/{name}_s"] = time.perf_counter() - mark
            mark = time.perf_counter()
        dump = str(ctx.run_dir / "rollouts" / f"step_{step}.parquet") if cfg.train.dump_rollouts else None
        metrics = await recipe.learn(ctx, list(stages.values())[-1], dump)
        timings["time/train_s"] = time.perf_counter() - mark
        mark = time.perf_counter()
        ctx.version += 1
        await ctx.publish()
        timings["time/publish_s"] = time.perf_counter() - mark
        step_s = time.perf_counter() - t0
        ctx.step = step
        row = {"step": step, "time_s": round(ctx.elapsed(), 3), "policy/version": ctx.version, **metrics,
               **timings, "time/step_s": step_s,
               "throughput/samples_per_s": metrics["samples/count"] / step_s,
               "throughput/tokens_per_s": metrics["samples/tokens"] / step_s}
        evaluated = step % cfg.train.eval_every == 0 or step == cfg.train.max_steps
        if evaluated:
            mark = time.perf_counter()
            row.update(await ctx.evaluate())
            row["time/eval_s"] = time.perf_counter() - mark
        ctx.metrics.log(row)
        ctx.progress.update(step, step_info(row), force_line=evaluated)
        if cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0:
            await checkpoint(ctx, f"step_{step}")
        target = cfg.train.stop_at_accuracy
        if evaluated and target is not None and row["eval/accuracy"] >= target:
            ctx.progress.print(f"held-out accuracy {row['eval/accuracy']:.3f} >= train.stop_at_accuracy "
                               f"{target}: stopping at step {step}")
            break
    ctx.progress.stop()
    return row


def write_state(path: Path, ctx: RunContext) -> None:
    path.write_text(json.dumps({"step": ctx.step, "version": ctx.version, "sampler": ctx.sampler.state(),
                                "time_s": ctx.elapsed()}))
