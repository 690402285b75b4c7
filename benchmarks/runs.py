"""What the benchmarks that run `coevo run` share: an offline environment, the command, the default
task's warm checkpoint and its exported train/held-out files (so several scripts, or TRL, start from
the same model and data), a subprocess run with its machine load, and metrics.jsonl reading.
Used by vs_trl.py and algorithms.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def offline_env(**extra: str) -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0", "TERM": "dumb", **extra}


def coevo_command() -> list[str]:
    exe = Path(sys.executable).parent / "coevo"
    if exe.is_file():
        return [str(exe)]
    found = shutil.which("coevo")
    return [found] if found else [sys.executable, "-m", "orchestrator.cli"]


def warm_checkpoint(explicit: str | None, work: Path, warmup_target: float | None = None,
                    warmup_every: int | None = None, recipe: str | None = None) -> tuple[Path, dict]:
    """The warm start: `--warm DIR`, else the cached warm-up of the default recipe (or of `recipe`,
    a pipelines/ YAML name: its task), made once if missing, optionally with another
    `warmup.target_accuracy` and `warmup.eval_every` (checking every step lands nearer the target:
    the SFT ramp gains up to 0.1 in 5 steps)."""
    if explicit:
        path = Path(explicit).expanduser().resolve()
        if not (path / "config.json").is_file():
            sys.exit(f"error: --warm {explicit}: no config.json there (not an HF model directory)")
        meta = path / "warmup.json"
        return path, json.loads(meta.read_text()) if meta.is_file() else {}
    from orchestrator.config import load_config
    from pipelines.stages.sft import cache_path, cached

    overrides = ([] if warmup_target is None else [f"warmup.target_accuracy={warmup_target}"]) + \
        ([] if warmup_every is None else [f"warmup.eval_every={warmup_every}"])
    config = load_config(recipe, overrides)
    path, info = cached(config)
    if path is None:
        print(f"warm checkpoint {cache_path(config)} missing: running the warm-up once "
              f"(coevo run {recipe or ''} train.max_steps=1 {' '.join(overrides)})", file=sys.stderr, flush=True)
        log = work / "warmup.log"
        cmd = [*coevo_command(), "run", *([recipe] if recipe else []), "train.max_steps=1", *overrides,
               "--output-dir", str(work / "warmup-run")]
        with log.open("w") as f:
            rc = subprocess.run(cmd, cwd=ROOT, env=offline_env(), stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL).returncode
        path, info = cached(config)
        if rc != 0 or path is None:
            sys.exit(f"error: the warm-up run failed (exit {rc}); log tail:\n{log.read_text()[-3000:]}")
    return Path(path), info


def export_splits(work: Path, recipe: str | None = None) -> tuple[Path, Path, dict]:
    """The default task's (or `recipe`'s) train and held-out splits as JSONL (prompt, answer), read
    by both sides."""
    from orchestrator.config import load_config
    from orchestrator.data import load_prompts

    config = load_config(recipe)
    prompts = load_prompts(config.data, config.seed)
    paths = {}
    for split in ("train", "eval"):
        table = getattr(prompts, split)
        path = paths[split] = work / f"{split}.jsonl"
        with path.open("w") as f:
            for p, a in zip(table.column("prompt").to_pylist(), table.column("answer").to_pylist()):
                f.write(json.dumps({"prompt": p, "answer": a}) + "\n")
    info = {"task": prompts.name, "data_seed": config.seed, "train_rows": prompts.train.num_rows,
            "eval_rows": prompts.eval.num_rows}
    return paths["train"], paths["eval"], info


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class LoadSampler(threading.Thread):
    """The 1-minute load average and the machine's CPU use (all processes) every `interval` s."""

    def __init__(self, interval: float = 2.0):
        super().__init__(daemon=True)
        import psutil

        self.psutil, self.interval, self.stop_event = psutil, interval, threading.Event()
        self.load: list[float] = []
        self.busy: list[float] = []
        self.before = os.getloadavg()
        psutil.cpu_percent(None)

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            self.load.append(os.getloadavg()[0])
            self.busy.append(self.psutil.cpu_percent(None))

    def report(self) -> dict:
        self.stop_event.set()
        self.join()
        mean = lambda v: round(sum(v) / len(v), 2) if v else None  # noqa: E731
        return {"load_avg_before": [round(x, 2) for x in self.before],
                "load_avg_after": [round(x, 2) for x in os.getloadavg()],
                "load_1min_mean": mean(self.load), "load_1min_max": max(self.load, default=None),
                "machine_cpu_busy_pct_mean": mean(self.busy)}


def run_logged(cmd: list[str], log: Path, timeout: float, env: dict | None = None) -> dict:
    """Run `cmd` from the repository root with its output in `log`; its exit status ("timeout" past
    `timeout` s), wall time and the machine's load while it ran."""
    load = LoadSampler()
    load.start()
    t0 = time.perf_counter()
    with log.open("w") as f:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=env or offline_env(), stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return {"rc": rc, "process_wall_s": time.perf_counter() - t0, **load.report()}
