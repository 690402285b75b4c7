"""`coevo status`: the coevo runs on a Ray cluster.

Each run's driver keeps a small JSON record in the cluster's GCS key-value store (namespace `coevo`,
key `run/<job id>/<run name>`), rewritten after every step and marked finished/stopped/failed at the
end: roles with their replicas (live/min/max) and weight versions, staleness, throughput, reward and
the last held-out accuracy. `coevo status` reads those records and checks them against Ray's own
state: the live actors named `<run>/<role>/<index>` (orchestrator.names) in that job's namespace. A
record says "running" but no actor is alive: its driver died without saying so ("gone"). The
records are small and go with the cluster (the GCS store is not persisted across a restart).
"""

from __future__ import annotations

import json
import time

KV_NAMESPACE = "coevo"
PREFIX = "run/"


def record(ctx, row: dict, previous: dict | None) -> dict:
    """The status record after a step (`previous` keeps the last accuracy between evaluations)."""
    import ray

    rt = ray.get_runtime_context()
    prev = previous or {}
    accuracy = row.get("eval/accuracy")
    roles = {}
    for name, pool in ctx.pools.items():
        roles[name] = {"kind": pool.spec.kind, "live": sum(1 for r in pool.replicas if r.alive),
                       "min": getattr(pool.spec, "min_replicas", 0) or pool.spec.replicas,
                       "max": getattr(pool.spec, "max_replicas", 0) or pool.spec.replicas,
                       "versions": sorted({ctx.versions[name]} if name in ctx.versions else
                                          {r.version for r in pool.replicas if r.alive}),
                       "busy": row.get(f"role/{name}/busy_frac"),
                       "failures": row.get(f"role/{name}/failures", 0), "retries": row.get(f"role/{name}/retries", 0)}
    lags = [v for k, v in row.items() if k.startswith("channel/") and k.endswith("/lag")]
    return {"run": ctx.run_dir.name, "run_dir": str(ctx.run_dir), "recipe": ctx.config.recipe,
            "job_id": rt.get_job_id(), "namespace": rt.namespace, "state": "running", "updated": time.time(),
            "step": row["step"], "max_steps": ctx.config.train.max_steps, "roles": roles,
            "staleness_max": row.get("policy/staleness_max"), "lag_max": max(lags) if lags else None,
            "samples_per_s": row.get("throughput/samples_per_s"), "tokens_per_s": row.get("throughput/tokens_per_s"),
            "reward": row.get("reward/mean"),
            "accuracy": accuracy if accuracy is not None else prev.get("accuracy"),
            "accuracy_step": row["step"] if accuracy is not None else prev.get("accuracy_step")}


def _key(rec: dict) -> bytes:
    return f"{PREFIX}{rec['job_id']}/{rec['run']}".encode()


def publish(rec: dict) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(_key(rec), json.dumps(rec).encode(), overwrite=True, namespace=KV_NAMESPACE)


def read_runs() -> list[dict]:
    """Every run's record on the connected cluster, with `live` counts from Ray's actor table."""
    from ray._private.state import actors
    from ray.experimental import internal_kv

    keys = internal_kv._internal_kv_list(PREFIX, namespace=KV_NAMESPACE)
    runs = []
    for key in keys:
        raw = internal_kv._internal_kv_get(key, namespace=KV_NAMESPACE)
        if raw is None:
            continue
        try:
            runs.append(json.loads(raw))
        except json.JSONDecodeError as e:
            raise ValueError(f"coevo status: the record at GCS key {key.decode()!r} (namespace {KV_NAMESPACE!r}) "
                             f"is not JSON: {e}") from None
    alive: dict[tuple[str, str], int] = {}
    for info in actors().values():
        name = info.get("Name") or ""
        if info.get("State") == "ALIVE" and name.count("/") >= 2:
            run, role, _ = name.rsplit("/", 2)
            key = (info.get("JobID"), run, role)
            alive[key] = alive.get(key, 0) + 1
    for rec in runs:
        job = rec["job_id"]
        for role, info in rec["roles"].items():
            info["actors_alive"] = alive.get((job, rec["run"], role), 0)
        if rec["state"] == "running" and not any(r["actors_alive"] for r in rec["roles"].values()):
            rec["state"] = "gone"  # its driver ended without a word (killed): its actors went with it
    return sorted(runs, key=lambda r: r["updated"], reverse=True)


def _num(value, fmt: str = "{:.3g}") -> str:
    return "-" if value is None else fmt.format(value)


def format_runs(runs: list[dict], now: float | None = None) -> str:
    """The table `coevo status` prints."""
    if not runs:
        return "no coevo runs on this cluster"
    now = time.time() if now is None else now
    lines = []
    for rec in runs:
        acc = "-" if rec["accuracy"] is None else f"{rec['accuracy']:.3f} (step {rec['accuracy_step']})"
        lines.append(f"{rec['run']}  [{rec['state']}, updated {now - rec['updated']:.0f}s ago]  recipe {rec['recipe']}  "
                     f"job {rec['job_id']}  step {rec['step']}/{rec['max_steps']}")
        lines.append(f"  dir {rec['run_dir']}")
        lines.append(f"  {_num(rec['samples_per_s'], '{:.1f}')} samples/s  {_num(rec['tokens_per_s'], '{:.0f}')} "
                     f"tokens/s  reward {_num(rec['reward'])}  accuracy {acc}  staleness max "
                     f"{_num(rec['staleness_max'], '{}')}  channel lag max {_num(rec['lag_max'], '{}')}")
        lines.append(f"  {'role':<18}{'kind':<11}{'live/min/max':<14}{'actors':<8}{'versions':<12}{'busy':<7}"
                     "failures retries")
        for role, r in rec["roles"].items():
            versions = ",".join(map(str, r["versions"])) or "-"
            counts = f"{r['live']}/{r['min']}/{r['max']}"
            lines.append(f"  {role:<18}{r['kind']:<11}{counts:<14}"
                         f"{r.get('actors_alive', '-')!s:<8}{versions:<12}{_num(r['busy'], '{:.2f}'):<7}"
                         f"{r['failures']:<9}{r['retries']}")
    return "\n".join(lines)
