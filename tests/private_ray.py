"""What the tests that run a private Ray cluster share (test_job_submit.py, test_placement.py): loopback
ports, an environment with a throwaway token and a marker variable, the Ray CLI, and cleanup by PID.

Every process such a cluster starts inherits the marker variable (`MARK`, set to the cluster's own
temp dir), so whatever outlives the graceful stop is found and killed by PID, never by name."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

BIN = Path(sys.executable).parent
# the `ray` console script where pip installed one; its module otherwise (same code)
RAY = [str(BIN / "ray")] if (BIN / "ray").is_file() else [sys.executable, "-m", "ray.scripts.scripts"]
MARK = "COEVO_TEST_JOB_CLUSTER"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_status(url: str, headers: dict | None = None) -> int | None:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=3) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def cluster_env(temp: str) -> dict:
    """The environment for a private cluster and the Ray CLI that talks to it: token auth with a
    throwaway token (nothing read from or written to ~/.ray), no usage stats, Ray's temp files in the
    cluster's own temp dir, this venv first on PATH
    (a job's `coevo` entrypoint), and the marker that finds the cluster's processes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update({
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_TMPDIR": temp,  # what Ray writes to its default temp dir (/tmp/ray) stays in the cluster's own
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "PATH": os.pathsep.join([str(BIN), env.get("PATH", "")]),
        MARK: temp,
    })
    return env


def cluster_processes(mark: str) -> list:
    """The processes carrying the marker and all their descendants: a raylet starts its agents with
    an environment of its own (no marker), so they are found as its children."""
    import psutil

    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(MARK) == mark:
                found[proc.pid] = proc
                found.update((c.pid, c) for c in proc.children(recursive=True))
        except (psutil.Error, OSError):
            continue
    return list(found.values())


def stop_cluster(proc: subprocess.Popen, mark: str, timeout: float = 30) -> None:
    """SIGTERM the process that runs the cluster (it takes its nodes down), SIGKILL its group if it
    hangs, then kill by PID whatever of the cluster's processes is left (listed before the stop: an
    agent whose raylet is gone has lost its parent)."""
    processes = cluster_processes(mark)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for leftover in processes + cluster_processes(mark):
        try:
            leftover.kill()  # psutil checks the PID still belongs to the process it listed
        except Exception:  # noqa: BLE001  (already gone)
            pass


def job(env: dict, url: str, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    """`ray job ARGS[0] --address URL ARGS[1:]`; asserts success unless check is False."""
    proc = subprocess.run([*RAY, "job", *args[:1], "--address", url, *args[1:]], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc


def listening(processes: list) -> list[tuple]:
    """(process, ip, port) for every TCP socket these processes listen on."""
    import psutil

    found = []
    for proc in processes:
        try:
            found += [(proc, c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="tcp") if c.status == "LISTEN"]
        except (psutil.Error, OSError):  # exited meanwhile
            continue
    return found


def ray_list(env: dict, url: str, what: str) -> list[dict]:
    """`ray list WHAT` through the dashboard's state API, as JSON (dead actors included)."""
    proc = subprocess.run([*RAY, "list", what, "--address", url, "--format", "json", "--detail", "--limit", "10000"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return json.loads(proc.stdout)
