"""One training run: Ray, data, actors, warm-up, the loop, checkpoints and the run directory."""

from __future__ import annotations

import asyncio
import json
import re
import time
from datetime import datetime
from pathlib import Path

import ray

from orchestrator import cluster
from orchestrator.config import Config, dump_config
from orchestrator.data import PromptSampler, load_prompts
from orchestrator.loop import RunContext, train, write_state
from orchestrator.metrics import MetricsSink
from orchestrator.progress import RunProgress
from actors.registry import import_path
from orchestrator.warmup import cached, warm_up

STATE_FILE = "loop_state.json"


def default_run_dir(config: Config) -> Path:
    return Path("runs") / f"{config.recipe}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = [p.parent for p in (run_dir / "checkpoints").glob(f"*/{STATE_FILE}")]
    return max(found, key=lambda p: json.loads((p / STATE_FILE).read_text())["step"], default=None)


async def save_checkpoint(ctx: RunContext, name: str) -> Path:
    path = ctx.run_dir / "checkpoints" / name
    await ctx.learner.save.remote(str(path))
    write_state(path / STATE_FILE, ctx)
    return path


def create_actors(config: Config, model_source: str | None):
    from actors.generator import GeneratorActor
    from actors.learner import LearnerActor
    from actors.verifier import VerifierActor

    r, a = config.rollout, config.algorithm
    learner = LearnerActor.options(num_cpus=a.num_cpus, num_gpus=a.num_gpus).remote(config, model_source)
    generators = [GeneratorActor.options(num_cpus=r.num_cpus, num_gpus=r.num_gpus).remote(config, model_source, i)
                  for i in range(r.replicas)]
    verifiers = [VerifierActor.options(num_cpus=config.verifier.num_cpus).remote(config.verifier)]
    return learner, generators, verifiers


async def _run(config: Config, run_dir: Path, resume_from: Path | None, progress: RunProgress) -> dict:
    t_start = time.perf_counter()
    where, local = cluster.connect(config.ray)
    progress.print(where)
    cluster.check_resources(config, local)
    t_ray = time.perf_counter() - t_start
    prompts = load_prompts(config.data, config.seed)
    state = json.loads((resume_from / STATE_FILE).read_text()) if resume_from else None
    warm_path, warm_info = (None, {}) if state or not config.warmup.enabled else cached(config)
    source = resume_from or warm_path
    if warm_path:
        progress.print(f"warm-up: using cached model {warm_path} (accuracy {warm_info['warmup/accuracy']:.3f})")
    learner, generators, verifiers = create_actors(config, str(source) if source else None)
    sampler = PromptSampler(prompts.train, config.seed, **(state["sampler"] if state else {}))
    ctx = RunContext(config=config, run_dir=run_dir, prompts=prompts, sampler=sampler, generators=generators,
                     verifiers=verifiers, learner=learner, metrics=MetricsSink(run_dir), progress=progress)
    if state:
        ctx.step, ctx.version, ctx.offset_s = state["step"], state["version"], state["time_s"]
        await learner.load_optimizer.remote(str(resume_from))
        progress.print(f"resuming {run_dir} from {resume_from.name} (step {ctx.step})")
    t_warm = time.perf_counter()
    if config.warmup.enabled and not source:
        warm_info = await warm_up(ctx)
    t_warm = time.perf_counter() - t_warm
    await ctx.publish()
    t_grpo = time.perf_counter()
    last = await train(ctx, _recipe(config), save_checkpoint)
    t_grpo = time.perf_counter() - t_grpo
    final = await save_checkpoint(ctx, "final")
    plots = ctx.metrics.plot()
    ctx.metrics.close()
    summary = {"run_dir": str(run_dir), "steps": ctx.step, "final_checkpoint": str(final),
               "eval/accuracy": last.get("eval/accuracy", ctx.last_eval.get("eval/accuracy")),
               "time/total_s": time.perf_counter() - t_start, "time/ray_start_s": t_ray,
               "time/warmup_s": t_warm, "time/train_s": t_grpo, "plots": [str(p) for p in plots],
               **warm_info}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _recipe(config: Config):
    from pipelines import RECIPES

    return import_path(RECIPES[config.recipe], what="recipe")()


def run(config: Config, run_dir: Path | None = None, resume: bool = False) -> dict:
    """Train; returns the summary (also written to `run_dir/summary.json`)."""
    run_dir = Path(run_dir or config.output_dir or default_run_dir(config)).resolve()
    resume_from = latest_checkpoint(run_dir) if resume else None
    if resume and resume_from is None:
        raise FileNotFoundError(f"--resume: no checkpoint with {STATE_FILE} under {run_dir}/checkpoints")
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(config, run_dir / "config.yaml")
    progress = RunProgress()
    try:
        return asyncio.run(_run(config, run_dir, resume_from, progress))
    finally:
        progress.stop()
        cluster.shutdown()


def actor_error_message(exc: BaseException) -> str:
    """Ray wraps actor failures in layers; say in one line which role failed and why."""
    text = str(exc)
    if isinstance(exc, ray.exceptions.RayActorError):
        init = re.search(r"ray::(\w+)\.__init__", text)
        if init:
            cause = text.strip().splitlines()[-1]
            return f"the {init.group(1)} actor failed to start: {cause}"
        name = re.search(r"class_name: (\w+)", text)
        pid = re.search(r"\tpid: (\d+)", text)
        detail = re.search(r"Worker exit detail: (.+?\.)", text)
        return (f"the {name.group(1) if name else 'a Ray'} actor died"
                f"{f' (pid {pid.group(1)})' if pid else ''}: "
                f"{detail.group(1) if detail else 'see the Ray logs'} The run cannot go on without it.")
    if isinstance(exc, ray.exceptions.RayTaskError):
        cause = exc.cause
        while isinstance(cause, ray.exceptions.RayTaskError) and cause.cause is not None:
            cause = cause.cause  # a failed input of a failed task: report the first failure
        return f"{type(cause).__name__}: {cause}"
    return f"{type(exc).__name__}: {exc}"
