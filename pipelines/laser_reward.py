"""LaSeR's self-reward in the credit step (orchestrator/credit.py). The generators read
log pi(z | x, y) (`laser_logprob`); before the rewards are aggregated, every `laser: true` source gets
r = laser.beta * (log pi(z | x, y) - c), and the batch gets c as its `laser_c` column, which the
learner's alignment MSE (actors/objectives/laser_align.py) reads so it fits the same r.

The offset c is the credit step's state, checkpointed with the loop: `laser.c` where set; else the c
that a LaSeR warm-up aligned the starting model with (`laser.json` beside that model, so r keeps the
offset it was aligned with); else the mean log-prob of the first train batch (so r starts near 0)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from actors import batch as B
from orchestrator.credit import RewardColumns

LASER_FILE = "laser.json"  # the offset c, next to the model whose r it belongs to


def saved_c(model_dir: str | Path | None) -> float | None:
    """The c saved beside a model by the self-verification warm-up (None where there is none)."""
    path = Path(model_dir) / LASER_FILE if model_dir else None
    return json.loads(path.read_text())["c"] if path is not None and path.is_file() else None


def save_c(model_dir: str | Path, c: float) -> None:
    Path(model_dir).mkdir(parents=True, exist_ok=True)
    (Path(model_dir) / LASER_FILE).write_text(json.dumps({"c": c}))


def with_offset(table: pa.Table, c: float) -> pa.Table:
    """The batch with its self-reward's offset as the `laser_c` column (one value, every row)."""
    return B.replace_column(table, "laser_c", pa.array(np.full(table.num_rows, c, np.float64), pa.float64()))


class SelfReward(RewardColumns):
    """r into the laser reward sources, c into `laser_c`; c fixed once and checkpointed."""

    name = "laser"

    def __init__(self, config, policy_source: str | None = None):
        self.beta = config.laser.beta
        self.sources = [r.name for r in config.laser_rewards()]
        self.c = config.laser.c if config.laser.c is not None else saved_c(policy_source)

    def __call__(self, table: pa.Table) -> pa.Table:
        if "laser_logprob" not in table.schema.names:
            raise B.BatchError("a laser reward source needs the generators' `laser_logprob` column; the batch has "
                               f"{table.schema.names}")
        lp = table.column("laser_logprob").to_numpy(zero_copy_only=False).astype(np.float64)
        if self.c is None:
            self.c = float(np.nanmean(lp))
        r = (self.beta * (lp - self.c)).astype(np.float32)
        for name in self.sources:
            table = B.replace_column(table, B.REWARD_PREFIX + name, pa.array(r, pa.float32(), mask=np.isnan(r)))
        return with_offset(table, self.c)

    def metrics(self) -> dict:
        return {"train/laser_c": self.c}

    def state_dict(self) -> dict:
        return {"c": self.c}

    def load_state_dict(self, state: dict) -> None:
        self.c = state.get("c", self.c)
