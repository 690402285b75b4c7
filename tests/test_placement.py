"""Placement by resources across nodes: a three-node cluster on 127.0.0.1 takes a `ray job submit`,
and each role's actors run on the node whose custom resource the role asks for.

The nodes: a head `{learner: 1}` (with the dashboard, the Jobs API), worker A `{rollout: 2}` and worker
B `{verify: 1}`, each with its own node-manager, object-manager, metrics-export, dashboard-agent and
runtime-env-agent ports and its own worker port range. The job asks for them the way a user does:
`roles.policy_learner.resources={learner: 1}`, two generators with `{rollout: 1}` each, and
`roles.verifier.resources={verify: 1}`; nothing is set up on a node by hand (the code travels as the
job's working_dir, its environment as `--runtime-env-json`).

The nodes are started by tests/loopback_cluster.py with Ray's `cluster_utils.Cluster`, not by
`ray start --address`: in Ray 2.60 a worker `ray start` either refuses to run
(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0) or rewrites `--node-ip-address 127.0.0.1` and the head address
to the machine's routable IP, and then its GCS and raylet listen on every interface (that file's
docstring says where). `Cluster` starts the same node processes with the IP as given, and the test
checks that every socket the cluster's processes listen on, the workers' included, is on 127.0.0.1.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from private_ray import cluster_env, cluster_processes, http_status, job, listening, ray_list, stop_cluster

REPO = Path(__file__).resolve().parents[1]
LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1"}
NODES = [{"num_cpus": 2, "resources": {"learner": 1}},  # the head
         {"num_cpus": 2, "resources": {"rollout": 2}},
         {"num_cpus": 1, "resources": {"verify": 1}}]
ROLE_RESOURCE = {"policy_learner": "learner", "generator": "rollout", "verifier": "verify"}
NODE_PORTS = ("node_manager_port", "object_manager_port", "metrics_export_port", "metrics_agent_port",
              "dashboard_agent_listen_port", "runtime_env_agent_port")


@pytest.fixture(scope="module")
def three_nodes():
    """Yields (ready-file contents, env for the Ray CLI, temp dir)."""
    temp = tempfile.mkdtemp(prefix="coevo-", dir="/tmp")  # short: Unix socket paths are limited
    env = cluster_env(temp)
    ready = Path(temp) / "ready.json"
    log = open(Path(temp) / "cluster.log", "w")
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "loopback_cluster.py"), "--nodes", json.dumps(NODES),
                             "--temp-dir", temp, "--ready", str(ready)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 150
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the cluster did not come up:\n{(Path(temp) / 'cluster.log').read_text()[-4000:]}")
            time.sleep(0.5)
        info = json.loads(ready.read_text())
        auth = {"Authorization": f"Bearer {env['RAY_AUTH_TOKEN']}"}
        while http_status(f"{info['dashboard_url']}/api/version", auth) != 200:
            assert proc.poll() is None and time.monotonic() < deadline, "the dashboard did not answer"
            time.sleep(0.5)
        yield info, env, temp
    finally:
        stop_cluster(proc, temp)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def _check_loopback(temp: str, info: dict) -> int:
    """Every listener of the cluster's processes is on 127.0.0.1, and each node's own ports are among
    them; returns how many listeners were seen."""
    found = listening(cluster_processes(temp))
    wide = [(p.pid, p.name(), ip, port) for p, ip, port in found if ip not in LOOPBACK]
    assert not wide, f"listening beyond loopback: {wide}"
    ports = {port for _, _, port in found}
    for i, node in enumerate(info["nodes"]):
        missing = {k: node[k] for k in NODE_PORTS if node[k] not in ports}
        assert not missing, f"node {i} ({node['resources']}): nothing listens on {missing}"
    head = info["nodes"][0]
    assert head["gcs_server_port"] in ports and head["dashboard_port"] in ports
    return len(found)


@pytest.mark.long
@pytest.mark.slow
def test_job_on_three_nodes_places_each_role_by_its_resources(three_nodes, tmp_path) -> None:
    info, env, temp = three_nodes
    url = info["dashboard_url"]
    before = _check_loopback(temp, info)
    nodes = {n["node_id"]: n for n in ray_list(env, url, "nodes") if n["state"] == "ALIVE"}
    assert len(nodes) == 3 and {n["node_ip"] for n in nodes.values()} == {"127.0.0.1"}

    run_dir = tmp_path / "shared" / "placed"  # stands for shared storage: every node sees this path
    runtime_env = {"env_vars": {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}}
    overrides = ["warmup.enabled=false", "data.arithmetic.digits=1", "data.eval_size=32",
                 "rollout.prompts_per_step=8", "rollout.samples_per_prompt=4", "rollout.max_new_tokens=3",
                 "train.threads=1", "train.eval_every=50", "train.checkpoint_every=0", "train.max_steps=4",
                 "roles.policy_learner.resources={learner: 1}", "roles.generator.replicas=2",
                 "roles.generator.resources={rollout: 1}", "roles.verifier.resources={verify: 1}"]
    submitted = job(env, url, "submit", "--no-wait", "--working-dir", str(REPO), "--runtime-env-json",
                    json.dumps(runtime_env), "--", "coevo", "run", *overrides, "--output-dir", str(run_dir))
    job_id = re.search(r"raysubmit_[A-Za-z0-9]+", submitted.stdout).group(0)

    # While the run trains, its actors' processes (Ray workers, each with a gRPC port) listen too.
    deadline = time.monotonic() + 420

    def succeeded() -> bool:
        text = job(env, url, "status", job_id).stdout.lower()  # "job '...' succeeded" / "... failed"
        assert "failed" not in text and "stopped" not in text and time.monotonic() < deadline, \
            text + job(env, url, "logs", job_id, check=False).stdout[-4000:]
        return "succeeded" in text

    while not (run_dir / "metrics.jsonl").is_file() and not succeeded():
        time.sleep(0.5)
    during = _check_loopback(temp, info)
    while not succeeded():
        time.sleep(1)

    # (a) the job succeeded and its outputs are in --output-dir
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert (run_dir / "checkpoints" / "final" / "policy_learner" / "config.json").is_file()

    # (b) each role's actors ran on the node that declares the resource the role asked for
    placed: dict[str, list[str]] = {}
    for actor in ray_list(env, url, "actors"):
        name = actor.get("name") or ""
        if name.startswith("placed/"):
            placed.setdefault(name.split("/")[1], []).append(actor["node_id"])
    assert set(placed) == set(ROLE_RESOURCE), placed
    assert len(placed["generator"]) == 2, placed
    for role, node_ids in placed.items():
        for node_id in node_ids:
            assert ROLE_RESOURCE[role] in nodes[node_id]["resources_total"], (role, nodes[node_id])
    # three roles, three nodes: one each
    assert len({ids[0] for ids in placed.values()}) == 3
    assert during > before  # the actors' own listeners were among those checked


@pytest.mark.parametrize("env_update, nodes, message", [
    ({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"}, NODES, "set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0"),
    ({"RAY_TMPDIR": "/tmp"}, NODES, "set RAY_TMPDIR inside --temp-dir"),
    ({}, {"num_cpus": 1}, "--nodes: a non-empty JSON list of node specs"),
    ({}, "[{num_cpus: 1}", "--nodes: not JSON"),
])
def test_loopback_cluster_refuses_what_would_leave_loopback_or_its_temp_dir(tmp_path, env_update, nodes, message):
    """The launcher stops before starting anything when its environment or --nodes is wrong."""
    env = {**cluster_env(str(tmp_path)), **env_update}
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "loopback_cluster.py"), "--nodes",
                           nodes if isinstance(nodes, str) else json.dumps(nodes), "--temp-dir", str(tmp_path), "--ready", str(tmp_path / "ready.json")],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "ready.json").exists()
