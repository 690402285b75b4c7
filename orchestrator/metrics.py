"""Where step metrics go: metrics.jsonl, TensorBoard, the Ray dashboard, and PNG plots."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

PLOTTED = (("reward/mean", "reward (train samples)"), ("eval/accuracy", "held-out greedy accuracy"))


class MetricsSink:
    def __init__(self, run_dir: Path, ray_metrics: bool = True):
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir = run_dir
        self.path = run_dir / "metrics.jsonl"
        self.tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        self.history: list[dict] = []
        if self.path.exists():  # resumed run: keep what is there
            self.history = [json.loads(line) for line in self.path.read_text().splitlines() if line]
        self._gauges: dict | None = {} if ray_metrics else None

    def log(self, row: dict) -> None:
        row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        self.history.append(row)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        step = row["step"]
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)):
                self.tb.add_scalar(key, value, step)
                self._gauge(key, value)
        self.tb.flush()

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
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        out_dir = self.run_dir / "plots"
        out_dir.mkdir(exist_ok=True)
        fig, axes = plt.subplots(1, len(PLOTTED), figsize=(5 * len(PLOTTED), 3.5))
        for ax, (key, title) in zip(axes, PLOTTED):
            points = [(r["step"], r[key]) for r in self.history if r.get(key) is not None]
            if points:
                ax.plot(*zip(*points), marker="o" if key.startswith("eval") else None, markersize=3)
            ax.set_title(title)
            ax.set_xlabel("step")
            ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out_dir / "reward_accuracy.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return [path]

    def close(self) -> None:
        self.tb.close()
