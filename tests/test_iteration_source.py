"""The self-rewarding pair source without Ray: an iteration whose groups all tie (no pairs) goes on
to the next iteration instead of indexing the previous iteration's pairs; an iteration's samples are
judged where the recipe says (the judge pool apart) and the judge's failures counted."""

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


def test_an_iterations_pairs_are_judged_by_the_judge_pool_apart_and_its_errors_counted(monkeypatch, tmp_path) -> None:
    """With judge.separate the samples are judged by the `judge` pool (the policy plus the judge
    vector), never the generators; `iter/judge_errors` counts the judge's unscored rows, and no pair
    uses them."""
    import numpy as np

    monkeypatch.setattr(sr.ray, "put", lambda value: value)
    judged = "rewards=[{name: judge, judge: true}, {name: correct, fn: integer_match, weight: 0}]"
    config = load_config("self_rewarding", [judged, "verifier.accuracy_source=correct", "iterations.labels=true",
                                            "iterations.prompts=2", "iterations.cream=none",
                                            "judge.warmup_steps=5", "judge.separate=true"])

    def done(value):
        future = asyncio.get_running_loop().create_future()
        future.set_result(value)
        return future

    calls = []

    class Pool:
        def __init__(self, name):
            self.name = name

        async def call(self, method, *args, **kwargs):
            table = args[0].result() if isinstance(args[0], asyncio.Future) else args[0]  # a ref passed on
            calls.append((self.name, method))
            if method == "generate":  # two prompts, two and three samples
                return pa.table({"prompt": ["1+1=", "1+1=", "2+2=", "2+2=", "2+2="], "response": ["2", "3", "4", "5", "6"],
                                 "group_id": ["a", "a", "b", "b", "b"]}), {}
            if method == "judge":  # the judge fails on one sample of 2+2=, the unlabelled prompt
                return done(table.append_column("reward.judge", pa.array([0.9, 0.2, 0.8, None, 0.3], pa.float64()))), {}
            if method == "score":
                return done(table.append_column("reward.correct", pa.array([1.0, 0.0, None, None, None], pa.float64()))), {}
            if method == "snapshot_reference":
                return None
            raise AssertionError(method)

    pools = {name: Pool(name) for name in ("generator", "judge", "verifier", "policy_learner")}
    sampler = SimpleNamespace(next=lambda n: pa.table({"prompt_id": ["p0", "p1"], "prompt": ["1+1=", "2+2="]}))
    ctx = SimpleNamespace(config=config, run_dir=tmp_path, stop_requested=None, pools=pools, sampler=sampler,
                          split=lambda table, pieces: [table], progress=SimpleNamespace(print=lambda *a: None))
    source = sr.IterationSource(ctx, recipe=None)
    asyncio.run(source._collect())
    assert ("judge", "judge") in calls and ("generator", "judge") not in calls
    assert source.iteration_info["iter/judge_errors"] == 1
    # pairs: the label orders prompt 1+1= (2 over 3), the judge 2+2= (4 over 6; 5 unscored)
    pairs = sorted(zip(source.pairs.column("chosen").to_pylist(), source.pairs.column("rejected").to_pylist()))
    assert pairs == [("2", "3"), ("4", "6")]
    assert np.isclose(source.iteration_info["iter/judge_auroc"], 1.0)
