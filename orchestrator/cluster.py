"""Connecting to Ray the way its users run it: an address (flag, config or RAY_ADDRESS, which
`ray job submit` sets) joins an existing cluster; otherwise an embedded local cluster starts."""

from __future__ import annotations

import logging
import os
import sys

import ray


def connect(ray_cfg) -> str:
    """Start or join Ray; returns a one-line description for the user."""
    address = ray_cfg.address or os.environ.get("RAY_ADDRESS")
    # Workers must import the user's `module:function` code the way the driver does.
    env = {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in [os.getcwd(), *sys.path] if p)}}
    if address:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=True)
        return f"joined Ray cluster at {address}"
    ray.init(num_cpus=ray_cfg.num_cpus, include_dashboard=ray_cfg.dashboard, runtime_env=env,
             logging_level=logging.WARNING)
    where = ray.get_runtime_context().gcs_address
    return f"started a local Ray cluster ({int(ray.cluster_resources().get('CPU', 0))} CPUs, {where})"


def shutdown() -> None:
    if ray.is_initialized():
        ray.shutdown()
