"""Connecting to Ray the way its users run it: an address (flag, config or RAY_ADDRESS, which
`ray job submit` sets) joins an existing cluster; otherwise an embedded local cluster starts."""

from __future__ import annotations

import logging
import os
import sys

import ray


def connect(ray_cfg) -> tuple[str, bool]:
    """Start or join Ray; returns a one-line description and whether the cluster is local."""
    address = ray_cfg.address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=True)
        global DASHBOARD
        DASHBOARD = dashboard_url()
        return f"joined Ray cluster at {address}", False
    # Workers must import the user's `module:function` code the way the driver does (a job's
    # --working-dir does this on a cluster). They inherit it from the raylet this call starts: a
    # job-level runtime_env would do the same but keeps Ray from using its prestarted workers
    # (measured: three actors up 0.8-1.3 s later).
    path = os.pathsep.join(p for p in [os.getcwd(), *sys.path] if p)
    # An embedded cluster serves this process only: bind it (and its dashboard) to loopback, not the
    # machine's address, unless the user asked otherwise. Ray reads this switch at import, so the
    # already-imported module is told too; the processes it starts read the environment.
    from ray._private import ray_constants

    os.environ.setdefault(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, "0")
    ray_constants.ENABLE_RAY_CLUSTER = os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR].lower() in ("1", "true")
    _token_auth_quietly()
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = path
    try:
        # "local": a new cluster even where another was started on this machine; with no address
        # Ray would join the last one `ray start` recorded (ray_current_cluster), whoever owns it
        ray.init(address="local", num_cpus=ray_cfg.num_cpus, num_gpus=getattr(ray_cfg, "num_gpus", None),
                 include_dashboard=ray_cfg.dashboard,
                 logging_level=logging.WARNING, dashboard_host="127.0.0.1")
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before
    where = ray.get_runtime_context().gcs_address
    have = ray.cluster_resources()
    gpus = f", {have['GPU']:g} GPU{'s' * (have['GPU'] != 1)}" if have.get("GPU") else ""
    return f"started a local Ray cluster ({int(have.get('CPU', 0))} CPUs{gpus}, {where})", True


DASHBOARD: str | None = None  # the joined cluster's dashboard (job submission) address, once connected


def dashboard_url() -> str | None:
    """The connected cluster's dashboard address, `http://host:port` (None: it has none)."""
    try:
        from ray._private.services import get_webui_url_from_internal_kv
        url = get_webui_url_from_internal_kv()
    except Exception:  # noqa: BLE001  (a Ray without this record: the hint falls back to a placeholder)
        return None
    return None if not url else url if "://" in url else f"http://{url}"


def _token_auth_quietly() -> None:
    """Ray (2.52+) turns token auth on for a new local cluster and logs a warning at every start
    unless RAY_AUTH_MODE is set. Do what it does by default (token mode for this process and its
    children; ray.init then makes a token if none exists), minus the warning, so job logs keep to
    coevo's lines. An explicit RAY_AUTH_MODE is left alone."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    try:
        from ray._private.authentication.authentication_token_setup import _enable_token_auth
    except ImportError:  # a Ray without token auth
        return
    _enable_token_auth()


def check_resources(config, roles: dict, local: bool) -> None:
    """An embedded cluster never grows: asking for more than it has would wait forever."""
    from orchestrator.roles import resolve

    want = {"CPU": 0.0, "GPU": 0.0}
    for name, spec in roles.items():
        spec = resolve(spec, config.roles.get(name), config)
        want["CPU"] += spec.replicas * spec.num_cpus
        want["GPU"] += spec.replicas * spec.num_gpus
        for key, amount in spec.resources.items():
            want[key] = want.get(key, 0.0) + spec.replicas * amount
    have = ray.cluster_resources()
    short = {k: (n, have.get(k, 0)) for k, n in want.items() if n > have.get(k, 0)}
    if not short:
        if local:
            _elastic_room(config, roles, want, have)
        return
    text = ", ".join(f"{n:g} {k} (the cluster has {h:g})" for k, (n, h) in short.items())
    msg = (f"the roles ask for {text}: see roles.<name>.replicas / num_cpus / num_gpus / resources "
           f"for roles {sorted(roles)}")
    if local:
        from orchestrator.config import ConfigError
        raise ConfigError(msg + " (or ray.num_cpus for the local cluster)")
    logging.getLogger("coevo").warning("%s; waiting for the autoscaler to add nodes", msg)


def shutdown() -> None:
    if ray.is_initialized():
        ray.shutdown()


def _elastic_room(config, roles: dict, want: dict, have: dict) -> None:
    """An elastic role on the embedded cluster can grow only into its free room: say so up front,
    rather than leave replicas pending for ever without a word."""
    from orchestrator.roles import resolve

    for name, spec in roles.items():
        spec = resolve(spec, config.roles.get(name), config)
        if not spec.elastic:
            continue
        need = {"CPU": spec.num_cpus, "GPU": spec.num_gpus, **spec.resources}
        room = min((int((have.get(k, 0) - want.get(k, 0)) // n) for k, n in need.items() if n), default=spec.max_replicas)
        if spec.min_replicas + room < spec.max_replicas:
            logging.getLogger("coevo").warning(
                "roles.%s.replicas max %d: the local cluster has room for %d more replica(s) beside the other "
                "roles, so the pool grows to %d at most (ray.num_cpus / ray.num_gpus, or join a cluster that "
                "the autoscaler grows)", name, spec.max_replicas, room, spec.min_replicas + room)
