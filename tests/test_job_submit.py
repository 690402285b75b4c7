"""`coevo run` as a Ray job, exactly as the README shows it: `ray start --head`, then
`ray job submit --working-dir . -- coevo run ...`.

The cluster is private to this module (one head node: a `ray start` costs ~10 s):
loopback only, free ports, its own short `--temp-dir`, token auth with a throwaway token that both
`ray start` and `ray job submit` get through the environment (`RAY_AUTH_MODE=token`,
`RAY_AUTH_TOKEN`), so nothing reads or writes ~/.ray/auth_token.
It is stopped by PID, never with `ray stop` (which would stop every Ray cluster on the machine):
`ray start --block` stays in the foreground and takes its processes down on SIGTERM; whatever
still carries the test's marker variable afterwards is killed by PID.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MARK = "COEVO_TEST_JOB_CLUSTER"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http_status(url: str, headers: dict | None = None) -> int | None:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=3) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def _marked_processes(mark: str) -> list:
    import psutil

    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(MARK) == mark:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


@pytest.fixture(scope="module")
def ray_cluster():
    """A head node on 127.0.0.1; yields (dashboard URL, env for the Ray CLI, temp dir)."""
    temp = tempfile.mkdtemp(prefix="coevo-", dir="/tmp")  # short: Unix socket paths are limited
    token = secrets.token_hex(32)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update({
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "RAY_USAGE_STATS_ENABLED": "0",
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "PATH": os.pathsep.join([str(BIN), env.get("PATH", "")]),
        # `ray job stop` sends SIGTERM, then SIGKILL after this many seconds (default 3): room to checkpoint
        "RAY_JOB_STOP_WAIT_TIME_S": "30",
        MARK: temp,
    })
    dashboard_port = free_port()
    cmd = [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
           "--dashboard-host", "127.0.0.1", "--port", str(free_port()), "--dashboard-port", str(dashboard_port),
           "--dashboard-agent-listen-port", str(free_port()), "--ray-client-server-port", str(free_port()),
           "--num-cpus", "2", "--temp-dir", temp, "--disable-usage-stats"]
    log = open(Path(temp) / "ray_start.log", "w")
    head = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{dashboard_port}"
    try:
        deadline = time.monotonic() + 90
        while _http_status(f"{url}/api/version", {"Authorization": f"Bearer {token}"}) != 200:
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray start did not come up:\n{(Path(temp) / 'ray_start.log').read_text()[-4000:]}")
            time.sleep(0.5)
        yield url, env, Path(temp)
    finally:
        if head.poll() is None:
            head.send_signal(signal.SIGTERM)
            try:
                head.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(head.pid, signal.SIGKILL)
                head.wait()
        leftovers = _marked_processes(temp)
        for proc in leftovers:  # processes this test's cluster started, by PID
            try:
                proc.kill()
            except Exception:  # noqa: BLE001  (already gone)
                pass
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def test_working_dir_upload_honours_gitignore(tmp_path) -> None:
    """Ray packs `--working-dir` skipping .gitignore matches: the repo's .gitignore keeps run
    directories, virtual environments and caches out of the upload (checked offline with Ray's own
    packager on a scratch tree that has them)."""
    from ray._private.runtime_env.packaging import create_package

    tree = tmp_path / "repo"
    shutil.copytree(REPO / "orchestrator", tree / "orchestrator", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / ".gitignore", tree / ".gitignore")
    bulky = ["runs/grpo-1/checkpoints/final/model.safetensors", ".venv/lib/big.so",
             "orchestrator/__pycache__/cli.cpython-311.pyc", "coevo.egg-info/PKG-INFO"]
    for rel in bulky:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_bytes(b"x" * 1024)
    package = tmp_path / "pkg.zip"
    create_package(str(tree), package, include_gitignore=True)
    names = zipfile.ZipFile(package).namelist()
    assert "orchestrator/cli.py" in names
    for rel in bulky:
        top = rel.split("/")[0] if not rel.startswith("orchestrator/") else rel
        assert not any(n.startswith(top) for n in names), f"{rel} would be uploaded: {names}"


def _job(env, url, *args, timeout=300, check=True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(BIN / "ray"), "job", *args[:1], "--address", url, *args[1:]], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc


@pytest.mark.slow
def test_coevo_run_as_ray_job_stopped_and_resumed_by_a_new_job(ray_cluster, tmp_path) -> None:
    """`coevo run` as a job: `ray job stop` (SIGTERM) saves a checkpoint and says how to resume, and a
    new job resumes it to the end; a relative output path inside a job is refused (the job's working
    directory is a temporary copy), and the uploaded working directory holds no ignored bulk."""
    url, env, temp = ray_cluster
    # Token auth is really on: the dashboard refuses a request without the token.
    assert _http_status(f"{url}/api/version") in (401, 403)
    common = ["warmup.enabled=false", "rollout.prompts_per_step=8", "rollout.samples_per_prompt=4",
              "data.eval_size=32", "train.threads=1", "train.eval_every=50", "train.checkpoint_every=0"]
    refused = _job(env, url, "submit", "--working-dir", str(REPO), "--", "coevo", "run", *common,
                   "--output-dir", "runs/relative", check=False)
    assert refused.returncode != 0 and "relative" in refused.stdout + refused.stderr

    run_dir = tmp_path / "job-run"
    submitted = _job(env, url, "submit", "--no-wait", "--working-dir", str(REPO), "--", "coevo", "run", *common,
                     "train.max_steps=400", "--output-dir", str(run_dir))
    job_id = re.search(r"raysubmit_[A-Za-z0-9]+", submitted.stdout).group(0)  # the CLI may colour it
    deadline = time.monotonic() + 240
    while not ((run_dir / "metrics.jsonl").exists() and len((run_dir / "metrics.jsonl").read_text().splitlines()) >= 3):
        assert time.monotonic() < deadline, _job(env, url, "logs", job_id, check=False).stdout[-4000:]
        time.sleep(0.5)
    _job(env, url, "stop", job_id)
    deadline = time.monotonic() + 60
    while "stopped" not in (status := _job(env, url, "status", job_id).stdout).lower():
        assert time.monotonic() < deadline, status + _job(env, url, "logs", job_id, check=False).stdout[-4000:]
        time.sleep(0.5)
    logs = _job(env, url, "logs", job_id).stdout
    assert "SIGTERM: stopping after this step" in logs and f"resume with:  coevo run --resume --output-dir {run_dir}" in logs
    steps = len((run_dir / "metrics.jsonl").read_text().splitlines())
    assert (run_dir / "checkpoints" / f"step_{steps}" / "loop_state.json").is_file()

    resumed = _job(env, url, "submit", "--working-dir", str(REPO), "--", "coevo", "run", "--resume", "--output-dir",
                   str(run_dir), f"train.max_steps={steps + 2}")
    logs = resumed.stdout + resumed.stderr
    # `ray job submit` tails the job's logs until it ends: the driver joined the cluster and finished.
    assert "joined Ray cluster" in logs
    assert "run directory" in logs and str(run_dir) in logs
    assert "succeeded" in logs
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    assert [r["step"] for r in rows] == list(range(1, steps + 3))
    assert (run_dir / "checkpoints" / "final" / "policy_learner" / "config.json").is_file()

    # The working directories the jobs ran in hold the code and none of the ignored bulk.
    unpacked = [p for p in temp.glob("session_*/runtime_resources/working_dir_files/*") if p.is_dir()]
    assert unpacked, "no unpacked working_dir found"
    for wd in unpacked:
        assert (wd / "orchestrator" / "cli.py").is_file()
        for ignored in ("runs", ".venv", ".git", "coevo.egg-info"):
            assert not (wd / ignored).exists(), f"{ignored} was uploaded with the working dir"
