"""Weight channels: explicit edges from a learner to the pools that host its model.

Policy learner -> generators (and a judge); reward-model learner -> reward-model scorers. Each learner
counts its own versions. `weights.transport` picks how a version travels (docs/weights.md):
object_store publishes the learner's weights once and sends that one payload to every replica of
every target pool; collective broadcasts them over a process group of the learner and the live
replicas (actors.weight_transport). Either way a replica installs a version all or nothing.

With object_store, a replica on the learner's own GPU (`weights.cuda_ipc`, one learner rank) takes
the version through CUDA IPC handles to a copy the learner makes on that GPU in the replicas' dtype
(actors.weight_ipc); where that fails it gets the object store's payload, and the channel stops
trying IPC. Which replicas are colocated is asked of the actors themselves (node and GPU UUID),
only where the learner and a target role have GPUs: a CPU run makes no extra call.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import ray

from actors import weight_ipc
from actors.weight_transport import Link
from orchestrator.config import WeightsConfig
from orchestrator.roles import ACTOR_ERRORS, Pool, RoleError

log = logging.getLogger("coevo")


class Channel:
    def __init__(self, name: str, learner: Pool, targets: list[Pool], method: str = "publish"):
        self.name, self.learner, self.targets, self.method = name, learner, targets, method
        self.version = 0  # the learner version last published
        self.publishes = 0
        self.settings: WeightsConfig = learner.transport or WeightsConfig()
        self.epochs = 0  # collective groups formed
        self.fallbacks = 0  # replicas that got a version through the object store after a broken broadcast
        self.join_failures = 0  # new groups that did not form in weights.join_timeout_s (a member never came)
        self._id = uuid.uuid4().hex[:8]
        self._link: Link | None = None
        self._members: list | None = None
        self._inflight: asyncio.Future | None = None
        self._identify = weight_ipc.identity  # run in each actor (a test stands in its own)
        self._ipc_members: list | None = None  # the live replicas the colocation below was found for
        self._ipc_colocated: set = set()  # (pool name, replica index) on the learner's GPU
        self.ipc_broken = False  # an IPC update failed: the object store from then on
        self.ipc_publishes = 0

    @property
    def takes_payload(self) -> bool:
        """Whether `publish` can send weights the learner already exported (its `train_step_published`):
        not where every replica takes them over CUDA IPC (the object store's copy would go unused)."""
        return self.settings.transport != "collective" and self.method == "publish" and not self._all_ipc()

    async def publish(self, version: int, wait: bool = True, payload: ray.ObjectRef | None = None) -> None:
        """Publish the learner's weights at `version`. With `wait`, return once every replica holds
        them (strict on-policy); otherwise replicas take them between their requests. `payload`: the
        version's weights already in the object store (see `takes_payload`); else the learner makes them."""
        if self.settings.transport == "collective":
            if self._inflight is not None:  # one broadcast at a time, in order; raises what the last one hit
                previous, self._inflight = self._inflight, None
                await previous
            # the calls are submitted before this returns, so the learner's next call queues behind
            # its send (not the other way round, which would leave the replicas waiting a train step)
            started = await self._start(version)
            if started is not None:
                task = asyncio.ensure_future(self._finish(version, *started))
                if wait:
                    await task
                else:
                    self._inflight = task
        else:
            via = await self._ipc(version)
            if payload is None and not self._all_ipc():  # every rank of the learner takes part; not fetched
                payload, _ = await self.learner.call(self.method + "_parts")
            for pool in self.targets:
                await pool.set_weights(version, payload, wait=wait, via=via.get(pool.name), export=self._export)
        self.version = version
        self.publishes += 1

    # ---- CUDA IPC (object_store transport, colocated replicas) ---------------------------------------
    def _ipc_possible(self) -> bool:
        """Whether any replica could take CUDA IPC: asked of the actors only where this holds."""
        return (self.settings.cuda_ipc and not self.ipc_broken and self.method == "publish"
                and len(self.learner.replicas) == 1 and self.learner.spec.num_gpus > 0
                and any(pool.spec.num_gpus > 0 for pool in self.targets))

    def _all_ipc(self) -> bool:
        live = [(pool.name, rep.index) for pool in self.targets for rep in pool.replicas if rep.alive]
        return (self._ipc_possible() and self._ipc_members is not None and bool(live)
                and all(key in self._ipc_colocated for key in live))

    async def _colocated(self) -> set:
        """(pool, replica) keys of the live replicas on the learner's GPU, asked again when they change."""
        live = [(pool, rep) for pool in self.targets for rep in pool.replicas if rep.alive]
        members = [(pool.name, rep.index, rep.failures) for pool, rep in live]
        if members != self._ipc_members:
            learner = await self.learner.handles[0].__ray_call__.remote(self._identify)
            where = await asyncio.gather(*[rep.handle.__ray_call__.remote(self._identify) for _, rep in live])
            self._ipc_colocated = weight_ipc.colocated(learner, {(pool.name, rep.index): w
                                                                 for (pool, rep), w in zip(live, where)})
            self._ipc_members = members
        return self._ipc_colocated

    async def _ipc(self, version: int) -> dict:
        """{pool name: {replica index: the IPC payload ref}} for this publish; {} where none applies.
        The export runs in the learner and is not awaited: a replica that gets a failed one falls back."""
        if self.ipc_broken or not self._ipc_possible():
            return {}
        if sum(pool.own_fallbacks for pool in self.targets):  # a replica could not take the last one
            self.ipc_broken = True
            log.warning("channel %s: CUDA IPC failed; weights go through the object store from now on", self.name)
            return {}
        colocated = await self._colocated()
        if not colocated:
            return {}
        from actors.modeling import inference_dtype
        model = getattr(self.learner._config, "model", None)
        dtype = str(inference_dtype(getattr(model, "dtype", "auto"), "cuda")).removeprefix("torch.")
        ref = self.learner.handles[0].__ray_call__.remote(weight_ipc.export, dtype)
        self.ipc_publishes += 1
        via: dict = {}
        for pool_name, index in colocated:
            via.setdefault(pool_name, {})[index] = ref
        return via

    def lag(self, learner_version: int) -> int:
        """Versions the most out-of-date replica of this channel's targets is behind the learner."""
        return max((pool.lag(learner_version) for pool in self.targets), default=0)

    # ---- collective --------------------------------------------------------------------------------
    def backend(self) -> str:
        pools = [self.learner, *self.targets]
        if self.settings.backend == "auto":
            return "nccl" if all(p.spec.num_gpus > 0 for p in pools) else "gloo"
        if self.settings.backend == "nccl" and not all(p.spec.num_gpus > 0 for p in pools):
            cpu = [p.name for p in pools if p.spec.num_gpus <= 0]
            raise RoleError(f"weights.backend=nccl needs a GPU on the learner and every replica of channel "
                            f"{self.name!r}, but roles {cpu} have num_gpus=0; use weights.backend=gloo or auto")
        return self.settings.backend

    async def _export(self) -> tuple[int, ray.ObjectRef]:
        """`(version, payload)` in the object store, for a replica that catches up (every rank takes part)."""
        payload, info = await self.learner.call(self.method + "_parts")
        return info["version"], payload

    async def _epoch(self, live: list) -> tuple[Link, bool]:
        """The group for these live replicas: the current one, or a new epoch when they changed
        (a replica joined, died or restarted). Returns the link and whether it is new."""
        members = [(pool.name, rep.index, rep.failures) for pool, rep in live]
        if self._link is not None and members == self._members:
            return self._link, False
        self.epochs += 1
        group = f"{self.name}-{self._id}-{self.epochs}"
        host, port = await self.learner.handles[0].open_weights.remote(self.name, group, self.settings.timeout_s)
        self._link = Link(self.name, group, host, port, len(live) + 1, self.backend(), self.settings.timeout_s,
                          self.settings.bucket_mb, self.settings.join_timeout_s)
        self._members = members
        return self._link, True

    async def _start(self, version: int):
        """Mark the version, form the group if needed, submit the send and every receive."""
        for pool in self.targets:
            pool.mark_collective(version, self._export)
        live = [(pool, rep) for pool in self.targets for rep in pool.replicas if rep.alive]
        if not live:
            return None  # replicas that come back catch up through the object store
        link, join = await self._epoch(live)
        # every rank calls it (a sharded model is gathered first); rank 0 sends
        send = asyncio.ensure_future(self.learner.call("send_weights", link, version, table=False))
        await asyncio.sleep(0)  # let it submit the calls now, ahead of the learner's next one
        receives = [asyncio.ensure_future(_answer(rep.handle.receive_weights.remote(link, i + 1, version, join)))
                    for i, (_, rep) in enumerate(live)]
        return live, send, receives

    async def _finish(self, version: int, live: list, send, receives: list) -> None:
        """Record who holds the version; dead replicas restart, the others that missed it get it
        through the object store, and a broken group is replaced at the next publish."""
        lineages = {pool.name: pool.lineage for pool in self.targets}
        try:
            answer = await send
            sent = answer.get("error")
            if answer.get("not_joined"):
                self.join_failures += 1
        except ACTOR_ERRORS as e:
            raise RoleError(f"channel {self.name!r}: the learner died while broadcasting version {version}: {e}",
                            lost_learner=True) from None
        except ray.exceptions.RayTaskError as e:
            sent = _first_line(e)
        # receivers finish with the sender; one stuck behind a long call gets the object store instead
        done, _ = await asyncio.wait(receives, timeout=self.settings.timeout_s)
        fallback = []
        for (pool, rep), task in zip(live, receives):
            error = task.result() if task in done else TimeoutError(f"no answer in {self.settings.timeout_s:g}s")
            if error is None:
                await pool.holds(rep, version, lineages[pool.name])
            elif isinstance(error, ACTOR_ERRORS):
                pool._lost(rep, error)
            elif isinstance(error, ray.exceptions.RayTaskError) and type(error.cause).__name__ == "WeightMismatchError":
                pool._rejected(rep, version, error)
            else:
                fallback.append((pool, rep, error))
        if sent is not None or fallback or len(done) < len(receives):
            self._link = None  # the next publish forms a new group with whoever is live then
        if sent is not None:
            log.warning("channel %s: broadcast of version %d failed on the learner: %s", self.name, version, sent)
        for pool, rep, error in fallback:
            log.warning("channel %s: replica %d of %s did not take version %d over the group (%s); sending it "
                        "through the object store", self.name, rep.index, pool.name, version, _first_line(error))
            self.fallbacks += 1
            await pool._sync(rep, *await pool.payload())
        for pool in self.targets:
            if pool.fatal is not None:
                raise pool.fatal


async def _answer(ref) -> BaseException | None:
    """None once the replica installed the version, else what it raised."""
    try:
        await ref
        return None
    except (ray.exceptions.RayError, ray.exceptions.RayTaskError) as e:
        return e


def _first_line(error: BaseException) -> str:
    from orchestrator.errors import actor_error_message

    if isinstance(error, ray.exceptions.RayTaskError):
        return actor_error_message(error).splitlines()[0]
    return str(error).splitlines()[0] if str(error) else type(error).__name__
