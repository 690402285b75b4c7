"""The RL loop's metrics in Ray's metrics system (Prometheus, Grafana, the Ray dashboard), tagged with
the run, role and replica. Every metric coevo exports is defined here, once: the shipped Grafana
dashboard (dashboards/coevo_grafana.json) is checked against `METRICS` by a test.

Ray exports an application metric named `coevo_x` to Prometheus as `ray_coevo_x`; a Counter gets
`_total`, a Histogram `_bucket`, `_sum` and `_count` (docs/metrics.md#prometheus-and-grafana).
The per-step rows of metrics.jsonl are also mirrored as untagged `coevo_<key>` gauges
(orchestrator.metrics.MetricsSink), unchanged from before.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger("coevo")

STALENESS_BUCKETS = [0.5, 1.5, 2.5, 4.5, 8.5, 16.5]  # whole versions: 0, 1, 2, 3-4, 5-8, 9-16, more
PUBLISH_BUCKETS = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]  # seconds


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str  # gauge / counter / histogram
    tags: tuple[str, ...]
    description: str
    boundaries: tuple[float, ...] = ()

    def exported(self) -> list[str]:
        """The names Prometheus sees."""
        base = "ray_" + self.name
        return {"gauge": [base], "counter": [base + "_total"],
                "histogram": [base + "_bucket", base + "_sum", base + "_count"]}[self.kind]


METRICS = {m.name: m for m in [
    Metric("coevo_staleness", "histogram", ("run",), "versions a trained sample's policy lags the policy "
           "the generators hold when its batch is taken (one observation per trained piece: its samples were "
           "dispatched together and share it)", tuple(STALENESS_BUCKETS)),
    Metric("coevo_buffer_samples", "gauge", ("run", "state"), "samples in the rollout buffer (state=ready) "
           "and being generated or scored (state=inflight)"),
    Metric("coevo_role_busy_ratio", "gauge", ("run", "role"), "fraction of the last step a role's replicas "
           "were busy (1 - idle)"),
    Metric("coevo_weight_publish_seconds", "histogram", ("run",), "seconds to publish a weight version to "
           "every channel (time/publish_s)", tuple(PUBLISH_BUCKETS)),
    Metric("coevo_samples_per_second", "gauge", ("run",), "train samples per second of the last step"),
    Metric("coevo_tokens_per_second", "gauge", ("run",), "generated tokens per second of the last step"),
    Metric("coevo_reward", "gauge", ("run",), "mean reward of the last train batch"),
    Metric("coevo_heldout_accuracy", "gauge", ("run",), "held-out greedy accuracy at the last evaluation"),
    Metric("coevo_step", "gauge", ("run",), "the last finished train step"),
    Metric("coevo_weight_version", "gauge", ("run", "role", "replica"), "the weight version a replica holds "
           "(a learner: its latest version)"),
    Metric("coevo_replicas", "gauge", ("run", "role", "state"), "replicas of a role: state=live, min, max"),
    Metric("coevo_failures", "counter", ("run", "role", "replica"), "deaths of a replica (Ray restarts it)"),
    Metric("coevo_retries", "counter", ("run", "role"), "calls retried on another replica"),
    Metric("coevo_scale_events", "counter", ("run", "role", "direction"), "a role pool grew (direction=up) "
           "or shrank (direction=down)"),
]}

_made: dict = {}


def _metric(name: str):
    """The ray.util.metrics object for `name`, made once per process."""
    if name not in _made:
        from ray.util import metrics

        m = METRICS[name]
        if m.kind == "histogram":
            _made[name] = metrics.Histogram(name, m.description, boundaries=list(m.boundaries), tag_keys=m.tags)
        else:
            cls = metrics.Gauge if m.kind == "gauge" else metrics.Counter
            _made[name] = cls(name, m.description, tag_keys=m.tags)
    return _made[name]


def scale_event(run: str, role: str, direction: str, replicas: int | None = None) -> None:
    """Count a pool growing or shrinking, and log it (elastic pools call this; `run` is
    `orchestrator.names.RUN.get()` inside a run)."""
    if direction not in ("up", "down"):
        raise ValueError(f"scale_event: direction {direction!r} is not 'up' or 'down' (run {run!r}, role {role!r})")
    _metric("coevo_scale_events").inc(1, tags={"run": run, "role": role, "direction": direction})
    log.info("run %s: role %s scaled %s%s", run, role, direction, f" to {replicas} replicas" if replicas is not None else "")


class RunMetrics:
    """Records one run's step into Ray's metrics; counters advance by what changed since the last step."""

    def __init__(self, run: str):
        self.run = run
        self._counted: dict[tuple, int] = {}

    def _inc(self, name: str, total: int, tags: dict) -> None:
        key = (name, *sorted(tags.items()))
        delta = total - self._counted.get(key, 0)
        if delta > 0:
            _metric(name).inc(delta, tags={"run": self.run, **tags})
        self._counted[key] = max(total, self._counted.get(key, 0))

    def _set(self, name: str, value, **tags) -> None:
        if value is not None:
            _metric(name).set(float(value), tags={"run": self.run, **tags})

    def step(self, ctx, row: dict, pieces) -> None:
        run = {"run": self.run}
        current = getattr(ctx.pools.get("generator"), "version", None)
        if current is not None:
            for p in pieces:
                if getattr(p, "version", -1) >= 0:
                    _metric("coevo_staleness").observe(max(0, current - p.version), tags=run)
        if "time/publish_s" in row:
            _metric("coevo_weight_publish_seconds").observe(row["time/publish_s"], tags=run)
        rollouts = ctx.rollouts
        for state in ("ready", "inflight"):
            held = getattr(rollouts, state, None)
            if isinstance(held, dict):
                self._set("coevo_buffer_samples", sum(p.samples for p in held.values()), state=state)
        self._set("coevo_samples_per_second", row.get("throughput/samples_per_s"))
        self._set("coevo_tokens_per_second", row.get("throughput/tokens_per_s"))
        self._set("coevo_reward", row.get("reward/mean"))
        self._set("coevo_heldout_accuracy", row.get("eval/accuracy"))
        self._set("coevo_step", row["step"])
        for role, pool in ctx.pools.items():
            self._set("coevo_role_busy_ratio", row.get(f"role/{role}/busy_frac"), role=role)
            self.pool(pool, ctx.versions.get(role))

    def pool(self, pool, learner_version: int | None = None) -> None:
        """A pool's replicas, versions, failures and retries. Its bounds are its spec's
        `min_replicas` / `max_replicas` (both `replicas` for a fixed pool)."""
        spec = pool.spec
        live = sum(1 for r in pool.replicas if r.alive)
        bounds = {"live": live, "min": getattr(spec, "min_replicas", 0) or spec.replicas,
                  "max": getattr(spec, "max_replicas", 0) or spec.replicas}
        for state, n in bounds.items():
            self._set("coevo_replicas", n, role=pool.name, state=state)
        for rep in pool.replicas:
            version = learner_version if learner_version is not None else rep.version
            self._set("coevo_weight_version", version, role=pool.name, replica=str(rep.index))
            self._inc("coevo_failures", rep.failures, {"role": pool.name, "replica": str(rep.index)})
        self._inc("coevo_retries", pool.retries, {"role": pool.name})
