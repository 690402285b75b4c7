"""Where step metrics go: metrics.jsonl, TensorBoard, the Ray dashboard, and PNG plots."""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

from orchestrator import status
from orchestrator.ray_metrics import RunMetrics

PLOTTED = (("reward/mean", "reward (train samples)"), ("eval/accuracy", "held-out greedy accuracy"),
           ("rm/batch_pair_accuracy", "reward model: pair accuracy on fresh batches"),
           ("eval/pair_accuracy", "reward model: held-out pair accuracy"))


class MetricsSink:
    """`resume_step`: a resumed run keeps the rows up to its checkpoint's step and drops later ones
    (written after the checkpoint by the interrupted session), in metrics.jsonl and TensorBoard."""

    def __init__(self, run_dir: Path, resume_step: int | None = None, ray_metrics: bool = True):
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir = run_dir
        self.path = run_dir / "metrics.jsonl"
        self.history: list[dict] = []
        if resume_step is not None and self.path.exists():
            rows = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
            self.history = [r for r in rows if r["step"] <= resume_step]
            tmp = self.path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in self.history))
            tmp.replace(self.path)
        # purge_step drops TensorBoard events at or after it that an interrupted session wrote
        # TensorBoard flushes on its own every few seconds (and on close): a flush per step would cost
        # the loop milliseconds it does not have to spend.
        self.tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"), flush_secs=5,
                                purge_step=None if resume_step is None else resume_step + 1)
        self._file = self.path.open("a", buffering=1)  # line-buffered: each row is on disk at once
        self._gauges: dict | None = {} if ray_metrics else None
        # tagged metrics and the status record `coevo status` reads (a nested run exports neither)
        self.ray = RunMetrics(run_dir.name) if ray_metrics else None
        self._status: dict | None = None

    def log(self, row: dict) -> None:
        row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        self.history.append(row)
        self._file.write(json.dumps(row) + "\n")
        step = row["step"]
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)):
                self.tb.add_scalar(key, value, step)
                self._gauge(key, value)

    def export(self, ctx, row: dict, pieces) -> None:
        """A finished step into Ray's tagged metrics and the run's status record."""
        if self.ray is None:
            return
        self.ray.step(ctx, row, pieces)
        self._status = status.record(ctx, row, self._status)
        status.publish(self._status)

    def finish(self, state: str) -> None:
        """The run ended (finished / stopped / failed): say so in its status record."""
        if self._status is not None:
            status.publish({**self._status, "state": state, "updated": time.time()})

    def _gauge(self, key: str, value: float) -> None:
        """Mirror a metric to Ray's metrics (Prometheus, shown in the Ray dashboard)."""
        if self._gauges is None:
            return
        name = "coevo_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)
        if name not in self._gauges:
            from ray.util.metrics import Gauge
            self._gauges[name] = Gauge(name, description=f"coevo metric {key}")
        self._gauges[name].set(float(value))

    def plot(self) -> list[Path]:
        # The object API, not pyplot: no GUI backend, and safe in the thread the run draws it from
        from matplotlib.figure import Figure

        out_dir = self.run_dir / "plots"
        out_dir.mkdir(exist_ok=True)
        shown = [(k, t) for k, t in PLOTTED if any(r.get(k) is not None for r in self.history)] or list(PLOTTED[:2])
        fig = Figure(figsize=(5 * len(shown), 3.5))
        axes = fig.subplots(1, len(shown), squeeze=False)
        for ax, (key, title) in zip(axes[0], shown):
            points = [(r["step"], r[key]) for r in self.history if r.get(key) is not None]
            if points:
                ax.plot(*zip(*points), marker="o" if key.startswith("eval") else None, markersize=3)
            ax.set_title(title)
            ax.set_xlabel("step")
            if "accuracy" in key:
                ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out_dir / "reward_accuracy.png"
        fig.savefig(path, dpi=100)
        return [path]

    def close(self) -> None:
        self.tb.close()
        self._file.close()
