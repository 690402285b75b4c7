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

from orchestrator.roles import ACTOR_ERRORS, Pool, RoleError, describe_death

log = logging.getLogger("coevo")


class RankGroup(Pool):
    """The pool of a learner with several ranks: SPMD calls, one answer (rank 0's)."""

    def __init__(self, name: str, spec, config):
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
        missing = [m for m in ("rendezvous", "init_distributed") if not hasattr(handles[0], m)]
        if missing:
            raise RoleError(f"roles.{self.name}.replicas={len(handles)}: {self.class_name} cannot run as ranks of a "
                            f"group (it has no {missing[0]}); learners built on actors.trainable.Trainable can")
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
        """Every rank's answer; a rank that dies, hangs or raises takes the whole group down."""
        async def get(ref):
            return await ref
        try:
            return await asyncio.wait_for(asyncio.gather(*[get(r) for r in refs]), self.spec.timeout_s)
        except TimeoutError:
            self._fail(RoleError(f"role {self.name!r} ({self.class_name}): {method} on its {len(refs)} ranks gave no "
                                 f"answer within roles.{self.name}.timeout_s={self.spec.timeout_s:g}s; every rank "
                                 "was stopped", lost_learner=True))
        except ACTOR_ERRORS as e:
            rank = next((i for i, r in enumerate(refs) if _died(r)), 0)
            self.replicas[rank].failures += 1
            self._fail(RoleError(describe_death(self, self.replicas[rank], e).replace(
                "every replica of role", f"rank {rank} of the {len(refs)} ranks of role", 1), lost_learner=True))
        except ray.exceptions.RayTaskError:
            self._stop_ranks()  # the other ranks may wait in a collective for the one that raised
            self.fatal = RoleError(f"role {self.name!r}: a rank failed in {method}; every rank was stopped")
            raise

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


def _died(ref) -> bool:
    """Whether this call's actor is the one that died (its ref resolves to an actor error)."""
    try:
        ray.get(ref, timeout=0)
    except ACTOR_ERRORS:
        return True
    except Exception:  # noqa: BLE001  (not ready, or another error: not this one)
        return False
    return False
