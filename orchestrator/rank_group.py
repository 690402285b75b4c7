"""A learner role of N replicas: N Ray actors that are the ranks of one `torch.distributed` group
(actors.distributed), placed by a placement group (PACK by default, SPREAD as an option).

Every call goes to every rank with the same arguments (the batch travels as one object-store ref);
each rank trains on its share and takes part in the collectives, and rank 0's answer is the
role's. The ranks live and die together: a rank that dies, hangs past the role's timeout or whose
call raises leaves the others blocked in a collective, so the whole group is killed and the run
restarts the learner from its newest checkpoint (train.learner_restarts), where all ranks re-form
the group.
"""

from __future__ import annotations

import asyncio
import logging
import time

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.registry import import_path
from orchestrator.roles import ACTOR_ERRORS, Pool, RoleError, exit_detail, placed

log = logging.getLogger("coevo")
RANK_METHODS = ("rendezvous", "init_distributed")  # what a learner class needs to join a group
SETTLE_S = 5.0  # after a rank's call fails, how long the others' answers may take to arrive


class RankGroup(Pool):
    """The pool of a learner with several ranks: SPMD calls, one answer (rank 0's)."""
    unit = "rank"

    def __init__(self, name: str, spec, config):
        spec = placed(spec)
        # refused before a placement group is reserved or an actor started
        cls = import_path(spec.actor, what=f"role {name!r} actor")
        missing = [m for m in RANK_METHODS if not hasattr(cls, m)]
        if missing:
            raise RoleError(f"roles.{name}.replicas={spec.replicas}: {cls.__name__} ({spec.actor}) cannot run as "
                            f"ranks of a group (it has no {missing[0]}); learners built on "
                            "actors.trainable.Trainable can")
        bundle = {k: v for k, v in {"CPU": spec.num_cpus, "GPU": spec.num_gpus, **spec.resources}.items() if v}
        self.group = placement_group([bundle or {"CPU": 0.01}] * spec.replicas, strategy=spec.placement.upper(),
                                     name=f"coevo-{name}")
        self.formed = False
        self.config = config
        super().__init__(name, spec, config)

    def _role(self, i: int) -> dict:
        return {**super()._role(i), "rank": i, "world_size": self.spec.replicas}

    def _placement(self, i: int) -> dict:
        return {"scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=self.group, placement_group_bundle_index=i)}

    async def ready(self) -> None:
        """Every rank constructed, then the group formed (once: a stage's pool is the run's too):
        rank 0 names the rendezvous address."""
        if self.formed:
            return
        handles = self.handles
        await super().ready()
        address, port = await handles[0].rendezvous.remote()
        backends = await self._all([h.init_distributed.remote(address, port) for h in handles], "init_distributed")
        self.formed = True
        self.backend = backends[0]

    def describe(self) -> str:
        return (f"{self.name}: {len(self.replicas)} ranks ({self.config.learner.strategy} over {self.backend}, "
                f"placement {self.spec.placement})")

    async def call(self, method: str, *args, table: bool = True, versioned: bool = False,
                   replica: int | None = None, **kwargs):
        """`method` on every rank; rank 0's answer (with `table`, rank 0's table ref and info)."""
        if self.fatal is not None:
            raise self.fatal
        self.calls += 1
        start = time.perf_counter()
        calls = [getattr(r.handle, method) for r in self.replicas]
        if table:
            pairs = [fn.options(num_returns=2).remote(*args, **kwargs) for fn in calls]
            infos = await self._all([info for _, info in pairs], method)
            out = pairs[0][0], infos[0]
        else:
            out = (await self._all([fn.remote(*args, **kwargs) for fn in calls], method))[0]
        for rep in self.replicas:
            rep.busy_s += time.perf_counter() - start
        return out

    async def broadcast(self, method: str, *args, **kwargs) -> list:
        return await self._all([getattr(r.handle, method).remote(*args, **kwargs) for r in self.replicas], method)

    async def _all(self, refs: list, method: str) -> list:
        """Every rank's answer. A rank that dies or hangs takes the whole group down and the learner
        is restarted (RoleError.lost_learner); an error raised by a rank's own code ends the run."""
        async def get(ref):
            return await ref
        calls = [asyncio.ensure_future(get(r)) for r in refs]
        try:
            done, pending = await asyncio.wait(calls, timeout=self.spec.timeout_s,
                                               return_when=asyncio.FIRST_EXCEPTION)
            if not pending and not any(c.exception() for c in done):
                return [c.result() for c in calls]
            if not any(c.exception() for c in done):
                self._fail(RoleError(f"role {self.name!r} ({self.class_name}): {method} on its {len(refs)} ranks gave "
                                     f"no answer within roles.{self.name}.timeout_s={self.spec.timeout_s:g}s; every "
                                     "rank was stopped", lost_learner=True))
            # A rank killed inside a collective makes its peers' collective raise at the same moment
            # Ray reports the death (both within ~0.1 s): wait for both before telling a lost rank
            # (restart the run) from a rank whose code raised (a bug: end the run).
            await asyncio.wait(calls, timeout=SETTLE_S)
            errors = [c.exception() if c.done() and not c.cancelled() else None for c in calls]
            oom = next((i for i, e in enumerate(errors) if e is not None and self._out_of_memory(method, e, i)), None)
            if oom is not None:  # before any death it caused (a peer's watchdog): a restart would run out again
                fatal = self.fatal
                self._stop_ranks()
                raise fatal
            dead = [i for i, e in enumerate(errors) if isinstance(e, ACTOR_ERRORS)]
            if dead:
                rank = dead[0]
                self.replicas[rank].failures += 1
                self._fail(RoleError(f"rank {rank} of the {len(refs)} ranks of role {self.name!r} ({self.class_name}) "
                                     f"has died in {method}: {exit_detail(errors[rank])}; every rank was stopped",
                                     lost_learner=True))
            lost = next((i for i, e in enumerate(errors) if _peer_lost(e)), None)
            if lost is not None:  # a peer gone before Ray says so (a lost node takes Ray seconds to notice)
                self._fail(RoleError(f"role {self.name!r} ({self.class_name}): rank {lost} of its {len(refs)} ranks "
                                     f"lost a peer in {method}: {str(errors[lost].cause).strip()[-300:]}; every rank "
                                     "was stopped", lost_learner=True))
            self._stop_ranks()  # the other ranks may wait in a collective for the one that raised
            self.fatal = RoleError(f"role {self.name!r}: a rank failed in {method}; every rank was stopped")
            raise next(e for e in errors if e is not None)
        finally:
            for c in calls:
                c.cancel()

    def _fail(self, error: RoleError) -> None:
        self._stop_ranks()
        self.fatal = error
        log.error("%s", error)
        raise error

    def _stop_ranks(self) -> None:
        for rep in self.replicas:
            rep.alive = False
            rep.dead = True
            ray.kill(rep.handle, no_restart=True)

    def shutdown(self) -> None:
        super().shutdown()
        remove_placement_group(self.group)


def _peer_lost(error: BaseException | None) -> bool:
    """A rank's call raised because a collective lost its peer: torch's network errors, and gloo's
    (a plain RuntimeError from its TCP transport)."""
    import torch.distributed as dist

    cause = getattr(error, "cause", None)
    return isinstance(error, ray.exceptions.RayTaskError) and (
        isinstance(cause, dist.DistNetworkError) or
        (isinstance(cause, RuntimeError) and "Connection closed by peer" in str(cause)))
