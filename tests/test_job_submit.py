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
import re
import shutil
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path

import pytest
from private_ray import RAY, cluster_env, free_port, http_status, job, stop_cluster

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ray_cluster():
    """A head node on 127.0.0.1; yields (dashboard URL, env for the Ray CLI, temp dir)."""
    temp = tempfile.mkdtemp(prefix="coevo-", dir="/tmp")  # short: Unix socket paths are limited
    env = cluster_env(temp)
    # `ray job stop` sends SIGTERM, then SIGKILL after this many seconds (default 3): room to checkpoint
    env["RAY_JOB_STOP_WAIT_TIME_S"] = "30"
    dashboard_port = free_port()
    cmd = [*RAY, "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
           "--dashboard-host", "127.0.0.1", "--port", str(free_port()), "--dashboard-port", str(dashboard_port),
           "--dashboard-agent-listen-port", str(free_port()), "--ray-client-server-port", str(free_port()),
           "--num-cpus", "2", "--temp-dir", temp, "--disable-usage-stats"]
    log = open(Path(temp) / "ray_start.log", "w")
    head = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{dashboard_port}"
    try:
        deadline = time.monotonic() + 90
        while http_status(f"{url}/api/version", {"Authorization": f"Bearer {env['RAY_AUTH_TOKEN']}"}) != 200:
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray start did not come up:\n{(Path(temp) / 'ray_start.log').read_text()[-4000:]}")
            time.sleep(0.5)
        yield url, env, Path(temp)
    finally:
        stop_cluster(head, temp)
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


@pytest.mark.slow
def test_coevo_run_as_ray_job_stopped_and_resumed_by_a_new_job(ray_cluster, tmp_path) -> None:
    """`coevo run` as a job: `ray job stop` (SIGTERM) saves a checkpoint and says how to resume, and a
    new job resumes it to the end; a relative output path inside a job is refused (the job's working
    directory is a temporary copy), and the uploaded working directory holds no ignored bulk."""
    url, env, temp = ray_cluster
    # Token auth is really on: the dashboard refuses a request without the token.
    assert http_status(f"{url}/api/version") in (401, 403)
    common = ["warmup.enabled=false", "rollout.prompts_per_step=8", "rollout.samples_per_prompt=4",
              "data.eval_size=32", "train.threads=1", "train.eval_every=50", "train.checkpoint_every=0"]
    refused = job(env, url, "submit", "--working-dir", str(REPO), "--", "coevo", "run", *common,
                   "--output-dir", "runs/relative", check=False)
    assert refused.returncode != 0 and "relative" in refused.stdout + refused.stderr

    run_dir = tmp_path / "job-run"
    submitted = job(env, url, "submit", "--no-wait", "--working-dir", str(REPO), "--", "coevo", "run", *common,
                     "train.max_steps=400", "--output-dir", str(run_dir))
    job_id = re.search(r"raysubmit_[A-Za-z0-9]+", submitted.stdout).group(0)  # the CLI may colour it
    deadline = time.monotonic() + 240
    while not ((run_dir / "metrics.jsonl").exists() and len((run_dir / "metrics.jsonl").read_text().splitlines()) >= 3):
        assert time.monotonic() < deadline, job(env, url, "logs", job_id, check=False).stdout[-4000:]
        time.sleep(0.5)
    job(env, url, "stop", job_id)
    deadline = time.monotonic() + 60
    while "stopped" not in (status := job(env, url, "status", job_id).stdout).lower():
        assert time.monotonic() < deadline, status + job(env, url, "logs", job_id, check=False).stdout[-4000:]
        time.sleep(0.5)
    logs = job(env, url, "logs", job_id).stdout
    assert "SIGTERM: stopping" in logs
    # inside a job, the hint is the job to submit again (at this cluster's dashboard), not a bare command
    assert (f"resume with:  ray job submit --address {url} --working-dir . -- coevo run --resume --output-dir "
            f"{run_dir}") in logs, logs[-3000:]
    steps = len((run_dir / "metrics.jsonl").read_text().splitlines())
    assert (run_dir / "checkpoints" / f"step_{steps}" / "loop_state.json").is_file()

    resumed = job(env, url, "submit", "--working-dir", str(REPO), "--", "coevo", "run", "--resume", "--output-dir",
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
