"""The self-rewarding pair source without Ray: an iteration whose groups all tie (no pairs) goes on
to the next iteration instead of indexing the previous iteration's pairs."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pyarrow as pa

import pipelines.self_rewarding as sr
from orchestrator.config import load_config


def test_an_iteration_without_pairs_goes_on_to_the_next(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(sr.ray, "put", lambda value: value)  # the piece holds the table itself
    config = load_config("self_rewarding", ["iterations.iterations=3", "iterations.epochs=1",
                                            "iterations.batch_pairs=2"])
    ctx = SimpleNamespace(config=config, run_dir=tmp_path, stop_requested=None)
    source = sr.IterationSource(ctx, recipe=None)
    made = {0: 3, 1: 0, 2: 2}  # pairs per iteration: the middle one ties everywhere

    async def collect():
        n = made[source.iteration]
        source.pairs = pa.table({"prompt": [f"p{i}" for i in range(n)], "chosen": ["a"] * n, "rejected": ["b"] * n})
        source.phase, source.epoch, source.position = "train", 0, 0
        if n == 0:
            source.iteration, source.phase = source.iteration + 1, "collect"
            return
        source.order = source._shuffle()

    source._collect = collect

    async def drain():
        seen = []
        while (pieces := await source.take()) is not None:
            seen += [(p.info["iteration"], p.table.num_rows) for p in pieces]
        return seen

    assert asyncio.run(drain()) == [(0, 2), (0, 1), (2, 2)]
