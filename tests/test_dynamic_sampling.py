"""DAPO's dynamic sampling in the rollout producer: uniform-reward groups are dropped (counted) and
replaced by fresh prompts until a batch holds prompts_per_step informative groups, within the bound
of max_sampling_tries; past the bound uniform groups are kept, counted. Generation is a stand-in
pool whose rewards are decided per prompt, so the test runs without a model (Ray for the object store)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
import ray

from actors import batch as B
from orchestrator.config import validate_config
from orchestrator.data import PromptSampler
from orchestrator.rollouts import Rollouts

N = 2  # samples per prompt


class Generators:
    """Rows of N samples per prompt; prompt i's rewards are uniform unless `informative(i)`."""

    def __init__(self, informative):
        self.informative, self.version, self.replicas, self.calls = informative, 0, [0], 0

    async def call(self, method, prompts, seq, versioned):
        self.calls += 1
        ids = prompts.column("prompt_id").to_pylist()
        rows = [(p, s) for p in ids for s in range(N)]
        reward = [float(s) if self.informative(int(p)) else 1.0 for p, s in rows]
        table = pa.table({"prompt_id": [p for p, _ in rows], "uid": [f"{seq}.{p}.{s}" for p, s in rows],
                          B.REWARD_PREFIX + "r": pa.array(reward, pa.float32())})
        return ray.put(table), {"version": 0, "busy_s": 0.0}


class Recipe:
    async def score_piece(self, ctx, table):
        return table, {}


def run(informative, tries: int, batches: int = 2) -> tuple[list[pa.Table], dict, int]:
    config = validate_config({"rollout": {"prompts_per_step": 4, "samples_per_prompt": N, "chunk_prompts": 2,
                                          "dynamic_sampling": True, "max_sampling_tries": tries}})
    prompts = pa.table({"prompt_id": [str(i) for i in range(400)], "prompt": ["x"] * 400})
    gen = Generators(informative)
    ctx = SimpleNamespace(config=config, sampler=PromptSampler(prompts, 0), pools={"generator": gen},
                          stop_requested=None)

    async def main():
        rollouts = Rollouts(ctx, Recipe())
        rollouts.start()
        out = []
        for _ in range(batches):
            pieces = await rollouts.take()
            out.append(pa.concat_tables([await p.table for p in pieces]))
            rollouts.trained_batch()
        await rollouts.stop()
        return out, rollouts.accounting()

    batches_out, accounting = asyncio.run(main())
    return batches_out, accounting, gen.calls


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    from orchestrator import cluster

    cluster.connect(SimpleNamespace(address=None, num_cpus=1, dashboard=False))
    yield
    ray.shutdown()


def test_uniform_groups_are_replaced_until_the_batch_is_informative() -> None:
    out, acc, _ = run(lambda i: i % 2 == 0, tries=5)  # half the prompts are uniform
    for table in out:
        assert (B.uniform_groups(table) < 0).all()  # nothing uniform reached training
        assert pa.compute.count_distinct(table.column("prompt_id")).as_py() >= 4
    assert acc["samples/dropped/uniform_reward"] > 0 and acc["samples/lost"] == 0
    assert acc["samples/dispatched"] == acc["samples/consumed"] + sum(
        v for k, v in acc.items() if k.startswith("samples/dropped/"))


def test_the_bound_stops_the_search_with_a_counted_reason() -> None:
    out, acc, calls = run(lambda i: False, tries=2, batches=1)  # nothing is ever informative
    # at most (2 - 1) x 4 groups are dropped per batch, then uniform groups are kept and counted
    assert acc["samples/dropped/uniform_reward"] == 4 * N
    assert acc["samples/uniform_kept_at_bound"] >= 4 * N
    assert out[0].num_rows >= 4 * N and acc["samples/lost"] == 0


def test_uniform_groups_compare_every_source_and_nulls() -> None:
    table = pa.table({"prompt_id": ["a", "a", "b", "b", "c", "c"],
                      "reward.x": pa.array([1.0, 1.0, 0.0, 0.0, None, None], pa.float32()),
                      "reward.y": pa.array([0.0, 0.0, 0.0, 1.0, None, None], pa.float32())})
    assert B.uniform_groups(table).tolist() == [0, 0, -1, -1, 2, 2]
    table = table.set_column(2, "reward.y", pa.array([0.0, 0.0, 0.0, 0.0, 1.0, None], pa.float32()))
    assert B.uniform_groups(table).tolist() == [0, 0, 1, 1, -1, -1]
    assert np.array_equal(B.uniform_groups(table.slice(0, 0)), np.array([], dtype=np.int64))
