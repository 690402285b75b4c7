"""Elastic role pools: `roles.<name>.replicas: {min, max}` (docs/elastic.md).

The pool starts at `min`. After each step the loop tells it how busy the role was and how long the
learner waited on rollouts; while the role is the bottleneck (busier than `scale_up_busy_frac` of
the step, and the learner waited at least `scale_up_wait_frac` of it) the pool adds one replica per
step, up to `max`. A new replica is a Ray actor with the role's resource request: until a node has
room it is pending demand, which is what the Ray autoscaler reads to start nodes. It gets work only
once it holds the current weights (Pool.add_replica). A replica idle for `idle_timeout_s` is
released (killed, no restart), down to `min`. A replica that died for good (its node is gone and
its restarts ran out) is replaced, so the pool refills to its target when capacity returns.

Every scale event is a log line, a line the loop prints, and a count in the step's metrics
(`role/<name>/scale_ups`, `role/<name>/scale_downs`).
"""

from __future__ import annotations

import asyncio
import logging
import time

from orchestrator.names import RUN
from orchestrator.ray_metrics import scale_event

log = logging.getLogger("coevo")


class Elastic:
    def __init__(self, pool):
        self.pool = pool
        self.target = pool.spec.min_replicas
        self.scale_ups = self.scale_downs = 0
        self.events: list[str] = []  # lines for the loop to print, drained by take_events()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._reap_forever())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def observe(self, busy_frac: float, wait_frac: float) -> None:
        """One step's measurements: grow while the role is the bottleneck; refill what died."""
        spec = self.pool.spec
        if busy_frac >= spec.scale_up_busy_frac and wait_frac >= spec.scale_up_wait_frac and self.target < spec.max_replicas:
            self.target += 1
            self._event("up", f"busy {busy_frac:.0%} of the step, the learner waited {wait_frac:.0%} of it")
        self.refill()

    def refill(self) -> None:
        """Start replicas until the pool holds its target (dead ones do not count)."""
        while sum(not r.dead for r in self.pool.replicas) < self.target:
            rep = self.pool.add_replica()
            log.info("role %s: replica %d requested (pending until a node has room)", self.pool.name, rep.index)

    def reap(self, now: float | None = None) -> None:
        """Release replicas idle for idle_timeout_s, longest idle first, down to min; none while
        another replica is still joining (releasing a working one then would only thrash)."""
        pool, spec = self.pool, self.pool.spec
        now = time.monotonic() if now is None else now
        self._drop_dead()
        if any(not r.alive for r in pool.replicas):
            return  # replicas are joining or restarting: capacity is on its way, keep what works
        idle = sorted((r for r in pool.replicas if r.alive and not r.inflight and now - r.idle_since >= spec.idle_timeout_s),
                      key=lambda r: r.idle_since)
        for rep in idle:
            if len(pool.replicas) <= spec.min_replicas:
                break
            pool.release(rep)
            self.target = max(spec.min_replicas, self.target - 1)
            self._event("down", f"replica {rep.index} idle for {now - rep.idle_since:.0f}s "
                                f"(idle_timeout_s={spec.idle_timeout_s:g})")

    def _drop_dead(self) -> None:
        """Forget replicas that died for good (their deaths stay counted), so refill replaces them."""
        for rep in [r for r in self.pool.replicas if r.dead]:
            self.pool.release(rep)
        if self.pool.fatal is None:  # every replica dead is the end of the role (Pool._revive)
            self.refill()

    def _event(self, direction: str, why: str) -> None:
        if direction == "up":
            self.scale_ups += 1
        else:
            self.scale_downs += 1
        line = (f"role {self.pool.name}: scale {direction} to {self.target} replicas "
                f"({self.pool.live()} live, min {self.pool.spec.min_replicas}, max {self.pool.spec.max_replicas}): {why}")
        log.info("%s", line)
        self.events.append(line)
        scale_event(RUN.get() or "", self.pool.name, direction, self.target)  # Ray metrics: the dashboard's panel
        if direction == "up":
            self.refill()

    def take_events(self) -> list[str]:
        events, self.events = self.events, []
        return events

    def metrics(self) -> dict:
        name = self.pool.name
        return {f"role/{name}/replicas": self.pool.live(), f"role/{name}/target_replicas": self.target,
                f"role/{name}/scale_ups": self.scale_ups, f"role/{name}/scale_downs": self.scale_downs}

    async def _reap_forever(self) -> None:
        """Idle replicas are released between steps too (the loop may wait on something else)."""
        period = min(1.0, self.pool.spec.idle_timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            try:
                self.reap()
            except Exception as e:  # noqa: BLE001  (a failed release must not end the run; it is retried)
                log.warning("role %s: releasing idle replicas failed: %s", self.pool.name, e)
