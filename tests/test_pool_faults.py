"""Pool faults on one small in-process Ray cluster: a weight update a replica rejects, a replica that
hangs without dying, a replica killed between calls (every death is counted, also one Ray repairs
before the next call), and the verifier statistics the driver holds across replica restarts,
retries and checkpoints."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from types import SimpleNamespace

import numpy as np
import pytest
import ray

from orchestrator.roles import Pool, RoleError, RoleSpec

pytestmark = pytest.mark.slow
BOUND_S = 120  # a hang is a failure, not a stuck test run


@pytest.fixture(scope="module")
def cluster():
    from orchestrator import cluster as ray_cluster
    ray_cluster.connect(SimpleNamespace(address=None, num_cpus=2, dashboard=False))
    yield
    ray.shutdown()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, BOUND_S))


def worker_pool(replicas: int = 1, timeout_s: float | None = None, **kwargs) -> Pool:
    spec = RoleSpec("pool_actors:Worker", kind="generator", kwargs=kwargs, replicas=replicas, num_cpus=0,
                    timeout_s=timeout_s)
    return Pool("generator", spec, None)


# ---- 5: a rejected weight update -------------------------------------------------------------------
def test_a_rejected_async_weight_update_is_a_role_error_not_a_hang(cluster) -> None:
    async def main():
        pool = worker_pool(reject_version=2)
        await pool.ready()
        await pool.set_weights(1, ray.put({"version": 1}), wait=False)
        assert (await pool.call("work", 1, table=False))[0] == 1
        await pool.set_weights(2, ray.put({"version": 2}), wait=False)  # async mode: nobody awaits it
        with pytest.raises(RoleError) as err:
            await pool.call("work", 2, table=False)  # waited for version 2 forever before
        pool.shutdown()
        return str(err.value)

    msg = run(main())
    assert "role 'generator' (Worker): replica 0 rejected weights version 2" in msg
    assert "WeightMismatchError" in msg and "missing 1 keys" in msg


def test_a_rejected_strict_weight_update_raises_at_once(cluster) -> None:
    async def main():
        pool = worker_pool(replicas=2, reject_version=1)
        await pool.ready()
        with pytest.raises(RoleError, match="rejected weights version 1"):
            await pool.set_weights(1, ray.put({"version": 1}), wait=True)
        pool.shutdown()

    run(main())


# ---- 6: a hung replica -----------------------------------------------------------------------------
def test_a_hung_replica_is_restarted_and_its_work_retried_once(cluster, tmp_path) -> None:
    flag = tmp_path / "hang"
    flag.touch()

    async def main():
        pool = worker_pool(timeout_s=3, hang_once=str(flag))
        await pool.ready()
        before = await pool.call("ping", table=False)
        value, pid = await pool.call("work", 7, table=False)  # hangs, killed, restarted, retried
        after = await pool.call("ping", table=False)
        pool.shutdown()
        return before, value, pid, after, pool

    before, value, pid, after, pool = run(main())
    assert value == 7 and not flag.exists()
    assert pid == after != before  # answered by the restarted process
    assert pool.retries == 1 and pool.replicas[0].failures == 1


def test_work_that_hangs_twice_is_a_clear_error(cluster) -> None:
    async def main():
        pool = worker_pool(replicas=2, timeout_s=2, hang_always=True)
        await pool.ready()
        with pytest.raises(RoleError) as err:
            await pool.call("work", 1, table=False)
        pool.shutdown()
        return str(err.value), pool

    msg, pool = run(main())
    assert "role 'generator' (Worker): work on replica" in msg
    assert "no answer within roles.generator.timeout_s=2s for the second time (retried once)" in msg
    assert sum(r.failures for r in pool.replicas) == 2  # each replica timed out once: no third try


# ---- a replica killed between calls -------------------------------------------------------------
def test_a_replica_killed_between_calls_is_counted(cluster) -> None:
    from ray._private.state import actors

    from orchestrator.config import load_config

    pool = Pool("verifier", RoleSpec("actors.verifier:Verifier", kind="verifier", num_cpus=0), load_config(None, []))
    actor_id = pool.replicas[0].handle._actor_id.hex()

    async def kill_between_calls() -> None:
        await pool.ready()
        pid = actors(actor_id)["Pid"]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + BOUND_S  # Ray restarts it: a new process, the Verifier built again
        while time.monotonic() < deadline:
            info = actors(actor_id)
            if info["State"] == "ALIVE" and info["Pid"] not in (0, pid):
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail(f"the killed replica was not restarted: {actors(actor_id)['State']}")
        assert await pool.call("ping", table=False) == 0  # served by the restarted replica, no error

    run(kill_between_calls())
    assert pool.replicas[0].failures == 0  # no call saw the death ...
    assert pool.failures() == 1  # ... and it is counted all the same
    pool.shutdown()


# ---- 8: verifier statistics held by the driver -----------------------------------------------------
def verpo_config():
    from orchestrator.config import validate_config
    return validate_config({"rewards": [{"name": "verpo", "fn": "code_tests", "args": {"mode": "verpo"}}],
                            "rollout": {"samples_per_prompt": 4}})


def verifier_pool(cfg, replicas: int) -> Pool:
    return Pool("verifier", RoleSpec("actors.verifier:Verifier", kind="verifier", replicas=replicas, num_cpus=0),
                cfg)


def verpo_batch(name: str, prompts: list[str]):
    """VeRPO-scored samples of `prompts` whose uids are this batch's own."""
    import pyarrow as pa
    from test_code_verifier import verpo_table

    table = verpo_table(prompts)
    uids = pa.array([f"{name}.{u}" for u in table.column("uid").to_pylist()])
    return table.set_column(table.schema.get_field_index("uid"), "uid", uids)


def test_verifier_statistics_survive_restarts_count_retries_once_and_resume(cluster) -> None:
    from actors.verifier import Verifier

    cfg = verpo_config()
    batches = [verpo_batch("a", ["p0"]), verpo_batch("b", ["p0", "p1"]), verpo_batch("c", ["p1"])]
    alone = Verifier(cfg)  # the reference: one replica keeping its own counts, no faults
    try:
        expected = [alone.score(b)[0].column("reward.verpo").to_pylist() for b in batches]
    finally:
        alone.close()

    async def score(pool, batch):
        table, _ = await pool.call("score", batch)
        return ray.get(table).column("reward.verpo").to_pylist()

    async def main():
        pool = verifier_pool(cfg, replicas=2)
        await pool.ready()
        got = [await score(pool, batches[0])]
        for rep in pool.replicas:  # restart both replicas mid-run
            ray.kill(rep.handle, no_restart=False)
        got.append(await score(pool, batches[1]))
        saved = json.loads(json.dumps(pool.held.state_dict()))  # as the checkpoint stores it
        await score(pool, batches[1])  # the same batch again (a retry): counted once
        assert pool.held.state_dict() == saved
        pool.shutdown()
        resumed = verifier_pool(cfg, replicas=2)  # a resume: fresh replicas, the checkpoint's counts
        resumed.held.load_state_dict(saved)
        await resumed.ready()
        got.append(await score(resumed, batches[2]))
        # two batches of p1 at once, one on each replica: both deltas land in the one copy
        await asyncio.gather(score(resumed, verpo_batch("d", ["p1"])), score(resumed, verpo_batch("e", ["p1"])))
        both = [r.busy_s > 0 for r in resumed.replicas]
        final = resumed.held.state_dict()
        resumed.shutdown()
        return got, saved, final, both, pool

    got, saved, final, both, pool = run(main())
    assert sum(r.failures for r in pool.replicas) >= 1  # the restart was seen and its work retried
    for g, e in zip(got, expected):
        assert np.allclose(g, e)
    # p0: the passes [1,1,1], [0,1,0], [1,1,0], [0,0,0] of batch a, then again in batch b (decay 1)
    p0 = saved["state"]["verpo"]["verpo"]["p0"]
    assert np.allclose(p0[1], [8, 8, 8]) and np.allclose(p0[2], [4, 6, 2])
    assert np.allclose(saved["state"]["verpo"]["verpo"]["p1"][1], [4, 4, 4])
    assert all(both)
    p1 = final["state"]["verpo"]["verpo"]["p1"]  # b, c, d and e: 16 attempts, 8 passes of test 2
    assert np.allclose(p1[1], [16, 16, 16]) and np.allclose(p1[2], [8, 12, 4])


def test_a_weight_sync_in_flight_across_a_learner_restart_counts_for_nothing() -> None:
    """A replica that is still taking version 7 from the learner that died must not be recorded as
    holding it once the pool forgot its weights for the restored learner (it would then never take
    the restored learner's older version, and never get work: Pool._acquire waits for equal versions)."""

    async def main():
        pool = object.__new__(Pool)
        pool.name, pool.replicas, pool.held, pool.fatal = "generator", [], None, None
        pool.version, pool.published, pool.weights, pool.weights_version, pool._export = 7, True, None, 7, None
        pool._changed = asyncio.Condition()
        release = asyncio.Event()

        async def installing(*_):
            await release.wait()
            return 7

        rep = SimpleNamespace(index=0, version=6, alive=True,
                              handle=SimpleNamespace(update_weights=SimpleNamespace(remote=installing)))
        pool.replicas = [rep]
        sync = asyncio.ensure_future(pool._sync(rep, 7, payload=object()))
        await asyncio.sleep(0)
        pool.forget_weights()  # the learner died and restarts from an older checkpoint
        release.set()
        await sync
        stale = rep.version
        await pool.holds(rep, 7, lineage=0)  # a broadcast that finishes late, from before the restart
        late = rep.version
        after = asyncio.ensure_future(pool._sync(rep, 4, payload=object()))  # the restored learner's version
        await after
        return stale, late, rep.version

    assert asyncio.run(main()) == (0, 0, 4)
