"""Elastic role pools (orchestrator.elastic): config checks, scale-up under the Ray autoscaler and
drain to min, and a preempted node, each on a fake multi-node cluster on loopback.

The autoscaling test builds what ray.cluster_utils.AutoscalingCluster builds (a head whose monitor
runs the fake multi-node provider), in this process with ray.cluster_utils.Cluster: the installed
Ray lacks the example.yaml AutoscalingCluster reads, and its start() runs `ray stop --force`, which
would end every other Ray cluster on the machine. Everything it starts is stopped by PID."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest

from orchestrator.config import ConfigError, validate_config

BOUND_S = 150  # a stuck scale-up is a failure, not a stuck test run
TESTS = Path(__file__).resolve().parent


# ---- config ----------------------------------------------------------------------------------------
def test_replicas_accepts_min_max_and_starts_at_min() -> None:
    from orchestrator.roles import RoleSpec, resolve

    cfg = validate_config({"roles": {"generator": {"replicas": {"min": 1, "max": 3}, "idle_timeout_s": 5}}})
    spec = resolve(RoleSpec("pool_actors:Worker", kind="generator"), cfg.roles["generator"], cfg)
    assert (spec.replicas, spec.min_replicas, spec.max_replicas, spec.elastic) == (1, 1, 3, True)
    assert spec.idle_timeout_s == 5
    fixed = resolve(RoleSpec("pool_actors:Worker", kind="generator"), validate_config(
        {"roles": {"generator": {"replicas": 2}}}).roles["generator"], cfg)
    assert (fixed.replicas, fixed.max_replicas, fixed.elastic) == (2, 2, False)


def test_a_learner_cannot_be_elastic() -> None:
    with pytest.raises(ConfigError) as err:
        validate_config({"roles": {"policy_learner": {"replicas": {"min": 1, "max": 2}}}})
    assert "roles.policy_learner.replicas={min: 1, max: 2}: policy_learner is a learner" in str(err.value)
    assert "cannot grow or shrink mid-run" in str(err.value)


def test_max_below_min_names_both() -> None:
    with pytest.raises(ConfigError, match="replicas: max 2 is below min 3"):
        validate_config({"roles": {"generator": {"replicas": {"min": 3, "max": 2}}}})


# ---- on a fake multi-node cluster ---------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fake_nodes(monkeypatch, tmp_path):
    """Workers import tests/pool_actors.py; nodes bind to loopback; the fake provider may run."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), str(TESTS.parent), *sys.path]))
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    from ray._private import ray_constants
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
    monkeypatch.setenv("RAY_FAKE_CLUSTER", "1")
    monkeypatch.setenv("AUTOSCALER_UPDATE_INTERVAL_S", "1")
    return tmp_path


def autoscaling_config(path: Path, port: int, head_cpus: int, worker_cpus: int, max_workers: int) -> str:
    """The fake multi-node provider's cluster config (Ray's fake_multi_node/example.yaml, trimmed)."""
    config = {"cluster_name": "coevo-elastic-test", "max_workers": max_workers,
              "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                           "disable_launch_config_check": True, "gcs_address": f"127.0.0.1:{port}"},
              "available_node_types": {
                  "ray.head.default": {"resources": {"CPU": head_cpus}, "node_config": {}, "max_workers": 0},
                  "ray.worker.cpu": {"resources": {"CPU": worker_cpus, "object_store_memory": 100 * 2**20},
                                     "node_config": {}, "min_workers": 0, "max_workers": max_workers}},
              "head_node_type": "ray.head.default", "auth": {}, "upscaling_speed": 1.0,
              "idle_timeout_minutes": 0.05, "docker": {}, "initialization_commands": [], "setup_commands": [],
              "head_setup_commands": [], "worker_setup_commands": [], "head_start_ray_commands": [],
              "worker_start_ray_commands": [], "file_mounts": {}, "cluster_synced_files": [],
              "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": []}
    path.write_text(json.dumps(config))
    return str(path)


def stop(cluster, extra_pids: list[int]) -> None:
    """Shut the cluster down, then any process the monitor started (the fake worker nodes), by PID."""
    import psutil
    import ray

    ray.shutdown()
    cluster.shutdown()
    for pid in extra_pids:
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass


def descendants(pid: int) -> list[int]:
    import psutil
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def elastic_pool(replicas: dict, idle_timeout_s: float = 60.0, num_cpus: float = 1):
    from orchestrator.roles import Pool, RoleSpec
    spec = RoleSpec("pool_actors:Worker", kind="generator", replicas=replicas, num_cpus=num_cpus,
                    idle_timeout_s=idle_timeout_s, max_restarts=-1)
    return Pool("generator", spec, None)


async def until(predicate, what: str, pool=None, bound_s: float = BOUND_S) -> None:
    deadline = time.monotonic() + bound_s
    while not predicate():
        if time.monotonic() > deadline:
            state = [(r.index, r.alive, r.dead, r.version) for r in pool.replicas] if pool else ""
            pytest.fail(f"not within {bound_s}s: {what} {state}")
        await asyncio.sleep(0.2)


async def keep_busy(pool) -> None:
    while True:
        await pool.call("held", -1, 0.3, table=False, versioned=True)


@pytest.mark.long
@pytest.mark.slow
def test_autoscaler_grows_the_pool_to_max_then_it_drains_to_min(fake_nodes) -> None:
    """The head has room for 1 of 3 replicas: the two the pool adds are pending demand until the
    autoscaler starts a node for each; they serve only the newest weights; idle, they are released."""
    import ray
    from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID
    from ray.cluster_utils import Cluster

    port = free_port()
    config = autoscaling_config(fake_nodes / "autoscaler.json", port, head_cpus=1, worker_cpus=1, max_workers=2)
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "gcs_server_port": port, "node_ip_address": "127.0.0.1", "autoscaling_config": config,
        "include_dashboard": False,
        # the fake provider knows the head by this id (as `ray start --head` gives it under RAY_FAKE_CLUSTER)
        "env_vars": {"RAY_OVERRIDE_NODE_ID_FOR_TESTING": FAKE_HEAD_NODE_ID}})
    monitor = cluster.head_node.all_processes["monitor"][0].process.pid
    started: list[int] = []
    try:
        ray.init(address=cluster.address)

        async def main():
            pool = elastic_pool({"min": 1, "max": 3}, idle_timeout_s=3)
            await pool.ready()
            await pool.set_weights(1, ray.put({"version": 1}))
            pool.elastic.observe(busy_frac=1.0, wait_frac=0.5)  # the bottleneck: one more ...
            pool.elastic.observe(busy_frac=0.95, wait_frac=0.2)  # ... and one more
            pool.elastic.observe(busy_frac=1.0, wait_frac=0.5)  # at max: no more
            assert pool.elastic.target == 3 and len(pool.replicas) == 3 and pool.live() == 1
            await pool.set_weights(2, ray.put({"version": 2}))  # published while the newcomers wait for nodes
            busy = asyncio.ensure_future(keep_busy(pool))  # the run goes on while nodes start
            await until(lambda: pool.live() == 3, "the autoscaler added nodes for the 2 pending replicas", pool)
            started.extend(descendants(monitor))
            nodes = [n for n in ray.nodes() if n["Alive"]]
            results = await asyncio.gather(*[pool.call("held", i, 0.3, table=False, versioned=True)
                                             for i in range(12)])
            busy.cancel()
            served_by = {pid for _, pid, _ in results}
            grown = (len(nodes), pool.live(), served_by, {v for _, _, v in results}, sorted(x for x, _, _ in results))
            await until(lambda: len(pool.replicas) == 1, "idle replicas released down to min", pool)
            lines = pool.elastic.take_events()
            drained = (pool.live(), pool.elastic.scale_ups, pool.elastic.scale_downs, pool.elastic.metrics())
            pool.shutdown()
            return grown, drained, lines

        grown, drained, lines = asyncio.run(asyncio.wait_for(main(), 2 * BOUND_S))
    finally:
        stop(cluster, started + descendants(monitor))
    nodes, live, served_by, versions, xs = grown
    assert nodes == 3 and live == 3  # head + 2 nodes the autoscaler started
    assert len(served_by) == 3  # every replica got work, the newcomers too ...
    assert versions == {2}  # ... only with the version published while they were pending
    assert xs == list(range(12))
    assert drained[:3] == (1, 2, 2)
    assert drained[3] == {"role/generator/replicas": 1, "role/generator/target_replicas": 1,
                          "role/generator/scale_ups": 2, "role/generator/scale_downs": 2}
    assert sum(line.startswith("role generator: scale up to") for line in lines) == 2
    assert sum("scale down to" in line and "idle_timeout_s=3" in line for line in lines) == 2


@pytest.mark.slow
def test_a_preempted_node_loses_no_work_and_the_pool_refills(fake_nodes) -> None:
    """Two replicas on two worker nodes; one node is removed mid-run: its work is retried on the
    other replica, every input answered once, the death counted; a new node brings the pool back."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "node_ip_address": "127.0.0.1",
                                                            "include_dashboard": False})
    nodes = [cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1") for _ in range(2)]
    try:
        ray.init(address=cluster.address)

        async def main():
            pool = elastic_pool({"min": 2, "max": 3})
            await pool.ready()
            await pool.set_weights(1, ray.put({"version": 1}))
            work = [asyncio.ensure_future(pool.call("held", i, 0.25, table=False, versioned=True)) for i in range(16)]
            await until(lambda: sum(w.done() for w in work) >= 3, "some work done before the preemption")
            cluster.remove_node(nodes[0], allow_graceful=False)  # the node is gone, its replica with it
            results = await asyncio.gather(*work)
            lost = (pool.failures(), pool.retries, pool.live())
            cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")  # capacity returns
            await until(lambda: pool.live() == 2, "the pool refilled to 2 replicas", pool)
            again = await asyncio.gather(*[pool.call("held", i, 0.0, table=False, versioned=True) for i in range(4)])
            pool.shutdown()
            return results, lost, again

        results, lost, again = asyncio.run(asyncio.wait_for(main(), 2 * BOUND_S))
    finally:
        stop(cluster, [])
    assert sorted(x for x, _, _ in results) == list(range(16))  # nothing lost, nothing twice
    assert {v for _, _, v in results} == {1}
    failures, retries, live = lost
    assert failures >= 1 and retries >= 1 and live == 1
    assert sorted(x for x, _, _ in again) == list(range(4)) and {v for _, _, v in again} == {1}


@pytest.mark.long
@pytest.mark.slow
def test_a_run_grows_its_generator_pool_and_loses_no_sample(ray_env, warm_cache, tmp_path) -> None:
    """The loop's measurements drive the pool: thresholds low enough that step 1 is a bottleneck;
    the replica it adds joins mid-run (the embedded cluster has a CPU for it). Steps are ~0.25 s
    and a generator took ~20 s to start on a loaded 2-core machine: 150 steps leave room."""
    from coevo_cli import coevo, read_metrics, small

    run_dir = tmp_path / "run"
    out = coevo(small(warm_cache, "train.max_steps=150", "train.eval_every=150", "ray.num_cpus=3",
                      "roles.generator.replicas={min: 1, max: 2}", "roles.generator.scale_up_busy_frac=0.01",
                      "roles.generator.scale_up_wait_frac=0", "--output-dir", str(run_dir)),
                ray_env, tmp_path, timeout=400)
    rows = read_metrics(run_dir)
    assert "role generator: scale up to 2 replicas (1 live, min 1, max 2)" in out
    assert rows[0]["role/generator/scale_ups"] == 1 and rows[-1]["role/generator/scale_ups"] == 1  # max is 2
    assert rows[-1]["role/generator/replicas"] == 2  # the newcomer joined and is live
    assert all(r["samples/lost"] == 0 for r in rows)
    assert rows[-1]["samples/consumed"] == 150 * 32


def test_an_elastic_role_the_local_cluster_cannot_hold_is_named(caplog) -> None:
    from orchestrator.cluster import _elastic_room
    from orchestrator.roles import RoleSpec

    cfg = validate_config({"roles": {"generator": {"replicas": {"min": 1, "max": 4}}}})
    roles = {"generator": RoleSpec("pool_actors:Worker", kind="generator", num_cpus=1)}
    with caplog.at_level("WARNING", logger="coevo"):
        _elastic_room(cfg, roles, want={"CPU": 2.0, "GPU": 0.0}, have={"CPU": 3.0})
    assert ("roles.generator.replicas max 4: the local cluster has room for 1 more replica(s) beside the other "
            "roles, so the pool grows to 2 at most") in caplog.text


@pytest.mark.long
@pytest.mark.slow
def test_a_run_on_a_preempted_node_loses_no_sample(fake_nodes, ray_env, warm_cache, tmp_path) -> None:
    """`coevo run` joins a 3-node cluster, its two generators on the two worker nodes (a custom
    resource only they have); one worker node is removed mid-run and a new one added. The run
    completes with no sample lost or trained on twice, and the death is counted."""
    from ray.cluster_utils import Cluster

    from coevo_cli import finish, read_metrics, small, start, steps_logged, wait_for
    from test_faults import check_no_loss

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "node_ip_address": "127.0.0.1",
                                                            "include_dashboard": False})
    workers = [cluster.add_node(num_cpus=1, resources={"gen": 1}, node_ip_address="127.0.0.1") for _ in range(2)]
    run_dir, steps = tmp_path / "run", 30
    # the driver joins this cluster, which has no token auth
    env = {k: v for k, v in ray_env.items() if not k.startswith("RAY_AUTH")}
    env.update(RAY_ADDRESS=cluster.address, PYTHONPATH=os.environ["PYTHONPATH"])
    try:
        proc = start(small(warm_cache, f"train.max_steps={steps}", f"train.eval_every={steps}",
                           "train.dump_rollouts=true", "roles.generator.replicas=2", "roles.generator.resources={gen: 1}",
                           "--output-dir", str(run_dir)), env, tmp_path)
        wait_for(lambda: steps_logged(run_dir) >= 3, 300, "three steps", proc)
        cluster.remove_node(workers[0], allow_graceful=False)
        removed_at = steps_logged(run_dir)
        cluster.add_node(num_cpus=1, resources={"gen": 1}, node_ip_address="127.0.0.1")  # capacity returns
        out = finish(proc, 300)
        assert proc.returncode == 0, out[-4000:]
    finally:
        cluster.shutdown()
    assert removed_at < steps  # the node went mid-run
    check_no_loss(run_dir, steps)
    rows = read_metrics(run_dir)
    assert rows[-1]["role/generator/failures"] >= 1
