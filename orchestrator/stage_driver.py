"""Runs a recipe's stages (orchestrator.stages) in order before its loop: a cached stage is a hit,
a fresh one trains on pools borrowed from the recipe (or its stand-ins), and the pools that the
recipe also has go on into the run with the warm weights."""

from __future__ import annotations

import time

from orchestrator import cluster
from orchestrator.data import PromptSampler
from orchestrator.loop import RunContext
from orchestrator.recipes import Sources
from orchestrator.pools import build_pools, ready
from orchestrator.stage_cache import read_marker
from orchestrator.stages import until_stopped

_HOLDERS = ("generator", "policy_learner")  # pools that hold the policy a stage starts from


class StageDriver:
    """Runs a recipe's stages in order for a `Run` (orchestrator.run), borrowing pools for them."""

    def __init__(self, run, prompts, local: bool):
        self.run, self.prompts, self.local = run, prompts, local
        self.pools: dict = {}
        self.temporary: set[str] = set()  # borrowed pools the recipe itself has no use for
        self.starting_s = 0.0  # starting the pools a stage borrows (counted as the actors' time)

    async def run_all(self, sources) -> tuple[dict, dict]:
        """Every enabled stage; returns the pools that go on into the run, and the summary info."""
        run, cfg = self.run, self.run.config
        info_all: dict = {}
        for stage in run.recipe.stages(cfg):
            if not stage.enabled(cfg, run.recipe):
                continue
            started = time.perf_counter()
            path = stage.cache_path(cfg, sources)
            info, cached = {}, True
            if path is not None:
                info = read_marker(path, stage.marker) if stage.caching(cfg) else None
                if info is None:
                    cached, path = False, stage.output_dir(cfg, path, run.run_dir)
                    info = await until_stopped(run, self._fresh(stage, path, sources), stage.label)
                    if stage.borrowed(cfg) and not stage.hands_on(cfg):  # they hold what the run does not start from
                        self._drop_holders()
                else:
                    run.progress.print(stage.cached_message(cfg, path, info))
                    if stage.borrowed(cfg):  # they hold an earlier stage's weights
                        self._drop_holders()
            starting, self.starting_s = self.starting_s, 0.0  # its pools' start: the actors' time, not the stage's
            run.session.add("actors", starting)
            run.session.stage(stage.label, time.perf_counter() - started - starting, cached)
            info_all.update(stage.apply(cfg, sources, path, info))
            accuracy = stage.policy_accuracy(info or {})
            if accuracy is not None:  # the last stage that trained the policy: where the RL loop starts
                info_all.update({"warm_start/accuracy": accuracy, "warm_start/stage": stage.label,
                                 "warm_start/skipped": bool((info or {}).get(f"{stage.name}/skipped"))})
        for role in self.temporary:
            if role in self.pools:
                self.pools.pop(role).shutdown()
        return self.pools, info_all

    def _drop_holders(self) -> None:
        for role in _HOLDERS:
            if role in self.pools:
                self.pools.pop(role).shutdown()

    async def _fresh(self, stage, path, sources) -> dict:
        """Train a stage that is not cached, on the pools it borrows."""
        ctx = await self._borrow(stage.borrowed(self.run.config), sources)
        return await stage.train(ctx, path, sources)

    async def _borrow(self, roles: tuple[str, ...], sources) -> RunContext:
        """Pools for a stage: the recipe's own where it has those roles (they keep the warm weights
        and go on into the run), else the recipe's stand-ins (`Recipe.stage_roles`), temporary."""
        run, cfg = self.run, self.run.config
        missing = [r for r in roles if r not in self.pools]
        if missing:
            mine = run.role_specs(Sources(policy=sources.policy))
            stand_ins = run.role_specs(Sources(policy=sources.policy), stand_ins=True)
            lacking = [r for r in missing if r not in mine and r not in stand_ins]
            if lacking:
                raise ValueError(f"recipe {cfg.recipe!r}: a stage needs the roles {lacking}, which neither its "
                                 f"roles nor its stage_roles() declare")
            if "policy_learner" not in self.pools:  # a clear shortage message, not actors that never start
                cluster.check_resources(cfg, run.role_specs(sources), self.local)
            t0 = time.perf_counter()
            self.pools.update(build_pools({r: mine.get(r, stand_ins.get(r)) for r in missing}, cfg))
            self.temporary |= {r for r in missing if r not in mine}
            await ready(self.pools)
            await run.report_placement(self.pools)
            self.starting_s += time.perf_counter() - t0
        ctx = run.ctx = RunContext(config=cfg, run_dir=run.run_dir, prompts=self.prompts,
                                   sampler=PromptSampler(self.prompts.train, cfg.seed), pools=dict(self.pools),
                                   metrics=None, progress=run.progress, run=run)
        ctx.stop_requested = run._pending_stop
        return ctx
