"""Where step metrics go: metrics.jsonl, TensorBoard, the Ray dashboard, and PNG plots."""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

from orchestrator import status
from orchestrator.ray_metrics import RunMetrics

# Ray's metrics agent and `coevo status` are read every few seconds; a step can take a tenth of one,
# so gauges and the status record are sent at most this often (the latest values; nothing is lost)
EXPORT_EVERY_S = 1.0

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
        self._pending: dict[str, float] = {}  # gauge values not sent yet (the latest of each key)
        self._sent_at = self._status_at = float("-inf")
        # tagged metrics and the status record `coevo status` reads (a nested run exports neither)
        self.ray = RunMetrics(run_dir.name) if ray_metrics else None
        self._status: dict | None = None

    def log(self, row: dict) -> None:
        row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        self.history.append(row)
        self._file.write(json.dumps(row) + "\n")
        scalars = {k: float(v) for k, v in row.items() if k != "step" and isinstance(v, (int, float))}
        self._tensorboard(scalars, row["step"])
        if self._gauges is not None:
            self._pending.update(scalars)
            self._send_gauges()

    def export(self, ctx, row: dict, pieces) -> None:
        """A finished step into Ray's tagged metrics and the run's status record."""
        if self.ray is None:
            return
        self.ray.step(ctx, row, pieces)
        self._status = status.record(ctx, row, self._status)
        if time.monotonic() - self._status_at >= EXPORT_EVERY_S:
            status.publish(self._status)
            self._status_at = time.monotonic()

    def finish(self, state: str) -> None:
        """The run ended (finished / stopped / failed): say so in its status record."""
        self._send_gauges(now=True)
        if self._status is not None:
            status.publish({**self._status, "state": state, "updated": time.time()})

    def _tensorboard(self, scalars: dict[str, float], step: int) -> None:
        """One TensorBoard event per step holding every scalar (as `add_scalar` writes each, one event
        apiece: a tenth of the cost at ~60 keys)."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=k, simple_value=v) for k, v in scalars.items()])
        self.tb._get_file_writer().add_summary(summary, step)

    def _send_gauges(self, now: bool = False) -> None:
        """Mirror the metrics to untagged Ray gauges (Prometheus, the Ray dashboard)."""
        if self._gauges is None or not self._pending or (not now and time.monotonic() - self._sent_at < EXPORT_EVERY_S):
            return
        from ray.util.metrics import Gauge

        for key, value in self._pending.items():
            name = "coevo_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)
            if name not in self._gauges:
                self._gauges[name] = Gauge(name, description=f"coevo metric {key}")
            self._gauges[name].set(value)
        self._pending.clear()
        self._sent_at = time.monotonic()

    def series(self, warm_start: float | None = None) -> dict[str, list[tuple[int, float]]]:
        """The plotted panels' (step, value) points; held-out accuracy starts at step 0 with the warm
        start the last line compares the end with, where a stage measured one."""
        shown = [k for k, _ in PLOTTED if any(r.get(k) is not None for r in self.history)] or [k for k, _ in PLOTTED[:2]]
        out = {k: [(r["step"], r[k]) for r in self.history if r.get(k) is not None] for k in shown}
        if "eval/accuracy" in out and warm_start is not None:
            out["eval/accuracy"].insert(0, (0, warm_start))
        return out

    def plot(self, warm_start: float | None = None) -> list[Path]:
        """plots/reward_accuracy.png: a panel per series (orchestrator.metrics.PLOTTED that has values)."""
        # The object API, not pyplot: no GUI backend, and safe in the thread the run draws it from
        from matplotlib.figure import Figure

        out_dir = self.run_dir / "plots"
        out_dir.mkdir(exist_ok=True)
        series, titles = self.series(warm_start), dict(PLOTTED)
        fig = Figure(figsize=(5 * len(series), 3.5))
        axes = fig.subplots(1, len(series), squeeze=False)
        for ax, (key, points) in zip(axes[0], series.items()):
            if points:
                ax.plot(*zip(*points), marker="o" if key.startswith("eval") else None, markersize=3)
            if key == "eval/accuracy" and warm_start is not None:
                ax.plot([0], [warm_start], marker="s", color="tab:orange", linestyle="none", label="warm start")
                ax.legend(loc="lower right", fontsize=8)
            ax.set_title(titles[key])
            ax.set_xlabel("step")
            if "accuracy" in key:
                ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out_dir / "reward_accuracy.png"
        fig.savefig(path, dpi=100)
        return [path]

    def close(self) -> None:
        self._send_gauges(now=True)
        self.tb.close()
        self._file.close()
