"""Checkpoints: written atomically (a temporary directory, then a rename), the newest K kept, each
holding everything needed to continue — every learner's model and optimizer, the loop's counters
and data position, the buffered and in-flight rollout pieces, and the verifiers' state.

Every file and directory is fsync'd before the rename, and the parent directory after it, so a
power loss leaves either the old checkpoint or the complete new one.

    checkpoints/step_N/
      loop_state.json            step, time, sampler position, counters, channel versions, held
                                 role state (the verifiers' merged statistics, one copy), the credit
                                 step's state (aggregator statistics, LaSeR's offset c)
      <learner role>/            HF save_pretrained (gathered on rank 0) + tokenizer + learner_state.pt
                                 + sharded/: the optimizer (torch.distributed.checkpoint), loadable
                                 at any world size
      references/<learner role>/ its frozen reference (hard links: orchestrator.frozen)
      frozen/                    frozen reward models (reward_models/<source>), the sampled policy
                                 of a recipe without a policy learner (policy)
      rollouts/seq_<s>.parquet   buffered pieces (scored tables); prompts_<s>.parquet: in flight
      source/<name>.parquet      a batch source's own tables (an iteration's preference pairs)
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

STATE_FILE = "loop_state.json"


def checkpoints_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def latest(run_dir: Path) -> Path | None:
    """The checkpoint with the highest step (complete ones only: a crash mid-write leaves a
    temporary directory that is ignored)."""
    found = [p.parent for p in checkpoints_dir(run_dir).glob(f"*/{STATE_FILE}") if not p.parent.name.startswith(".")]
    return max(found, key=lambda p: (json.loads((p / STATE_FILE).read_text())["step"], p.name == "final"),
               default=None)


def begin(run_dir: Path, name: str) -> Path:
    tmp = checkpoints_dir(run_dir) / f".{name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def fsync_tree(root: Path) -> None:
    """Flush every file and directory under root (directories after their entries) to disk."""
    for folder, _, files in os.walk(root, topdown=False):
        for name in files:
            _fsync(os.path.join(folder, name), os.O_RDONLY)
        _fsync(folder, os.O_RDONLY | os.O_DIRECTORY)


def _fsync(path: str, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(tmp: Path, state: dict, keep: int) -> Path:
    """Write the loop state last, flush everything, then move the directory into place; prune old
    step_N ones."""
    (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
    fsync_tree(tmp)
    final = tmp.parent / tmp.name[1:-len(".tmp")]
    if final.exists():
        old = tmp.parent / f".{final.name}.old"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
        os.rename(tmp, final)
        _fsync(str(tmp.parent), os.O_RDONLY | os.O_DIRECTORY)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
        _fsync(str(tmp.parent), os.O_RDONLY | os.O_DIRECTORY)
    steps = sorted((p for p in tmp.parent.glob("step_*") if p.is_dir()), key=lambda p: int(p.name[5:]))
    for old in steps[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def write_pieces(path: Path, pieces: list[dict]) -> list[dict]:
    """Buffered tables and in-flight prompts as Parquet; returns their JSON-able index."""
    out = path / "rollouts"
    out.mkdir(exist_ok=True)
    index = []
    for piece in pieces:
        entry = {"seq": piece["seq"], "version": piece["version"], "info": piece["info"]}
        pq.write_table(piece["prompts"], out / f"prompts_{piece['seq']}.parquet")
        if piece["table"] is not None:
            pq.write_table(piece["table"], out / f"seq_{piece['seq']}.parquet")
            entry["buffered"] = True
        index.append(entry)
    return index


def read_pieces(path: Path, index: list[dict]) -> list[dict]:
    pieces = []
    for entry in index:
        table = None
        if entry.get("buffered"):
            table = pq.read_table(path / "rollouts" / f"seq_{entry['seq']}.parquet")
        prompts: pa.Table = pq.read_table(path / "rollouts" / f"prompts_{entry['seq']}.parquet")
        pieces.append({**entry, "prompts": prompts, "table": table})
    return pieces


def write_tables(path: Path, tables: dict[str, pa.Table]) -> list[str]:
    """A batch source's own tables (e.g. an iteration's preference pairs) as Parquet."""
    out = path / "source"
    for name, table in tables.items():
        out.mkdir(exist_ok=True)
        pq.write_table(table, out / f"{name}.parquet")
    return sorted(tables)


def read_tables(path: Path, names: list[str]) -> dict[str, pa.Table]:
    return {name: pq.read_table(path / "source" / f"{name}.parquet") for name in names}
