"""What one `coevo run` command did, for summary.json and its last line: wall time and where it
went (Ray, each warm-up stage, starting the actors, training, saving, restarting), the steps it
trained, the learner restarts on the way, and the checkpoint a --resume started from. One session
spans every attempt of a run that restarts after a lost learner; earlier sessions of a resumed run
are kept in summary.json's `sessions`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

PHASES = ("ray_start", "warmup", "actors", "train", "finish", "restart")  # summed, they are the wall time
LABELS = {"ray_start": "Ray", "warmup": "warm-up", "actors": "actors", "train": "training", "finish": "saving",
          "restart": "restarting"}


@dataclass
class Session:
    started: float = field(default_factory=time.perf_counter)
    started_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    phases: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    stages: dict[str, dict] = field(default_factory=dict)  # stage label -> {"s": seconds, "cached": bool}
    resumed_from: str | None = None  # the checkpoint a --resume started from (not a restart's)
    first_step: int = 1
    restarts: list[dict] = field(default_factory=list)

    def add(self, phase: str, seconds: float) -> None:
        self.phases[phase] += seconds

    def stage(self, label: str, seconds: float, cached: bool) -> None:
        entry = self.stages.setdefault(label, {"s": 0.0, "cached": True})
        entry["s"] += seconds
        entry["cached"] = entry["cached"] and cached
        self.add("warmup", seconds)

    def restarted(self, at_step: int, from_step: int, checkpoint: str | None, error: str) -> None:
        self.restarts.append({"at_step": at_step, "from_step": from_step, "checkpoint": checkpoint,
                              "error": error.splitlines()[0][:300]})

    def summary(self, last_step: int) -> dict:
        """The session's keys of summary.json."""
        wall = time.perf_counter() - self.started
        return {"steps": last_step, "first_step": self.first_step,
                "steps_this_session": max(0, last_step - self.first_step + 1),
                "resumed_from": self.resumed_from, "restarts": len(self.restarts),
                "restart_history": self.restarts,
                "steps_redone": sum(max(0, r["at_step"] - r["from_step"]) for r in self.restarts),
                "started_at": self.started_at,
                "time/total_s": wall, "time/wall_s": wall,
                **{f"time/{p}_s": s for p, s in self.phases.items()},
                "time/stages": self.stages}


def session_record(summary: dict) -> dict:
    """A session as kept in a later session's summary.json."""
    keys = ("started_at", "first_step", "steps", "time/wall_s", "stopped_by", "resumed_from", "restarts")
    return {k: summary.get(k) for k in keys}


def timing_text(summary: dict) -> str:
    """The last line's account of the session: its steps, wall time and where it went."""
    steps, first = summary["steps"], summary.get("first_step", 1)
    if summary.get("resumed_from"):
        done = (f"steps {first}-{steps}, resumed from {summary['resumed_from']}," if steps >= first
                else f"no step, resumed from {summary['resumed_from']} at step {steps},")
    else:
        done = f"{steps} steps"
    text = f"{done} in {summary['time/total_s']:.1f}s"
    restarts = summary.get("restarts") or 0
    if restarts:
        redone = summary.get("steps_redone", 0)
        text += (f", after {restarts} learner restart{'s' * (restarts > 1)} "
                 f"({redone} step{'s' * (redone != 1)} redone)")
    parts = []
    for phase in PHASES:
        seconds = summary.get(f"time/{phase}_s")
        if phase == "warmup":
            stages = summary.get("time/stages") or {}
            if stages:
                cached = all(s.get("cached") for s in stages.values())
                parts.append(f"warm-up {seconds:.1f}s{' (cached)' if cached else ''}")
        elif seconds is not None and (seconds >= 0.05 or phase in ("ray_start", "train")):
            parts.append(f"{LABELS[phase]} {seconds:.1f}s")
    return f"{text} ({', '.join(parts)})"
