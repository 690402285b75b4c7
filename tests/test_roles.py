"""Role pools on a real embedded Ray: every death of a replica is counted, also one that happens
between calls and that Ray repairs before the next call (it fails no call)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest


@pytest.mark.slow
def test_a_replica_killed_between_calls_is_counted(monkeypatch, tmp_path) -> None:
    import ray
    from ray._private.state import actors

    from orchestrator.cluster import connect
    from orchestrator.config import load_config
    from orchestrator.roles import Pool, RoleSpec

    monkeypatch.setenv("RAY_TMPDIR", "/tmp")  # short: Unix socket paths are limited
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    config = load_config(None, ["ray.num_cpus=1"])
    connect(config.ray)
    try:
        pool = Pool("verifier", RoleSpec("actors.verifier:Verifier", num_cpus=0), config)
        actor_id = pool.replicas[0].handle._actor_id.hex()

        async def kill_between_calls() -> None:
            await pool.ready()
            pid = actors(actor_id)["Pid"]
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 120  # Ray restarts it: a new process, the Verifier built again
            while time.monotonic() < deadline:
                info = actors(actor_id)
                if info["State"] == "ALIVE" and info["Pid"] not in (0, pid):
                    break
                await asyncio.sleep(0.1)
            else:
                pytest.fail(f"the killed replica was not restarted: {actors(actor_id)['State']}")
            assert await pool.call("ping", table=False) == 0  # served by the restarted replica, no error

        asyncio.run(kill_between_calls())
        assert pool.replicas[0].failures == 0  # no call saw the death ...
        assert pool.failures() == 1  # ... and it is counted all the same
        pool.shutdown()
    finally:
        ray.shutdown()
