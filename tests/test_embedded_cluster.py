"""`coevo run` with no `ray.address` and no RAY_ADDRESS starts its own cluster, even where another
cluster on this machine was recorded by `ray start` (Ray's plain `ray.init()` would join that one,
then refuse coevo's num_cpus or run inside someone else's cluster)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_embedded_cluster_ignores_the_machines_last_ray_start() -> None:
    with tempfile.TemporaryDirectory(prefix="coevo-", dir="/tmp") as temp:  # short: socket paths
        # what `ray start --head` leaves for plain ray.init() to join: here an address nothing serves
        Path(temp, "ray").mkdir()
        Path(temp, "ray", "ray_current_cluster").write_text("127.0.0.1:9")
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(RAY_TMPDIR=temp, RAY_USAGE_STATS_ENABLED="0", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
        script = textwrap.dedent("""
            from types import SimpleNamespace
            import ray
            from orchestrator import cluster
            print(cluster.connect(SimpleNamespace(address=None, num_cpus=1, dashboard=False)))
            print("gcs", ray.get_runtime_context().gcs_address)
            ray.shutdown()
        """)
        proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "started a local Ray cluster (1 CPUs" in proc.stdout
    gcs = proc.stdout.split("gcs ", 1)[1].split()[0]
    assert gcs != "127.0.0.1:9"
