"""One training run: the run directory, Ray, data, roles, stages (warm-ups), the loop, checkpoints, signals."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path


from orchestrator import checkpoint as ckpt
from orchestrator import cluster, fit, frozen, names, placement
from orchestrator import run_dir as run_dirs
from orchestrator.config import Config, ConfigError, dump_config
from orchestrator.data import load_prompts, make_sampler
from orchestrator.loop import RunContext, train
from orchestrator.metrics import MetricsSink
from orchestrator.progress import RunProgress
from orchestrator.recipes import RECIPES, Sources
from orchestrator.pools import build_pools, ready
from orchestrator.roles import RoleError, resolve
from orchestrator.session import Session, session_record
from orchestrator.stage_driver import StageDriver
from orchestrator.stages import Stopped, until_stopped


def in_ray_job() -> bool:
    """`ray job submit` runs the entrypoint with this variable set (and a temporary working dir)."""
    return "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ


def resolve_run_dir(config: Config, resume: bool) -> Path:
    """Where the run's outputs go. Inside a Ray job the working directory is Ray's temporary copy,
    deleted with its session, so the default is under the home directory and a relative path is
    refused. An existing run directory is continued only with --resume (orchestrator.run_dir)."""
    stamp = f"{config.recipe.replace(':', '_').replace('.', '_')}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    if config.output_dir is None:
        base = Path("~/coevo/runs").expanduser() if in_ray_job() else Path("runs")
        path = base / stamp
        for i in range(2, 1000):  # another run started in the same second
            if not path.exists():
                break
            path = base / f"{stamp}-{i}"
    else:
        path = Path(config.output_dir).expanduser()
        if in_ray_job() and not path.is_absolute():
            raise ConfigError(f"output_dir {config.output_dir!r} is relative, but inside a Ray job the working "
                              "directory is a temporary copy that Ray deletes: give an absolute path, e.g. on "
                              "shared storage (--output-dir /mnt/shared/runs/try1)")
    path = path.resolve()
    note = run_dirs.claim(path, config, resume)  # refuses a run to keep; reuses one with no checkpoint
    if note:
        print(note, flush=True)
    return path


@dataclass
class Survivors:
    """What a learner restart keeps of the failed attempt: its Ray cluster, the pools that are not
    learners (generators, verifiers, reward models and judges: the same actors, which take the
    restored learner's weights) and the attempt's model sources and warm-up results."""
    local: bool
    pools: dict
    sources: Sources
    warm_info: dict = field(default_factory=dict)
    kept: dict = field(default_factory=dict)  # the Run's attributes carried over


class Run:
    def __init__(self, config: Config, run_dir: Path, resume: bool, restarted: bool = False,
                 session: Session | None = None, survivors: Survivors | None = None):
        self.config, self.run_dir = config, run_dir
        self.survivors = survivors  # after a lost learner: what the failed attempt leaves running
        self.session = session or Session()  # the command's timing, restarts and resume point
        self.restarted = restarted  # after a lost learner: with no checkpoint, earlier rows are redone
        self.resume_from = ckpt.latest(run_dir) if resume else None
        self.state = json.loads((self.resume_from / ckpt.STATE_FILE).read_text()) if self.resume_from else None
        self.recipe = RECIPES.get(config.recipe)()
        self.progress = RunProgress()
        self.ctx: RunContext | None = None
        self.nested: list[Run] = []  # runs a stage runs inside this one (an auto reward model's)
        self._placed: set[str] = set()  # pools whose placement was printed

    # ---- sources ------------------------------------------------------------------------------------
    def _learner_roles(self) -> list[str]:
        return [name for name, kind in self.recipe.role_kinds(self.config).items() if kind == "learner"]

    def _judges_by_vector(self) -> bool:
        """judge.separate with a fixed judge apart: the policy plus the judge vector (not a judge learner)."""
        judge = getattr(self.config, "judge", None)
        return bool(judge is not None and judge.separate and self.recipe.separate_judge
                    and not self.recipe.judge_learns(self.config))

    def _resumed_sources(self) -> Sources:
        """Model directories of the checkpoint being resumed (its frozen models back in the run
        directory first: they need not exist anywhere else)."""
        learners = self._learner_roles()
        policy, reward_models = frozen.from_checkpoint(self.resume_from, self.run_dir, self.state, learners)
        self._frozen = self.state.get("frozen")
        src = Sources(policy=policy, reward_models=reward_models)
        if (self._frozen or {}).get("judge_vector"):  # judge.separate
            src.judge_vector = str(self.run_dir / self._frozen["judge_vector"])
        elif self._judges_by_vector():
            raise ValueError(f"--resume with judge.separate: true, but the checkpoint {self.resume_from} has no judge "
                             "vector (its run judged with the policy itself); resume without judge.separate, or "
                             "start a new run")
        for role in learners:
            if (self.resume_from / role / "config.json").is_file():
                src.learners[role] = str(self.resume_from / role)
            if (self.run_dir / f"{role}_reference" / "config.json").is_file():
                src.references[role] = str(self.run_dir / f"{role}_reference")
        src.policy = src.learners.get("policy_learner") or src.policy
        if self.recipe.judge_learns(self.config) and "judge_learner" not in src.learners:
            raise ValueError(f"--resume with judge.online_items={self.config.judge.online_items}, but the checkpoint "
                             f"{self.resume_from} has no judge learner (its run's judge did not learn); resume "
                             "without judge.online_items, or start a new run")
        return src

    # ---- the run ------------------------------------------------------------------------------------
    async def main(self, nested: bool = False) -> dict:
        """The whole run. `nested`: a run inside another (a reward-model warm-up) on its Ray."""
        token = names.RUN.set(self.run_dir.name)  # its actors' names (orchestrator.names)
        try:
            summary = await self._main(nested)
        except BaseException as e:
            if self.ctx is not None and self.ctx.metrics is not None:
                self.ctx.metrics.finish("stopped" if isinstance(e, Stopped) else "failed")
            raise
        finally:
            names.RUN.reset(token)
        return summary

    async def _main(self, nested: bool) -> dict:
        cfg, session = self.config, self.session
        t_start = time.perf_counter()
        kept = self.survivors
        if kept is not None:  # a learner restart: the same cluster, the same GPU plan
            local = kept.local
            self._install_signals()
            for name, value in kept.kept.items():
                setattr(self, name, value)
        elif not nested:
            where, local = cluster.connect(cfg.ray)
            self.progress.print(where)
            self._install_signals()
        else:
            local = False
        self.local = local
        if kept is None:
            self.gpu_plan = self._plan_gpus(local, nested)
        session.add("ray_start", time.perf_counter() - t_start)
        # from here to the loop: the warm-up stages (timed by the stage driver) and the actors' start
        t_actors, counted = time.perf_counter(), sum(session.phases.values())
        prompts = load_prompts(cfg.data, cfg.seed, cfg.verifier.fraction, model_cfg=cfg.model,
                               probe_share=cfg.verifier.probe_share)
        warm_info: dict = {}
        pools: dict = {}
        if self.resume_from is not None:  # every stage finished before the checkpoint
            sources = self._resumed_sources()
            pools = dict(kept.pools) if kept is not None else {}
        elif kept is not None:  # no checkpoint yet: the failed attempt's sources, from the first step
            sources, warm_info, pools = kept.sources, dict(kept.warm_info), dict(kept.pools)
        else:
            sources = Sources()
            pools, warm_info = await StageDriver(self, prompts, local).run_all(sources)
            self._reward_model_sources = dict(sources.reward_models)
        # the held-out accuracy the loop starts from, kept in checkpoints for the summary of a resume
        self._warm_start = (self.state.get("warm_start", {}) if self.state else
                            {k: v for k, v in warm_info.items() if k.startswith("warm_start/")})
        if not nested and self._frozen is None:  # the run's own copies, stored in every checkpoint
            self._frozen = frozen.freeze(self.run_dir, None if self.recipe.policy else sources.policy,
                                         sources.reward_models, sources.judge_vector)
            if self._frozen["policy"]:
                sources.policy = str(self.run_dir / self._frozen["policy"])
            if self._frozen["judge_vector"]:
                sources.judge_vector = str(self.run_dir / self._frozen["judge_vector"])
            sources.reward_models = {n: str(self.run_dir / rel) for n, rel in self._frozen["reward_models"].items()}
        self._policy_source = sources.policy
        self._sources, self._warm_info = sources, warm_info
        roles = self.role_specs(sources)
        cluster.check_resources(cfg, roles, local)
        pools.update(build_pools({k: v for k, v in roles.items() if k not in pools}, cfg))
        sampler = make_sampler(prompts.train, cfg.seed, cfg.verifier.labelled_share,
                               self.state["sampler"] if self.state else None)
        metrics = MetricsSink(self.run_dir, resume_step=self.state["step"] if self.state else 0 if self.restarted else None,
                              ray_metrics=not nested)
        ctx = self.ctx = RunContext(config=cfg, run_dir=self.run_dir, prompts=prompts, sampler=sampler,
                                    pools=pools, metrics=metrics, progress=self.progress,
                                    credit=self.recipe.credit(cfg, sources))
        ctx.stop_requested = self._pending_stop
        after = ("the same --resume goes on from the same checkpoint" if self.state else
                 "the warm-up stages are cached, and the same command goes on from there (reusing an --output-dir)")
        await until_stopped(self, self._start(ctx), "start of the run's actors, before its first step",
                            message=f"nothing to save yet: {after}")
        session.add("actors", time.perf_counter() - t_actors - (sum(session.phases.values()) - counted))
        t_rl = time.perf_counter()
        try:
            last = await train(ctx, self.recipe, self.checkpoint, self.state)
        except BaseException:
            if ctx.rollouts is not None:
                await ctx.rollouts.stop()
            raise
        finally:
            session.add("train", time.perf_counter() - t_rl)
        t_finish = time.perf_counter()
        stopped = ctx.stop_requested
        plotting = asyncio.create_task(asyncio.to_thread(ctx.metrics.plot, self._warm_start.get("warm_start/accuracy")))
        final = await self.checkpoint(ctx, f"step_{ctx.step}" if stopped else "final")  # while the plot is drawn
        await ctx.rollouts.stop()
        plots = await plotting
        ctx.metrics.finish("stopped" if stopped else "finished")
        ctx.metrics.close()
        if nested:
            for pool in pools.values():
                pool.shutdown()
        session.add("finish", time.perf_counter() - t_finish)
        summary = {"run_dir": str(self.run_dir), "final_checkpoint": str(final),
                   "stopped_by": stopped, "recipe": cfg.recipe, **session.summary(ctx.step),
                   "eval/accuracy": last.get("eval/accuracy", ctx.last_eval.get("eval/accuracy")),
                   "eval/step": ctx.last_eval_step, "eval/prompts": prompts.eval.num_rows,
                   "plots": [str(p) for p in plots],
                   **ctx.last_eval, **ctx.rollouts.accounting(), **warm_info, **self._warm_start}
        summary["sessions"] = self._earlier_sessions() + [session_record(summary)]
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def survive(self) -> Survivors | None:
        """After this attempt lost a learner: shut its learner pools down and keep the rest for the
        next attempt (None where the attempt had not started its loop's actors: it starts over)."""
        ctx = self.ctx
        if ctx is None or getattr(self, "_sources", None) is None:
            return None
        keep = {}
        for name, pool in ctx.pools.items():
            if pool.spec.learner:
                pool.shutdown()
            else:
                pool.forget_weights()
                keep[name] = pool
        names_kept = ("gpu_plan", "gpus_usable", "_frozen", "_policy_source", "_reward_model_sources",
                      "_warm_start", "_placed")
        return Survivors(self.local, keep, self._sources, self._warm_info,
                         {k: getattr(self, k) for k in names_kept})

    def _earlier_sessions(self) -> list[dict]:
        """The sessions of a resumed run before this one, from the summary its last session wrote."""
        path = self.run_dir / "summary.json"
        if self.session.resumed_from is None or not path.is_file():
            return []
        try:
            old = json.loads(path.read_text())
        except json.JSONDecodeError:
            return []
        return old.get("sessions") or [session_record(old)]

    async def _start(self, ctx: RunContext) -> None:
        """The run's actors up, its state restored (or its references saved), weights published, and
        the recipe's own preparation (held-out pairs, a rehearsal set)."""
        await ready(ctx.pools)
        await self.report_placement(ctx.pools)
        for line in filter(None, (pool.describe() for pool in ctx.pools.values())):
            self.progress.print(line)
        ctx.channels = self.recipe.channels(ctx)
        if self.state:
            await self._restore(ctx)
        else:
            await self._save_references(ctx)
        await self._publish_all(ctx)
        await self.recipe.prepare(ctx)

    # ---- GPUs (orchestrator.placement) ----------------------------------------------------------------
    def _plan_gpus(self, local: bool, nested: bool) -> placement.Plan:
        """GPUs for the roles that say auto. An embedded cluster's GPUs count only where this torch can
        use CUDA; a joined cluster's are taken at Ray's word. A nested run (a stage's, on this run's
        Ray) plans with what is still free, and with its parent's verdict on CUDA."""
        import ray

        cfg = self.config
        if self.gpus_usable is None:
            self.gpus_usable = placement.cuda_usable() if local else True
        roles = {**self.recipe.stage_roles(cfg, Sources()), **self.recipe.roles(cfg, Sources())}
        resources = ray.available_resources() if nested else ray.cluster_resources()
        plan = placement.make_plan(cfg, roles, resources, self.gpus_usable)
        for note in plan.notes:
            self.progress.print(note)
        # the roles' models against their GPU shares, where this process sees the GPU they run on
        one_node = local or sum(n.get("Alive", False) for n in ray.nodes()) == 1
        gpu = fit.gpu_memory() if one_node and self.gpus_usable and not nested else None
        fit.check_fit(cfg, {n: resolve(s, cfg.roles.get(n), cfg) for n, s in plan.assign(roles).items()}, gpu)
        return plan

    def role_specs(self, sources: Sources, stand_ins: bool = False) -> dict:
        """The recipe's roles (`stand_ins`: its stage roles) with the GPUs planned for them."""
        make = self.recipe.stage_roles if stand_ins else self.recipe.roles
        return self.gpu_plan.assign(make(self.config, sources))

    async def report_placement(self, pools: dict) -> None:
        """Print where the replicas of pools not yet reported landed, where any asked for a GPU."""
        line = await placement.landed(pools, self._placed)
        if line:
            self.progress.print(line)

    async def _publish_all(self, ctx: RunContext) -> None:
        for name, channel in ctx.channels.items():
            await channel.publish(ctx.versions.get(channel.learner.name, 0))

    async def _restore(self, ctx: RunContext) -> None:
        state = self.state
        for role in state.get("learners", []):
            ctx.versions[role] = await ctx.pools[role].call("restore", str(self.resume_from / role), table=False)
        for role in state.get("learners", []):
            ref = self.run_dir / f"{role}_reference"
            if (ref / "config.json").is_file():
                await ctx.pools[role].call("load_reference", str(ref), table=False)
        held = state.get("held")
        if held is None and state.get("verifier"):  # older layout: the verifier role's own state
            held = {"verifier": {"state": state["verifier"]}}
        for role, saved in (held or {}).items():
            pool = ctx.pools.get(role)
            if pool is None or pool.held is None:
                raise ValueError(f"{self.resume_from / ckpt.STATE_FILE}: held state for role {role!r}, but this "
                                 f"recipe has no such role with shared statistics ({sorted(ctx.pools)})")
            pool.held.load_state_dict(saved)
        if ctx.credit is not None:  # before the credit step left the learner, the policy learner held its state
            from orchestrator.credit import legacy_state

            saved = state["credit"] if "credit" in state else legacy_state(self.resume_from / "policy_learner")
            if saved:
                ctx.credit.load_state_dict(saved)
        ctx.step, ctx.offset_s = state["step"], state["time_s"]
        state["rollouts"]["pieces"] = ckpt.read_pieces(self.resume_from, state["rollouts"].pop("pieces_index", []))
        state["rollouts"]["tables"] = ckpt.read_tables(self.resume_from, state["rollouts"].pop("tables_index", []))
        self.progress.print(f"resuming {self.run_dir} from {self.resume_from.name} (step {ctx.step})")

    async def _save_references(self, ctx: RunContext) -> None:
        """Frozen references (the KL reference, PRIME's pi_ref) once per run, so a resume keeps them."""
        learners = [r for r, pool in ctx.pools.items() if pool.spec.learner]
        await asyncio.gather(*[ctx.pools[r].call("save_reference", str(self.run_dir / f"{r}_reference"),
                                                 table=False) for r in learners])

    async def checkpoint(self, ctx: RunContext, name: str) -> Path:
        """Everything needed to continue, atomically."""
        tmp = ckpt.begin(self.run_dir, name)
        learners = [r for r, pool in ctx.pools.items() if pool.spec.learner]
        await asyncio.gather(*[ctx.pools[r].call("save", str(tmp / r), table=False) for r in learners])
        snap = await ctx.rollouts.snapshot() if ctx.rollouts else {"pieces": []}
        snap["pieces_index"] = ckpt.write_pieces(tmp, snap.pop("pieces"))
        snap["tables_index"] = ckpt.write_tables(tmp, snap.pop("tables", {}))
        # after the snapshot: a piece it lists as in flight but scored since is merged here, and its
        # rescoring after a resume is then skipped by its batch key (orchestrator.held_state)
        held = {r: pool.held.state_dict() for r, pool in ctx.pools.items() if pool.held is not None}
        if self._frozen:
            frozen.into_checkpoint(tmp, self.run_dir, self._frozen, learners)
        state = {"step": ctx.step, "time_s": ctx.elapsed(), "sampler": ctx.sampler.state(),
                 "learners": learners, "versions": ctx.versions, "rollouts": snap, "held": held,
                 "credit": ctx.credit.state_dict() if ctx.credit is not None else None,
                 "frozen": self._frozen, "policy_source": self._policy_source,
                 "reward_models": self._reward_model_sources, "recipe": self.config.recipe,
                 "warm_start": self._warm_start}
        return ckpt.commit(tmp, state, self.config.train.keep_checkpoints)

    gpu_plan: placement.Plan = placement.Plan()
    gpus_usable: bool | None = None  # whether this torch can use the cluster's GPUs (None: not asked yet)
    _reward_model_sources: dict = {}
    _stop_event: asyncio.Event | None = None
    stage_step: tuple[int, int] | None = None  # a running stage's (step, budget), for a stop's message

    def stopping(self) -> asyncio.Event:
        """Set once a stop is requested (in the event loop the run is in)."""
        if self._stop_event is None:
            self._stop_event = asyncio.Event()
        if self._pending_stop:
            self._stop_event.set()
        return self._stop_event

    _frozen: dict | None = None  # orchestrator.frozen's index of the run's frozen models
    _policy_source: str | None = None
    _pending_stop: str | None = None
    _warm_start: dict = {}

    def request_stop(self, signame: str) -> None:
        """Stop after this step (or a stage's block), here and in a run nested in a stage."""
        self._pending_stop = signame
        if self._stop_event is not None:
            self._stop_event.set()
        if self.ctx is not None:
            self.ctx.stop_requested = signame
            if self.ctx.rollouts is not None:
                self.ctx.rollouts.interrupt()
        for sub in self.nested:
            sub.request_stop(signame)

    def _install_signals(self) -> None:
        """SIGINT (Ctrl-C) and SIGTERM (`ray job stop`): finish the current step, checkpoint, say how
        to resume, exit. A second signal stops at once."""
        loop = asyncio.get_running_loop()

        def handler(signame: str) -> None:
            if self._pending_stop or (self.ctx and self.ctx.stop_requested):
                os._exit(128 + getattr(signal, signame))
            self.request_stop(signame)
            self.progress.print(f"\n{signame}: stopping: during a warm-up stage at once, in training after this "
                                "step, with a checkpoint (again to stop at once)")

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, handler, sig.name)


def run(config: Config, resume: bool = False) -> dict:
    """Train; returns the summary (also written to `run_dir/summary.json`)."""
    session = Session()
    run_dir = resolve_run_dir(config, resume)
    run_dir.mkdir(parents=True, exist_ok=True)
    run_dirs.mark(run_dir)
    dump_config(config, run_dir / "config.yaml")
    job = Run(config, run_dir, resume, session=session)
    if job.resume_from is not None:
        session.resumed_from, session.first_step = job.resume_from.name, job.state["step"] + 1
    job.progress.print(f"run directory: {run_dir}")
    current = [job]
    try:
        return asyncio.run(_attempts(config, run_dir, session, current))
    finally:
        current[0].progress.stop()
        try:
            cluster.shutdown()
        except KeyboardInterrupt:  # the run is over: a Ctrl-C while Ray stops only makes it stop sooner
            pass


async def _attempts(config: Config, run_dir: Path, session: Session, current: list) -> dict:
    """The run's attempts in one event loop: a lost learner restarts from the newest checkpoint, with
    only the learner roles started again (the other roles' actors keep running: Run.survive); one
    lost before the loop's actors started begins again on a new cluster."""
    restarts = config.train.learner_restarts
    while True:
        job = current[0]
        try:
            return await job.main()
        except RoleError as e:
            if not e.lost_learner or restarts == 0 or job._pending_stop:
                raise
            t_restart = time.perf_counter()
            restarts -= 1
            job.progress.stop()
            latest = ckpt.latest(run_dir)
            reached = job.ctx.step if job.ctx else 0
            survivors = job.survive()
            job.progress.print(restart_message(e, latest, reached, restarts, survivors))
            session.restarted(reached, _step_of(latest), latest.name if latest else None, str(e))
            if survivors is None:
                cluster.shutdown()  # every actor of the failed attempt goes with the driver's connection
            current[0] = Run(config, run_dir, resume=latest is not None, restarted=True, session=session,
                             survivors=survivors)
            session.add("restart", time.perf_counter() - t_restart)


def _step_of(checkpoint: Path | None) -> int:
    return json.loads((checkpoint / ckpt.STATE_FILE).read_text())["step"] if checkpoint is not None else 0


def restart_message(error: RoleError, latest: Path | None, reached: int, left: int,
                    survivors: Survivors | None = None) -> str:
    start = _step_of(latest)
    redone = f"steps {start + 1}-{reached} are redone" if reached > start else "no step is redone"
    where = f"its newest checkpoint, {latest.name}" if latest is not None else "the first step (no checkpoint yet)"
    what = (f"the learner roles start again, {', '.join(sorted(survivors.pools))} keep running"
            if survivors is not None and survivors.pools else "every role starts again")
    return (f"{error}\nrestarting the run from {where}: {redone}; {what}; {left} more restart(s) allowed "
            f"(train.learner_restarts)")
