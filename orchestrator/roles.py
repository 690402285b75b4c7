"""Named roles: pools of Ray actor replicas, with resources from the config, restarts, retries and
the weight version each replica holds.

The loop holds pools by role name (`ctx.pools["generator"]`). A call goes to the least busy replica
that is alive and holds the pool's current weights version; if the replica dies mid-call (Ray
restarts it, up to `max_restarts`), the call is retried on a live replica, and the restarted one is
sent the current weights before it gets work again. Every call's result stays in the object store:
stage methods return `(table, info)` and the driver awaits only the small `info`.

A call that outlives its role's `timeout_s` counts as a hung replica: the replica is killed (Ray
restarts it) and the work is retried once elsewhere; a second timeout of the same work is a
RoleError. A weight update that a replica rejects (mismatched keys, a load that raises) is a
RoleError too, never a replica left waiting for a version it will not get. Kinds: docs/roles.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import ray

from actors.registry import import_path
from orchestrator.held_state import DELTA_KEY, HeldState
from orchestrator.names import actor_name

log = logging.getLogger("coevo")
ACTOR_ERRORS = (ray.exceptions.RayActorError,)  # died, or unreachable while restarting
REVIVE_TIMEOUT_S = 300.0  # a replica that stays unreachable this long counts as dead

# What a role is, declared by its recipe (docs/roles.md). learner: trains; one replica, never
# restarted (its state lives in it), checkpointed with its frozen reference. generator: samples
# with a channel's weights (judges too). verifier: rule-based rewards; the driver holds its
# statistics. scorer: reward models, frozen or fed by a channel.
KINDS = ("learner", "generator", "verifier", "scorer")
# Seconds a call may take before its replica counts as hung (None: no limit). A learner cannot be
# restarted, so it has none unless the user sets one; the others get room for a slow first call.
DEFAULT_TIMEOUT_S = {"learner": None, "generator": 1800.0, "verifier": 900.0, "scorer": 1800.0}
_KIND_DEFAULT = "kind default"
AUTO = "auto"  # num_gpus: placed by orchestrator.placement
# the kinds that run a model: where the cluster has GPUs, num_gpus=auto gives them a share
MODEL_KINDS = ("learner", "generator", "scorer")


@dataclass
class RoleSpec:
    """A role as a recipe declares it: which actor class, its constructor arguments (after the
    config), and default resources that `roles.<name>` in the config overrides."""
    actor: str  # `module:Class`, a plain class (the pool makes it a Ray actor)
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    kind: str = ""  # one of KINDS; required
    replicas: Any = 1  # an int, or {min, max} (a ReplicaRange or dict): an elastic pool starting at min
    min_replicas: int = 0  # set from replicas
    max_replicas: int = 0
    idle_timeout_s: float = 60.0  # elastic pools (orchestrator.elastic)
    scale_up_busy_frac: float = 0.9
    scale_up_wait_frac: float = 0.1
    num_cpus: float = 1
    num_gpus: float | str = AUTO  # AUTO: orchestrator.placement decides (0 where nothing did)
    threads: int = 0
    max_restarts: int = 10
    timeout_s: float | None | str = _KIND_DEFAULT  # None or 0: no limit
    resources: dict = field(default_factory=dict)  # Ray custom resources per replica
    placement: str = "pack"  # a learner's ranks: placement-group strategy (pack / spread)
    # threads picked for overlapped stages rather than by the user: a phase that runs alone (the
    # SFT warm-up, before generation starts) may use every core
    shared_threads: bool = False
    note: str = ""  # why the replica count is not the recipe's or the user's (printed at the start)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"role actor {self.actor!r}: kind {self.kind!r} is not one of {list(KINDS)}; "
                             "a recipe declares each role's kind")
        if self.timeout_s == _KIND_DEFAULT:
            self.timeout_s = DEFAULT_TIMEOUT_S[self.kind]
        self.timeout_s = self.timeout_s or None
        if self.learner:
            self.max_restarts = 0  # a learner's state lives in it: resume from a checkpoint
        if not isinstance(self.replicas, int):  # {min, max}
            bounds = self.replicas if isinstance(self.replicas, dict) else self.replicas.__dict__
            if self.learner:
                raise ValueError(f"roles.<learner>.replicas={{min: {bounds['min']}, max: {bounds['max']}}} "
                                 f"(actor {self.actor!r}): a learner's replicas are the ranks of one "
                                 "torch.distributed group and cannot grow or shrink mid-run; give an int")
            self.min_replicas, self.max_replicas = bounds["min"], bounds["max"]
            self.replicas = self.min_replicas
        elif not self.max_replicas:
            self.min_replicas = self.max_replicas = self.replicas

    @property
    def elastic(self) -> bool:
        return self.max_replicas > self.min_replicas

    @property
    def learner(self) -> bool:
        return self.kind == "learner"


class RoleError(RuntimeError):
    """A role cannot go on (e.g. every replica is dead); the message names the role and why.
    `lost_learner`: a learner replica died or hung, which the run can recover from a checkpoint."""

    def __init__(self, message: str, lost_learner: bool = False):
        super().__init__(message)
        self.lost_learner = lost_learner


@dataclass
class Replica:
    handle: Any
    index: int
    version: int = 0
    alive: bool = True
    dead: bool = False
    inflight: int = 0
    busy_s: float = 0.0
    failures: int = 0
    reviving: asyncio.Task | None = field(default=None, repr=False)
    idle_since: float = field(default_factory=time.monotonic)  # when its last call ended


def resolve(spec: RoleSpec, override, config=None) -> RoleSpec:
    """Apply the fields a user set in `roles.<name>` on top of the recipe's defaults, and pick the
    torch threads of each replica: `roles.<name>.threads`, else `train.threads`, else all the node's
    cores when stages take turns (strict on-policy), else as many as the role's CPUs (async stages
    run at once: on 2 cores, a generator and a learner with 2 threads each ran 5x slower than with
    one each, their spinning OpenMP threads starving each other)."""
    values = {k: getattr(override, k) for k in override.model_fields_set} if override is not None else {}
    if values.get("num_gpus") == AUTO:  # the recipe's, or what placement decided for it
        del values["num_gpus"]
    if "replicas" in values:  # min/max come from the user's replicas, not the recipe's
        values["min_replicas"] = values["max_replicas"] = 0
    spec = RoleSpec(**{**spec.__dict__, **values})
    if spec.num_gpus == AUTO:  # nothing placed it (a CPU-only cluster): as before GPUs were placed
        spec.num_gpus = 0.0
    if spec.kind == "verifier" and "replicas" not in values and config is not None:
        spec = verifier_share(spec, config)
    if not spec.threads and config is not None:
        overlapping = config.train.max_staleness > 0
        spec.threads = config.train.threads or (max(1, int(spec.num_cpus)) if overlapping else 0)
        spec.shared_threads = overlapping and not config.train.threads
    return spec


def placed(spec: RoleSpec) -> RoleSpec:
    """`spec` with a number of GPUs: one that nothing placed (resolve does) runs on the CPU."""
    return RoleSpec(**{**spec.__dict__, "num_gpus": 0.0}) if spec.num_gpus == AUTO else spec


GENERATORS_PER_VERIFIER = 8


def verifier_share(spec: RoleSpec, config) -> RoleSpec:
    """A verifier role whose replicas the user left unset gets one replica per
    GENERATORS_PER_VERIFIER generator replicas (the most an elastic generator pool can reach): a
    strict step waits for the last piece's score, and one verifier scoring 32 generators' pieces one
    after another added 0.15-0.33 s a step (docs/elastic.md)."""
    gen = config.roles.get("generator")
    if gen is None or "replicas" not in gen.model_fields_set:
        return spec
    most = gen.replicas if isinstance(gen.replicas, int) else gen.replicas.max
    share = -(-most // GENERATORS_PER_VERIFIER)
    if share <= spec.max_replicas:
        return spec
    return RoleSpec(**{**spec.__dict__, "replicas": share, "min_replicas": 0, "max_replicas": 0,
                       "note": f"one per {GENERATORS_PER_VERIFIER} generator replicas; "
                               "set roles.<name>.replicas to choose"})


class Pool:
    unit = "replica"  # what its members are called in messages

    def __init__(self, name: str, spec: RoleSpec, config):
        spec = placed(spec)
        self.name, self.spec = name, spec
        cls = import_path(spec.actor, what=f"role {name!r} actor")
        self.class_name = cls.__name__
        self._actor, self._config = ray.remote(cls), config
        self.replicas = [Replica(self._spawn(i), i) for i in range(spec.replicas)]
        self.next_index = spec.replicas
        self.version = 0
        self.published = False  # once a version is published, a replica gets work only if it holds it
        # an object-store payload (of weights_version) for restarted replicas; a collective channel
        # leaves it None and sets `_export`, which makes one only when a replica needs it
        self.weights: ray.ObjectRef | None = None
        self.weights_version = 0
        self._export = None
        self._exporting = asyncio.Lock()
        self.transport = getattr(config, "weights", None)  # the run's `weights` settings (channels read them)
        self.fatal: BaseException | None = None
        # statistics the replicas share, held here (orchestrator.held_state): an actor class opts in
        # with a static merge_state(state, delta)
        self.held = HeldState(cls.merge_state) if hasattr(cls, "merge_state") else None
        self._changed = asyncio.Condition()
        self.calls = self.retries = 0
        self.created = time.perf_counter()
        # replicas released by an elastic pool: their busy time and deaths still count
        self.released_busy_s, self.released_failures = 0.0, 0
        from orchestrator.elastic import Elastic
        self.elastic = Elastic(self) if spec.elastic else None

    def _spawn(self, i: int):
        """Start replica `i`'s actor; it waits in Ray (as demand the autoscaler sees) until a node has room."""
        spec = self.spec
        options = dict(num_cpus=spec.num_cpus, num_gpus=spec.num_gpus, resources=spec.resources or None,
                       max_restarts=spec.max_restarts, max_task_retries=0)
        return self._actor.options(**options, name=actor_name(self.name, i), **self._placement(i)).remote(
            self._config, *spec.args, role=self._role(i), **spec.kwargs)

    def _role(self, i: int) -> dict:
        """What replica `i` is told about its role (its threads, its GPUs ...)."""
        spec = self.spec
        return {"name": self.name, "replica": i, "threads": spec.threads,
                "alone_threads": 0 if spec.shared_threads else spec.threads, "num_gpus": spec.num_gpus}

    def _placement(self, i: int) -> dict:
        """Where replica `i` runs: anywhere Ray finds room (a learner's ranks: their placement group)."""
        return {}

    def describe(self) -> str | None:
        """A line for the run's start, where the role is more than a plain pool."""
        note = self.spec.note.replace("roles.<name>", f"roles.{self.name}")
        return f"{self.name}: {self.spec.replicas} replicas ({note})" if note else None

    @property
    def handles(self) -> list:
        return [r.handle for r in self.replicas]

    async def ready(self) -> None:
        """Wait until every replica has started (its constructor ran); a failing constructor raises."""
        await asyncio.gather(*[r.handle.ping.remote() for r in self.replicas])
        if self.elastic is not None:
            self.elastic.start()

    def live(self) -> int:
        """Replicas that take work now (not starting, restarting or catching up)."""
        return sum(r.alive for r in self.replicas)

    # ---- elastic pools (orchestrator.elastic decides when) -------------------------------------------
    def add_replica(self) -> Replica:
        """A new replica: pending until Ray places it, then sent the current weights before any work
        (as a restarted one is), so it never serves an older version than admission allows."""
        rep = Replica(self._spawn(self.next_index), self.next_index, alive=False)
        self.next_index += 1
        self.replicas.append(rep)
        rep.reviving = asyncio.ensure_future(self._revive(rep, joined=True))
        return rep

    def release(self, rep: Replica) -> None:
        """Take an idle replica out of the pool for good (no restart); its counts stay in the pool's."""
        self.replicas.remove(rep)
        self.released_busy_s += rep.busy_s
        self.released_failures += max(rep.failures, (_restarts(rep.handle) or 0) + int(rep.dead))
        if rep.reviving is not None:
            rep.reviving.cancel()
        ray.kill(rep.handle, no_restart=True)

    # ---- calls -------------------------------------------------------------------------------------
    async def _acquire(self) -> Replica:
        async with self._changed:
            while True:
                if self.fatal is not None:
                    raise self.fatal
                ready = [r for r in self.replicas if r.alive and (not self.published or r.version == self.version)]
                if ready:
                    rep = min(ready, key=lambda r: (r.inflight, r.index))
                    rep.inflight += 1
                    return rep
                await self._changed.wait()

    async def _release(self, rep: Replica) -> None:
        rep.inflight -= 1
        if not rep.inflight:
            rep.idle_since = time.monotonic()
        async with self._changed:
            self._changed.notify_all()

    async def call(self, method: str, *args, table: bool = True, versioned: bool = False,
                   replica: int | None = None, **kwargs):
        """Run `method` on one replica. `table=True`: the method returns `(table, info)`; this
        returns `(table_ref, info)` having fetched only `info`. Otherwise returns the value.
        `versioned`: pass `expect_version` so a replica holding other weights refuses the work."""
        attempts = timeouts = 0
        held = self.held is not None and method in self.held.methods
        while True:
            rep = self._replica(replica) if replica is not None else await self._acquire()
            if replica is not None:
                if self.fatal is not None:
                    raise self.fatal
                rep.inflight += 1
            self.calls += 1
            start = time.perf_counter()
            try:
                if versioned and self.published:
                    kwargs["expect_version"] = rep.version
                if held:
                    kwargs["state"] = self.held.ref()
                fn = getattr(rep.handle, method)
                if table:
                    table_ref, info_ref = fn.options(num_returns=2).remote(*args, **kwargs)
                    info = await self._wait(info_ref)
                    rep.busy_s += info.get("busy_s", time.perf_counter() - start)
                    if held:
                        self.held.merge(info.pop(DELTA_KEY, None))
                    return table_ref, info
                value = await self._wait(fn.remote(*args, **kwargs))
                rep.busy_s += time.perf_counter() - start
                if held and isinstance(value, dict):
                    self.held.merge(value.pop(DELTA_KEY, None))
                return value
            except TimeoutError:
                timeouts += 1
                self._hung(rep, method)
                if timeouts > 1 or replica is not None or self.spec.max_restarts == 0:
                    raise RoleError(f"role {self.name!r} ({self.class_name}): {method} on replica {rep.index} "
                                    f"gave no answer within roles.{self.name}.timeout_s={self.spec.timeout_s:g}s"
                                    f"{' for the second time (retried once)' if timeouts > 1 else ''}; "
                                    f"the replica was killed{'' if self.spec.max_restarts else ' and cannot be restarted'}. "
                                    f"Raise the timeout if the work is just slow", lost_learner=self.spec.learner) from None
            except ACTOR_ERRORS as e:
                self._lost(rep, e)
            except ray.exceptions.RayTaskError as e:
                if self._out_of_memory(method, e, rep.index):
                    raise self.fatal from None
                if not _is_stale(e):
                    raise
                self._lost(rep, e)
            finally:
                await self._release(rep)
            attempts += 1
            self.retries += 1
            if replica is not None or attempts > len(self.replicas) * (max(self.spec.max_restarts, 1) + 1):
                raise RoleError(f"role {self.name!r}: {method} failed {attempts} times; replicas keep dying",
                                lost_learner=self.spec.learner)

    def _out_of_memory(self, method: str, error: BaseException, replica: int | None = None) -> bool:
        """An out-of-memory error ends the run (orchestrator.memory): the pool turns fatal with the
        role, the phase and the settings that lower memory; nothing is retried or restarted."""
        from orchestrator.memory import is_oom, out_of_memory

        if not is_oom(error):
            return False
        if self.fatal is None:
            where = f"{self.unit} {replica}" if replica is not None and len(self.replicas) > 1 else ""
            self.fatal = out_of_memory(self.name, self.spec.kind, method, error, self._config, self.spec.num_gpus, where)
            log.error("%s", self.fatal)
        return True

    def _replica(self, index: int) -> Replica:
        for rep in self.replicas:
            if rep.index == index:
                return rep
        raise RoleError(f"role {self.name!r}: no replica {index} (released by the elastic pool?)")

    async def _wait(self, ref):
        """The call's answer, or TimeoutError past the role's timeout_s."""
        async def get():
            return await ref
        return await asyncio.wait_for(get(), self.spec.timeout_s)

    def _hung(self, rep: Replica, method: str) -> None:
        """A replica that does not answer but has not died: kill it so Ray restarts it (its work
        goes elsewhere, it gets the current weights before new work)."""
        log.warning("role %s: replica %d (%s) gave no answer to %s within %gs; restarting it", self.name,
                    rep.index, self.class_name, method, self.spec.timeout_s)
        ray.kill(rep.handle, no_restart=False)
        self._lost(rep, TimeoutError(method))

    def _lost(self, rep: Replica, error: BaseException) -> None:
        """A replica failed mid-call: take it out of rotation until Ray has restarted it and it
        holds the current weights again."""
        if not rep.alive or rep not in self.replicas:
            return  # another call that failed on the same death, or a replica the pool released
        rep.failures += 1
        rep.alive = False
        log.warning("role %s: replica %d (%s) failed (%s); retrying its work elsewhere", self.name, rep.index,
                    self.class_name, type(error).__name__)
        rep.reviving = asyncio.ensure_future(self._revive(rep))

    async def _revive(self, rep: Replica, joined: bool = False) -> None:
        try:
            deadline = time.monotonic() + REVIVE_TIMEOUT_S
            while True:  # "unavailable" while Ray restarts it; "died" once its restarts are used up
                try:
                    await rep.handle.ping.remote()
                    break
                except ray.exceptions.ActorUnavailableError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
            if self.published:
                try:
                    version, payload = await self.payload()
                except Exception as e:  # noqa: BLE001  (the learner could not make one, e.g. it died)
                    log.warning("role %s: no weights payload for restarted replica %d (%s); it waits for the "
                                "next publish", self.name, rep.index, e)
                    version, payload = -1, None  # matches no version: no work until it gets one
                if payload is not None:
                    await rep.handle.update_weights.remote(version, payload)
                rep.version = version
            else:
                rep.version = 0
            rep.alive, rep.idle_since = True, time.monotonic()
            if joined:
                log.info("role %s: replica %d joined (version %d)", self.name, rep.index, rep.version)
            else:
                log.warning("role %s: replica %d is back (version %d)", self.name, rep.index, rep.version)
        except ACTOR_ERRORS as e:
            rep.dead = True
            if all(r.dead for r in self.replicas):
                self.fatal = RoleError(describe_death(self, rep, e), lost_learner=self.spec.learner)
        except ray.exceptions.RayTaskError as e:
            self._rejected(rep, self.version, e)
        async with self._changed:
            self._changed.notify_all()

    async def broadcast(self, method: str, *args, **kwargs) -> list:
        """Call `method` on every live replica (e.g. load state); returns their results."""
        return await asyncio.gather(*[getattr(r.handle, method).remote(*args, **kwargs)
                                      for r in self.replicas if not r.dead])

    # ---- weights -----------------------------------------------------------------------------------
    async def set_weights(self, version: int, payload: ray.ObjectRef | None, wait: bool = True,
                          via: dict | None = None, export=None) -> None:
        """Send a published version to every replica. Each replica applies it between its requests
        (actor calls run in order); it gets new work only once it has acknowledged the version.
        `via`: replica index -> a payload of its own (CUDA IPC handles: actors.weight_ipc) that it
        tries first, falling back to the object store's; `export`: makes the object-store payload
        where `payload` is None (every replica had one of its own), only if one is needed."""
        if self.fatal is not None:
            raise self.fatal
        self.version, self.published = version, True
        self.weights, self.weights_version, self._export = payload, version, (export if payload is None else None)
        via = via or {}
        syncs = [self._sync(r, version, payload, via.get(r.index)) for r in self.replicas if r.alive]
        if wait:
            await asyncio.gather(*syncs)
            if self.fatal is not None:
                raise self.fatal
        else:  # a rejection is raised by the next call to this pool (it waits for the version)
            for s in syncs:
                asyncio.ensure_future(s)

    def mark_collective(self, version: int, export) -> None:
        """A collective channel broadcasts `version` now: replicas get work once they hold it, and
        one that restarts catches up from `await export()` -> `(version, payload_ref)`, called only then."""
        if self.fatal is not None:
            raise self.fatal
        self.version, self.published = version, True
        self.weights, self._export = None, export

    async def payload(self) -> tuple[int, ray.ObjectRef]:
        """`(version, payload)` of the current weights in the object store, made now if a collective
        channel has not made one yet. The learner may have moved past `self.version` (async stages):
        then the payload is its newer version, which the replica holds until the next publish."""
        async with self._exporting:
            if self._export is not None and (self.weights is None or self.weights_version < self.version):
                self.weights_version, self.weights = await self._export()
        if self.weights is None:
            raise RuntimeError(f"role {self.name!r}: no weights were published yet")
        return self.weights_version, self.weights

    async def holds(self, rep: Replica, version: int, lineage: int | None = None) -> None:
        """Record that `rep` installed `version` (a collective broadcast started in `lineage`)."""
        if lineage is None or lineage == self.lineage:  # not a broadcast of a learner since restarted
            rep.version = max(rep.version, version)
        async with self._changed:
            self._changed.notify_all()

    async def _sync(self, rep: Replica, version: int, payload, own=None) -> None:
        lineage = self.lineage
        try:
            if own is None or not await self._took_own(rep, version, own):
                if payload is None:  # every replica was to take a payload of its own: make the common one now
                    version, payload = await self.payload()
                await rep.handle.update_weights.remote(version, payload)
            if lineage == self.lineage:  # a sync still in flight from before a learner restart counts for nothing
                rep.version = max(rep.version, version)
        except ACTOR_ERRORS as e:
            self._lost(rep, e)
        except ray.exceptions.RayTaskError as e:
            self._rejected(rep, version, e)
        async with self._changed:
            self._changed.notify_all()

    own_fallbacks = 0  # replicas whose own payload (CUDA IPC) failed, served by the object store instead
    lineage = 0  # learner restarts so far: a version sent before one is not the restored learner's

    async def _took_own(self, rep: Replica, version: int, own) -> bool:
        """Install `version` from the replica's own payload; False where that failed for a reason the
        object store may not share (a handle it could not open; the learner's GPU too full for the
        copy it shares), which is then logged and counted. A payload that does not fit fails the
        same either way: raised."""
        try:
            await rep.handle.update_weights.remote(version, own)
            return True
        except ray.exceptions.RayTaskError as e:
            if type(e.cause).__name__ == "WeightMismatchError":
                raise
            from orchestrator.errors import actor_error_message
            self.own_fallbacks += 1
            log.warning("role %s: replica %d could not take weights version %d over CUDA IPC (%s); sending them "
                        "through the object store", self.name, rep.index, version,
                        actor_error_message(e).splitlines()[0][:300])
            return False

    def _rejected(self, rep: Replica, version: int, error: ray.exceptions.RayTaskError) -> None:
        """A live replica refused a weight update (keys, shapes, dtypes, a load that raised). It
        would wait for that version forever; the same payload would fail again on a restart, so
        the run stops with the cause (fail closed, never train on mixed weights)."""
        from orchestrator.errors import actor_error_message

        if self._out_of_memory("update_weights", error, rep.index):
            return
        if self.fatal is None:
            self.fatal = RoleError(f"role {self.name!r} ({self.class_name}): replica {rep.index} rejected weights "
                                   f"version {version}: {actor_error_message(error)}")
        log.error("%s", self.fatal)

    def lag(self, learner_version: int) -> int:
        """How many versions the oldest live replica is behind the learner."""
        live = [r.version for r in self.replicas if r.alive] or [self.version]
        return learner_version - min(live)

    def busy_s(self) -> float:
        return self.released_busy_s + sum(r.busy_s for r in self.replicas)

    def failures(self, max_age_s: float = 0.0) -> int:
        """Deaths of this role's replicas. A replica killed between calls that Ray restarted before
        the next call fails no call, so calls alone miss it: Ray's own restart count (from the
        GCS) is the floor, plus the final death of a replica whose restarts ran out. One GCS query
        for the job's actors, not one per replica, and none where the last one (for any pool) is
        younger than `max_age_s`: the loop asks every step, from the event loop."""
        table = _job_restarts(max_age_s)
        for rep in self.replicas:
            restarts = table.get(rep.handle._actor_id.hex()) if table is not None else _restarts(rep.handle)
            if restarts is not None:
                rep.failures = max(rep.failures, restarts + int(rep.dead))
        return self.released_failures + sum(r.failures for r in self.replicas)

    def shutdown(self) -> None:
        if self.elastic is not None:
            self.elastic.stop()
        for rep in self.replicas:
            ray.kill(rep.handle, no_restart=True)

    def forget_weights(self) -> None:
        """After a learner restart (the learner rolled back to a checkpoint): no version is published
        and no replica holds one, so the restored learner's next publish, an older version than the
        replicas hold, is what every replica takes before it gets work. Shared statistics start over
        (the restart's restore loads the checkpoint's)."""
        self.version, self.published, self.weights, self.weights_version, self._export = 0, False, None, 0, None
        self.lineage += 1
        for rep in self.replicas:
            rep.version = 0
        if self.held is not None:
            self.held = HeldState(self.held._merge)


def _restarts(handle) -> int | None:
    """How often Ray restarted an actor, or None where the GCS cannot say (no public API reads it
    without the dashboard, which is off by default)."""
    try:
        from ray._private.state import actors

        info = actors(handle._actor_id.hex())
        return int(info["NumRestarts"]) if info else None
    except Exception:  # noqa: BLE001  (a count for metrics: never worth failing a step over)
        return None


_restarts_read: tuple[str, float, dict[str, int] | None] = ("", float("-inf"), None)  # (job, when, table), last query


def _job_restarts(max_age_s: float = 0.0) -> dict[str, int] | None:
    """Ray's restart count of every actor of this driver's job, by actor id (hex); None where the
    GCS cannot say. At 32 replicas, a query per replica held the driver ~0.1-0.5 s a step on a
    loaded 2-core machine (benchmarks/orchestration_scaling.py); the one query for the job still
    cost ~1 ms of driver CPU per pool, so a table younger than `max_age_s` is reused."""
    global _restarts_read
    try:
        job = ray.get_runtime_context().get_job_id()
    except Exception:  # noqa: BLE001  (a count for metrics: never worth failing a step over)
        return None
    read_job, when, table = _restarts_read
    if read_job == job and time.monotonic() - when < max_age_s:  # another run of this process: its own
        return table
    try:
        from ray._private.state import actors

        table = {actor_id: int(info["NumRestarts"]) for actor_id, info in
                 actors(job_id=ray.JobID.from_hex(job)).items()}
    except Exception:  # noqa: BLE001
        table = None
    _restarts_read = (job, time.monotonic(), table)
    return table


def _is_stale(error: ray.exceptions.RayTaskError) -> bool:
    return type(error.cause).__name__ == "StaleReplicaError" if error.cause is not None else False


def describe_death(pool: Pool, rep: Replica, error: BaseException) -> str:
    return (f"every replica of role {pool.name!r} ({pool.class_name}) has died; the last, replica {rep.index}: "
            f"{exit_detail(error)}. The run cannot go on without it.")


def exit_detail(error: BaseException) -> str:
    """Ray's one-sentence reason an actor's process ended (e.g. 'Worker unexpectedly exits ...')."""
    import re

    detail = re.search(r"Worker exit detail: (.+?\.)", str(error))
    return detail.group(1).rstrip(".") if detail else type(error).__name__
