"""An embedded cluster is this run's own: a `ray start` elsewhere on the machine (which records its
address in <ray tmp>/ray_current_cluster) must not be joined, and a dead one must not hang the run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONNECT = ("from orchestrator.cluster import connect; from orchestrator.config import RayConfig; import ray; "
           "print(connect(RayConfig(num_cpus=1, dashboard=False))); "
           "print('gcs', ray.get_runtime_context().gcs_address); ray.shutdown()")


def test_embedded_cluster_ignores_the_address_a_ray_start_left() -> None:
    # a short path: Ray's unix sockets live under the temp dir (107-byte limit)
    tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    try:
        (Path(tmp) / "ray").mkdir()
        (Path(tmp) / "ray" / "ray_current_cluster").write_text("127.0.0.1:1")  # a `ray start` long gone
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env.update(RAY_TMPDIR=tmp, RAY_USAGE_STATS_ENABLED="0")
        proc = subprocess.run([sys.executable, "-c", CONNECT], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=180)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "started a local Ray cluster" in proc.stdout, proc.stdout
    assert "gcs 127.0.0.1:1\n" not in proc.stdout
