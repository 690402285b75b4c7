"""Train batches of preference pairs read from a file (recipe reward_model with
`reward_model.pairs_path`): epochs over the pairs, reshuffled each epoch, a held-out split."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import ray

from orchestrator.batch_source import BatchSource, PairPiece
from orchestrator.data import DatasetError, read_pairs


def load_pair_splits(rm_cfg, seed: int) -> tuple[pa.Table, pa.Table]:
    pairs = read_pairs(rm_cfg.pairs_path)
    if rm_cfg.eval_pairs_path:
        return pairs, read_pairs(rm_cfg.eval_pairs_path)
    if pairs.num_rows <= rm_cfg.eval_pairs:
        raise DatasetError(f"pairs file {rm_cfg.pairs_path!r} has {pairs.num_rows} rows; reward_model.eval_pairs="
                           f"{rm_cfg.eval_pairs} leaves none to train on (lower it or set reward_model.eval_pairs_path)")
    order = np.random.default_rng([seed, 3]).permutation(pairs.num_rows)
    pairs = pairs.take(pa.array(order))
    return pairs.slice(rm_cfg.eval_pairs), pairs.slice(0, rm_cfg.eval_pairs)


class PairSource(BatchSource):
    def __init__(self, ctx, train: pa.Table, state: dict | None = None):
        state = state or {}
        self.ctx, self.train = ctx, train
        self.batch = ctx.config.reward_model.batch_pairs
        self.seed = ctx.config.seed
        self.epoch, self.position = state.get("epoch", 0), state.get("position", 0)
        self.counts: Counter = Counter(state.get("counts", {}))
        self.order = self._shuffle()

    def _shuffle(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch, 5]).permutation(self.train.num_rows)

    async def take(self) -> list[PairPiece] | None:
        if self.ctx.stop_requested:
            return None
        if self.position >= len(self.order):
            self.epoch, self.position = self.epoch + 1, 0
            self.order = self._shuffle()
        idx = self.order[self.position:self.position + self.batch]
        self.position += len(idx)
        self.counts["samples/consumed"] += len(idx)
        return [PairPiece(ray.put(self.train.take(pa.array(idx))), len(idx))]

    def accounting(self) -> dict:
        return {**self.counts, "pairs/epoch": self.epoch}

    async def snapshot(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "counts": dict(self.counts), "pieces": []}
