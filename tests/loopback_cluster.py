"""A multi-node Ray cluster on 127.0.0.1 for tests: a head with the dashboard (the Jobs API) and
worker nodes, each with its own ports and custom resources, run until SIGTERM.

    python tests/loopback_cluster.py --nodes '[{"num_cpus": 2, "resources": {"learner": 1}}, ...]' \
        --temp-dir /tmp/x --ready /tmp/x/ready.json

The first node is the head. When every node is up, the ready file gets the dashboard URL, the GCS
address and each node's id, resources and ports.

Why not `ray start --address` for the workers (Ray 2.60, ray/scripts/scripts.py and
ray/_private/services.py): a worker `ray start` aborts unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER is
on (Linux's default), and with it on, `ray start` passes `--node-ip-address` and the `--address`
host through `services.resolve_ip_for_localhost`, which replaces 127.0.0.1/localhost with the
machine's routable address; a node whose IP is not loopback has its GCS and raylet gRPC servers
listen on every interface (`::`). Ray's `cluster_utils.Cluster` starts the same `Node` processes
that `ray start` does, with the node IP taken as given: with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
in the environment (so nothing Ray resolves later leaves loopback either) every listener stays on
127.0.0.1. Each node gets its own temp dir (`<temp-dir>/n<i>`): see `node_args`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time

WORKER_PORTS = 40  # per node: one per Ray worker process (actors, the job's driver, prestarted workers)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_range(n: int, taken: set[int]) -> int:
    """The first port of n consecutive ports that are free now and not given to another node."""
    for start in range(20000, 60000, n):
        ports = range(start, start + n)
        if taken & set(ports):
            continue
        try:
            for p in ports:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        taken.update(ports)
        return start
    raise RuntimeError(f"no {n} consecutive free ports on 127.0.0.1")


def node_args(spec: dict, head: bool, temp_dir: str, taken: set[int]) -> dict:
    """A node's RayParams: loopback, its own ports, and its own temp dir. Nodes sharing one would
    share its session dir, and so the directory each node's runtime-env agent unpacks a job's
    working_dir into: one node's agent would replace the files under another node's running driver."""
    low = free_range(WORKER_PORTS, taken)
    args = {
        "node_ip_address": "127.0.0.1",
        "num_cpus": spec.get("num_cpus", 1),
        "resources": spec.get("resources", {}),
        "object_store_memory": spec.get("object_store_memory", 200 * 1024 * 1024),
        "node_manager_port": free_port(),
        "object_manager_port": free_port(),
        "min_worker_port": low,
        "max_worker_port": low + WORKER_PORTS - 1,
        "metrics_export_port": free_port(),
        "metrics_agent_port": free_port(),  # the dashboard agent's gRPC port
        "dashboard_agent_listen_port": free_port(),  # its HTTP port
        "runtime_env_agent_port": free_port(),
        "temp_dir": temp_dir,
    }
    if head:
        args.update(gcs_server_port=free_port(), include_dashboard=True, dashboard_host="127.0.0.1",
                    dashboard_port=free_port())
    return args


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", required=True, help="JSON list of {num_cpus, resources}; the first is the head")
    ap.add_argument("--temp-dir", required=True)
    ap.add_argument("--ready", required=True, help="file written when every node is up")
    args = ap.parse_args(argv)
    if os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") != "0":
        sys.exit("set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: Ray resolves addresses to loopback only then")
    if not os.environ.get("RAY_TMPDIR", "").startswith(args.temp_dir):
        sys.exit(f"set RAY_TMPDIR inside --temp-dir {args.temp_dir}: Ray writes the cluster's address there")
    try:
        specs = json.loads(args.nodes)
    except json.JSONDecodeError as e:
        sys.exit(f"--nodes: not JSON ({e}): {args.nodes!r}")
    if not isinstance(specs, list) or not specs:
        sys.exit(f"--nodes: a non-empty JSON list of node specs, got {args.nodes!r}")

    import ray._private.utils
    from ray.cluster_utils import Cluster

    # SIGTERM ends the process through `finally`, which takes every node down
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    taken: set[int] = set()
    os.makedirs(os.path.join(os.environ["RAY_TMPDIR"], "ray"), exist_ok=True)  # Ray's default temp dir
    cluster = Cluster()
    try:
        nodes = []
        for i, spec in enumerate(specs):
            kwargs = node_args(spec, i == 0, os.path.join(args.temp_dir, f"n{i}"), taken)
            node = cluster.add_node(**kwargs)
            if i == 0:
                # A job's driver finds the GCS through this file in the node's temp dir (as after
                # `ray start`); Cluster writes it only to the default temp dir, which RAY_TMPDIR
                # keeps inside ours rather than in /tmp/ray, shared with other clusters.
                ray._private.utils.write_ray_address(cluster.address, kwargs["temp_dir"])
            nodes.append({"node_id": node.node_id, **kwargs})
        ready = {"dashboard_url": f"http://{cluster.webui_url}", "gcs_address": cluster.address, "nodes": nodes}
        tmp = args.ready + ".tmp"
        with open(tmp, "w") as f:
            json.dump(ready, f)
        os.replace(tmp, args.ready)  # the reader never sees half a file
        while True:
            time.sleep(3600)
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
