"""Whether a run directory may be used, decided before Ray starts: a new or empty directory is
used, a directory that coevo did not make is refused (coevo never writes over a user's files), one
whose run stopped before its first checkpoint is started again in place, one with a checkpoint is
continued only with --resume, and a finished one is never written over."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import yaml

from orchestrator import checkpoint as ckpt
from orchestrator.config import ConfigError

# Written first into every run directory: what tells coevo's own directory from a user's.
MARKER = "coevo_run.json"
# What a run writes before its first checkpoint (cleared when such a directory is used again).
EARLY_OUTPUTS = ("config.yaml", "metrics.jsonl", "summary.json", "checkpoints", "tensorboard", "plots",
                 "rollouts", "warmup", "judge_warmup", "laser_warmup")


def holds_run(path: Path) -> bool:
    """A directory coevo made for a run: its marker, or (made before the marker existed) a checkpoint."""
    return path.is_dir() and ((path / MARKER).is_file() or ckpt.latest(path) is not None)


def mark(path: Path) -> None:
    """Make `path` a run directory (kept when it already is one)."""
    if not (path / MARKER).is_file():
        from orchestrator import __version__  # the source tree's or the installed one's

        (path / MARKER).write_text(json.dumps({"coevo": __version__, "created": time.strftime(
            "%Y-%m-%dT%H:%M:%S%z")}) + "\n")


def _contents(path: Path, limit: int = 6) -> str:
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def is_saved_config(config_arg: str | None) -> bool:
    """A run directory's own config.yaml, which names that directory as its output_dir."""
    if not config_arg or Path(config_arg).suffix not in (".yaml", ".yml") or not Path(config_arg).is_file():
        return False
    try:
        saved = yaml.safe_load(Path(config_arg).read_text())
    except yaml.YAMLError:
        return False  # load_config reports it
    out = saved.get("output_dir") if isinstance(saved, dict) else None
    return bool(out) and Path(out).expanduser().resolve() == Path(config_arg).resolve().parent


def claim(path: Path, config, resume: bool) -> str | None:
    """Check that `path` may be used for this run; returns a line to print, if any. Changes
    nothing on disk unless the directory is reused (a run with no checkpoint)."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"output directory {path} is a file, not a directory: choose another --output-dir")
    if path.is_dir() and not holds_run(path) and any(path.iterdir()):
        if resume:
            raise ConfigError(f"--resume: {path} is not a coevo run directory (it holds {_contents(path)}), so "
                              "there is no run to resume there; nothing was touched")
        raise ConfigError(f"output directory {path} is not empty and is not a coevo run directory (it holds "
                          f"{_contents(path)}); coevo writes only into a new or empty directory or one of its own "
                          "runs, so nothing there was touched: choose another --output-dir")
    latest = ckpt.latest(path)
    if resume:
        if latest is None and holds_run(path):
            raise FileNotFoundError(
                f"--resume: {path} holds a run that stopped before its first checkpoint, so there is "
                f"nothing to resume; start it again in the same directory with: coevo run "
                f"{path / 'config.yaml'} --output-dir {path}")
        if latest is None:
            raise FileNotFoundError(f"--resume: no checkpoint under {path}/checkpoints")
        _refuse_finished(path, latest, config)
        return None
    if not holds_run(path):
        return None
    if latest is not None:
        raise ConfigError(f"{path} already holds a run; continue it with --resume, or choose another "
                          "--output-dir (coevo never writes over an earlier run)")
    for name in EARLY_OUTPUTS:
        _remove(path / name)
    for ref in path.glob("*_reference"):
        _remove(ref)
    return f"{path} holds a run that stopped before its first checkpoint: starting it again there"


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def _refuse_finished(path: Path, latest: Path, config) -> None:
    """A run that ended on its own (its final checkpoint and summary written, no stop signal) and
    whose stopping rule still holds would train 0 steps and rewrite its results: refuse."""
    summary_file = path / "summary.json"
    if latest.name != "final" or not summary_file.is_file():
        return
    summary = json.loads(summary_file.read_text())
    if summary.get("stopped_by"):
        return
    step = json.loads((latest / ckpt.STATE_FILE).read_text())["step"]
    train = config.train
    accuracy, target = summary.get("eval/accuracy"), train.stop_at_accuracy
    if step >= train.max_steps:
        why, extend = f"it trained train.max_steps={train.max_steps} steps", f"train.max_steps=N (N > {step})"
    elif target is not None and accuracy is not None and accuracy >= target:
        why = f"its held-out accuracy {accuracy:.3f} reached train.stop_at_accuracy={target} at step {step}"
        extend = "train.stop_at_accuracy=null (or a higher target)"
    else:
        return
    raise ConfigError(f"{path} is a finished run ({why}); --resume would train 0 steps, so nothing was "
                      f"changed. To train it further: coevo run --resume --output-dir {path} {extend}")
