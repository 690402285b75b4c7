"""The one orchestration loop every recipe shares.

An asyncio driver: rollouts (generation + per-piece scoring) stream into a buffer under admission
control (orchestrator.rollouts); the loop takes a train batch, lets the recipe score it as a whole
(reward models, at one version), runs the recipe's credit step on it (rewards -> advantages,
orchestrator.credit) and lets the recipe learn (learners step, channels publish), then evaluates,
checkpoints and reports. With `train.max_staleness = 0` generation waits for the weights of the
step before; with k > 0 it runs up to k versions ahead while the learner trains. Recipes differ in
the stages they plug in, not in copies of this loop. The driver passes object refs; it reads a
train batch's tokens once a step, in the credit step (as verl's and prime-rl's drivers do).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from actors.envs.metrics import episode_metrics
from orchestrator.colocation import sleep_generators
from orchestrator.config import Config
from orchestrator.data import PromptSampler, PromptSet
from orchestrator.label_select import label_metrics
from orchestrator.metrics import MetricsSink
from orchestrator.probes import hidden_batch
from orchestrator.progress import RunProgress, estimate
from orchestrator.reward_health import RewardHealth, step_counts

FAILURES_EVERY_S = 1.0  # replica deaths (a GCS query) are read at most this often between evaluations


@dataclass
class RunContext:
    config: Config
    run_dir: Path
    prompts: PromptSet
    sampler: PromptSampler
    pools: dict[str, Any]
    metrics: MetricsSink
    progress: RunProgress
    channels: dict[str, Any] = field(default_factory=dict)
    step: int = 0
    started: float = field(default_factory=time.perf_counter)
    offset_s: float = 0.0  # wall time of earlier sessions of a resumed run
    last_eval: dict = field(default_factory=dict)
    last_eval_step: int | None = None  # the step of last_eval
    stop_requested: str | None = None  # set by SIGINT/SIGTERM: checkpoint and exit after this step
    rollouts: Any = None  # the recipe's batch source (orchestrator.rollouts.Rollouts for RL)
    credit: Any = None  # the recipe's credit step (orchestrator.credit.Credit), None where it has none
    versions: dict[str, int] = field(default_factory=dict)  # learner role -> its latest version
    stage_seconds: dict = field(default_factory=dict)  # batch-stage scoring time per source, this step
    run: Any = None  # the orchestrator.run.Run a stage's context belongs to (a stage may nest a run in it)

    def elapsed(self) -> float:
        return self.offset_s + time.perf_counter() - self.started

    @staticmethod
    def split(table: pa.Table, pieces: int) -> list[pa.Table]:
        """Contiguous slices of whole prompts (a prompt's samples stay in one group)."""
        pieces = max(1, min(pieces, table.num_rows))
        size = -(-table.num_rows // pieces)
        return [table.slice(i, size) for i in range(0, table.num_rows, size)]


def step_info(row: dict, last_acc: tuple[float, int] | None = None) -> str:
    """The progress line; between evaluations it shows the last accuracy and its step."""
    acc = row.get("eval/accuracy")
    acc_text = (f"acc {acc:.3f}" if acc is not None else f"acc {last_acc[0]:.3f} (step {last_acc[1]})" if last_acc
                else "acc -")
    parts = [f"reward {row['reward/mean']:.3f}" if "reward/mean" in row else None,
             acc_text if "eval/accuracy" in row or "reward/mean" in row else None,
             f"rm pair acc {row['rm/batch_pair_accuracy']:.3f}" if row.get("rm/batch_pair_accuracy") is not None else None,
             f"held-out pair acc {row['eval/pair_accuracy']:.3f}" if "eval/pair_accuracy" in row else None,
             f"{row['throughput/samples_per_s']:.0f} samples/s" if "throughput/samples_per_s" in row else None]
    # a learned reward the guard dropped this step (orchestrator/judge_credit.py): why the reward is
    # the verifier's alone, or nothing where it labels nothing
    for key in sorted(k for k, v in row.items() if k.startswith("learned/") and k.endswith("/guard") and v == 1):
        source, auc = key[len("learned/"):-len("/guard")], row.get(key[:-len("guard")] + "auroc")
        on = " on probes" if f"learned/{source}/probe_rows" in row else ""  # verifier.probe_share
        parts.append(f"{source} dropped by the guard (AUROC{on} {auc:.2f})" if auc is not None
                     else f"{source} dropped by the guard")
    return "  ".join(p for p in parts if p)


async def train(ctx: RunContext, recipe, checkpoint, state: dict | None = None) -> dict:
    """Run steps until max_steps, stop_at_accuracy or a stop request; returns the last metrics row.
    `checkpoint(ctx, name)` saves everything needed to continue."""
    cfg = ctx.config
    rollouts = ctx.rollouts = recipe.make_source(ctx, (state or {}).get("rollouts"))
    rollouts.start()
    ctx.progress.start(recipe.name, total=recipe.step_budget(cfg)[0], completed=ctx.step)
    row: dict = {}
    last_acc = None
    busy_before = _busy(ctx)
    last_checkpoint = time.monotonic()
    health = RewardHealth({r.name: r.fn or r.name for r in cfg.fn_rewards() + cfg.process_rewards()},
                          cfg.verifier.max_failed_steps)
    colocated = cfg.rollout.vllm_sleep_level > 0  # strict on-policy only (the config refuses it with k > 0)
    cpu_mark = time.process_time()  # the driver's own CPU per step: what a bigger cluster cannot spread
    loop_start, first_step = time.perf_counter(), ctx.step + 1
    budget, ends_early = recipe.step_budget(cfg)
    try:
        while ctx.step < cfg.train.max_steps and not ctx.stop_requested:
            step = ctx.step + 1
            t0 = time.perf_counter()
            pieces = await rollouts.take()
            if pieces is None:  # stop requested
                break
            t_take = time.perf_counter()
            tables = await recipe.score_batch(ctx, [p.table for p in pieces])
            t_score = time.perf_counter()
            credited = {}
            if ctx.credit is not None:  # rewards -> advantages, on the driver (orchestrator.credit)
                tables, credited = await ctx.credit.run(tables)
            tables = await hidden_batch(cfg, tables)  # verifier.probe_share: no learner sees probes' labels
            t_credit = time.perf_counter()
            dump = str(ctx.run_dir / "rollouts" / f"step_{step}.parquet") if cfg.train.dump_rollouts else None
            if colocated:  # the batch is generated and scored: the generators idle until the publish
                colocated = await sleep_generators(ctx)
            metrics = await recipe.learn(ctx, tables, dump)
            rollouts.trained_batch()
            t_learn = time.perf_counter()
            await asyncio.sleep(0)  # let admission dispatch the next pieces before the bookkeeping below
            step_s = t_learn - t0
            ctx.step = step
            samples = sum(p.samples for p in pieces)
            row = {"step": step, "time_s": round(ctx.elapsed(), 3), **credited, **metrics,
                   "time/wait_rollouts_s": t_take - t0, "time/score_batch_s": t_score - t_take,
                   "time/credit_s": t_credit - t_score, "time/learn_s": t_learn - t_credit, "time/step_s": step_s,
                   "time/driver_cpu_s": time.process_time() - cpu_mark,
                   "time/generate_s": _piece_time(pieces, "generate_s", ctx, "generator"),
                   "time/verify_s": _piece_time(pieces, "verify_s", ctx, "verifier"),
                   "throughput/samples_per_s": samples / step_s,
                   **rollouts.accounting()}
            row.update(episode_metrics([p.info for p in pieces]))  # multi-turn episodes (env.name)
            row.update({k: v for k, v in label_metrics([p.info for p in pieces]).items() if v is not None})
            seconds = {k: sum(p.info.get(k, 0.0) for p in pieces) for p in pieces for k in p.info
                       if k.startswith("seconds/")}
            seconds.update(ctx.stage_seconds)
            ctx.stage_seconds = {}
            for key, value in seconds.items():  # scoring cost per sample, per reward source
                row[f"reward/{key[8:]}/latency_ms"] = 1000 * value / max(samples, 1)
            if "samples/tokens" in metrics:
                row["throughput/tokens_per_s"] = metrics["samples/tokens"] / step_s
            for name, channel in ctx.channels.items():
                row[f"channel/{name}/version"] = channel.version
                row[f"channel/{name}/lag"] = channel.lag(ctx.versions.get(channel.learner.name, channel.version))
                if channel.settings.transport == "collective":  # groups formed; versions sent the other way
                    row[f"channel/{name}/epochs"] = channel.epochs
                    row[f"channel/{name}/fallbacks"] = channel.fallbacks
                    row[f"channel/{name}/join_failures"] = channel.join_failures
            evaluated = step % cfg.train.eval_every == 0 or step == cfg.train.max_steps or rollouts.last_batch()
            # Ray's restart counts are read fresh on evaluated steps (and the last), else at most once a second
            restarts_age = 0.0 if evaluated else FAILURES_EVERY_S
            busy_now = _busy(ctx)
            for role, busy in busy_now.items():
                pool = ctx.pools[role]
                row[f"role/{role}/busy_frac"] = min(1.0, (busy - busy_before.get(role, 0.0)) / (step_s * max(1, pool.live())))
                row[f"role/{role}/failures"] = pool.failures(max_age_s=restarts_age)
                row[f"role/{role}/retries"] = pool.retries
                if getattr(pool, "elastic", None) is not None:  # grow while it is the bottleneck (docs/elastic.md)
                    pool.elastic.observe(row[f"role/{role}/busy_frac"], row["time/wait_rollouts_s"] / step_s)
                    row.update(pool.elastic.metrics())
                    for line in pool.elastic.take_events():
                        ctx.progress.print(line)
            busy_before = busy_now
            if evaluated:
                mark = time.perf_counter()
                row.update(await recipe.evaluate(ctx))
                ctx.last_eval = {k: v for k, v in row.items() if k.startswith("eval/")}
                ctx.last_eval_step = step
                row["time/eval_s"] = time.perf_counter() - mark
            ctx.metrics.log(row)
            cpu_mark = time.process_time()
            ctx.metrics.export(ctx, row, pieces)
            if row.get("eval/accuracy") is not None:
                last_acc = (row["eval/accuracy"], step)
            left = estimate(time.perf_counter() - loop_start, step - first_step + 1, budget - first_step + 1,
                            at_most=ends_early)
            # logs get a line at every evaluation, and at least every tenth of the run
            line = evaluated or step % max(1, budget // 10) == 0
            ctx.progress.update(step, f"{step_info(row, last_acc)}  [{left}]", force_line=line)
            for warning in health.observe(step, step_counts([p.info for p in pieces])):  # raises to stop
                ctx.progress.print(warning)
            every, every_s = cfg.train.checkpoint_every, cfg.train.checkpoint_every_s
            if (every and step % every == 0) or (every_s and time.monotonic() - last_checkpoint >= every_s):
                await checkpoint(ctx, f"step_{step}")
                last_checkpoint = time.monotonic()
            target = cfg.train.stop_at_accuracy
            if evaluated and target is not None and row.get("eval/accuracy", -1) >= target:
                ctx.progress.print(f"held-out accuracy {row['eval/accuracy']:.3f} >= train.stop_at_accuracy "
                                   f"{target}: stopping at step {step}")
                break
    finally:
        ctx.progress.stop()
    return row


def _piece_time(pieces, key: str, ctx: RunContext, role: str) -> float:
    """Busy seconds of a stage over the batch's pieces, per replica of its role."""
    pool = ctx.pools.get(role)
    total = sum(p.info.get(key, 0.0) for p in pieces)
    return total / max(1, len(pool.replicas) if pool else 1)


def _busy(ctx: RunContext) -> dict[str, float]:
    return {name: pool.busy_s() for name, pool in ctx.pools.items()}
