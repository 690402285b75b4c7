"""Running `coevo run` as a user does, for the integration tests: a subprocess in its own process
group (killed whole on timeout, so nothing outlives a test), small settings, and readers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
COEVO = [str(BIN / "coevo")] if (BIN / "coevo").is_file() else [sys.executable, "-m", "orchestrator.cli"]

# 1-digit addition (100 problems, 32 held out), a short SFT warm-up to ~25%, small batches, one torch
# thread per actor (2 cores, several actors).
SMALL = [
    "data.arithmetic.digits=1", "data.eval_size=32",
    "rollout.prompts_per_step=8", "rollout.samples_per_prompt=4", "rollout.max_new_tokens=3",
    "train.stop_at_accuracy=null", "ray.num_cpus=2", "train.threads=1",
    "warmup.target_accuracy=0.25", "warmup.eval_every=25", "warmup.max_steps=300",
]


def small(warm_cache: Path, *more: str) -> list[str]:
    return [*SMALL, f"warmup.cache_dir={warm_cache}", *more]


def start(args: list[str], env: dict, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([*COEVO, "run", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float, what: str = "coevo") -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{what} ran past {timeout}s:\n{out[-6000:]}")
    return out


def coevo(args: list[str], env: dict, cwd: Path, timeout: float = 240, expect: int = 0) -> str:
    """Run `coevo run ARGS` to the end; assert its exit status; return its output."""
    proc = start(args, env, cwd)
    out = finish(proc, timeout, f"coevo {' '.join(args)}")
    assert proc.returncode == expect, f"coevo {' '.join(args)} exited {proc.returncode}:\n{out[-6000:]}"
    return out


def read_metrics(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"coevo ended before {what}:\n{proc.stdout.read()[-4000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


def steps_logged(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0
