"""A learner as N ranks of one torch.distributed group (gloo, CPU): the same global batch gives the
same loss, gradient norm and updated parameters at 2 ranks as at 1, for ddp and fsdp2, with
mini-batches, clipping, a KL reference and decoupled PPO's proximal policy; a checkpoint saved at
one world size resumes at another."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pytest
import torch
import torch.multiprocessing as mp

from actors import batch as B
from actors.distributed import Ranks, free_port
from actors.generator import Generator
from orchestrator.config import validate_config
from orchestrator.data import arithmetic
from rl_step import train

TINY = {"arch": "qwen2", "hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
        "intermediate_size": 64}


def config_dict(strategy: str, packing: str = "off", lora: bool = False, **algorithm) -> dict:
    return {"seed": 0, "model": {"tiny": TINY},
            "rollout": {"prompts_per_step": 6, "samples_per_prompt": 4, "max_new_tokens": 6},
            "algorithm": {"lr": 1e-2, "mini_batches": 2, "micro_batch_size": 3, "kl_coef": 0.05,
                          "off_policy": "decoupled_ppo", "grad_clip": 0.5,
                          # packed: micro-batches of ~3 rows by tokens (prompts of 4-5, responses up to 6)
                          **({"micro_batch_tokens": 30} if packing == "on" else {}), **algorithm},
            "learner": {"strategy": strategy, "packing": packing, **({"lora": {"r": 4}} if lora else {})},
            "train": {"threads": 1}}


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> str:
    """6 prompts x 4 samples from the tiny model, with rewards that vary within every group."""
    config = validate_config(config_dict("ddp"))
    prompts = arithmetic(1, ["+"], eval_size=10, seed=0).train.slice(0, 6)
    table, _ = Generator(config, None).generate(prompts, seq=0)
    rewards = np.random.default_rng(0).integers(0, 2, table.num_rows).astype(np.float32)
    rewards[::4], rewards[1::4] = 1.0, 0.0  # no group is uniform
    table = table.append_column(B.REWARD_PREFIX + "integer_match", pa.array(rewards, pa.float32()))
    path = tmp_path_factory.mktemp("ranks") / "batch.arrow"
    feather.write_feather(table, path)
    return str(path)


def _learn(rank: int, world: int, cfg: dict, table_path: str, port: int, out: str, steps: int,
           save: str | None, resume: str | None) -> None:
    """One training at `world` ranks (this process is `rank`); rank 0 writes metrics and weights."""
    from actors.learner import Learner

    config = validate_config(cfg)
    learner = Learner(config, resume, role={"rank": rank, "world_size": world, "threads": 1},
                      objectives=["policy_gradient"])
    if world > 1:
        learner.init_distributed("127.0.0.1", port)
    if resume:  # as a run does: the checkpoint's state, the run's saved KL reference
        learner.restore(resume)
        learner.load_reference(resume + "-reference")
    if save:
        learner.save_reference(save + "-reference")
    table = feather.read_table(table_path)
    metrics = [train(learner, table) for _ in range(steps)]
    state = learner.full_state()
    if save:
        learner.save(save)
    if rank == 0:
        torch.save({"metrics": metrics, "state": {k: v.clone() for k, v in state.items()},
                    "version": learner.version}, out)
    learner.ranks.close()


def _worker(rank: int, scenarios: list[dict]) -> None:
    """Every scenario in order, in one process per rank (a process costs seconds to start): rank 1
    takes part in the 2-rank ones and waits at their rendezvous while rank 0 runs a 1-rank one."""
    import os
    import time

    for i, s in enumerate(scenarios):
        if rank >= s["world"]:
            continue
        deadline = time.monotonic() + 600
        while not all(os.path.exists(done["out"]) for done in scenarios[:i]):  # what it may resume from
            assert time.monotonic() < deadline, "rank 0 did not finish the scenarios before"
            time.sleep(0.1)
        _learn(rank, s["world"], s["cfg"], s["table"], s["port"], s["out"], s["steps"], s["save"], s["resume"])


@pytest.fixture(scope="module")
def runs(batch, tmp_path_factory) -> dict:
    """name -> rank 0's result. `one`: 3 steps at 1 rank (the strategy does nothing at 1 rank);
    `ddp`, `fsdp2`: 3 steps at 2 ranks; `fsdp2_2to1`: 2 steps at 2 ranks, saved, 1 more at 1 rank;
    `ddp_1to2`: 2 steps at 1 rank, saved, 1 more at 2 ranks; `ddp_packed`, `fsdp2_packed`: 3 steps at 2
    ranks with packed, token-budgeted micro-batches (actors.packing); `lora_one`, `lora_ddp`: LoRA adapters
    (learner.lora), 3 steps at 1 and at 2 ranks."""
    tmp = tmp_path_factory.mktemp("rank-runs")
    plan = [("one", 1, "ddp", 3, None, None), ("ddp", 2, "ddp", 3, None, None), ("fsdp2", 2, "fsdp2", 3, None, None),
            ("fsdp2_save", 2, "fsdp2", 2, "a", None), ("fsdp2_2to1", 1, "fsdp2", 1, None, "a"),
            ("ddp_save", 1, "ddp", 2, "b", None), ("ddp_1to2", 2, "ddp", 1, None, "b"),
            ("ddp_packed", 2, "ddp", 3, None, None), ("fsdp2_packed", 2, "fsdp2", 3, None, None),
            ("lora_one", 1, "ddp", 3, None, None), ("lora_ddp", 2, "ddp", 3, None, None)]
    scenarios = [{"world": world, "cfg": config_dict(strategy, packing="on" if name.endswith("packed") else "off",
                                                     lora=name.startswith("lora")),
                  "table": batch, "port": free_port(), "out": str(tmp / f"{name}.pt"), "steps": steps,
                  "save": save and str(tmp / save), "resume": resume and str(tmp / resume)}
                 for name, world, strategy, steps, save, resume in plan]
    mp.start_processes(_worker, args=(scenarios,), nprocs=2, join=True, start_method="spawn")
    out = {name: torch.load(tmp / f"{name}.pt", weights_only=False) for name, *_ in plan}
    out["checkpoint"] = str(tmp / "a")
    return out


def assert_same(one: dict, two: dict) -> None:
    for a, b in zip(one["metrics"], two["metrics"]):
        for key in ("train/loss", "train/grad_norm", "train/kl", "train/clip_frac"):
            assert a[key] == pytest.approx(b[key], abs=1e-5, rel=1e-5), key
        assert a["train/rows_computed_frac"] == b["train/rows_computed_frac"]
    assert one["state"].keys() == two["state"].keys()
    for name, value in one["state"].items():
        # 5e-5 after three AdamW steps of lr 1e-2: Adam divides each gradient by its own scale, so
        # parameters whose true gradient is ~0 (k_proj.bias: softmax ignores it) move by rounding noise
        # that depends on the summation order (seen up to 1.3e-5 on an AMD EPYC); a wrong gradient
        # moves every parameter by ~lr
        torch.testing.assert_close(two["state"][name], value, atol=5e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_two_ranks_equal_one_rank(strategy, runs) -> None:
    one, two = runs["one"], runs[strategy]
    assert one["version"] == two["version"] == 3
    assert one["metrics"][0]["train/grad_norm"] > 0.5  # clipping was active
    assert one["metrics"][-1]["train/kl"] > 0  # the reference is in the loss
    assert_same(one, two)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_two_ranks_packed_equal_one_rank_padded(strategy, runs) -> None:
    """Packed, token-budgeted micro-batches at 2 ranks: the same updates as padded ones at 1 rank."""
    assert_same(runs["one"], runs[f"{strategy}_packed"])


def test_lora_at_two_ranks_equals_one_rank(runs) -> None:
    """ddp ranks average the adapters' gradients: the same merged weights as one rank (learner.lora)."""
    assert runs["lora_one"]["metrics"][-1]["train/kl"] > 0  # the base (adapters off) is the reference
    assert_same(runs["lora_one"], runs["lora_ddp"])


def test_shards_are_whole_groups_and_cover_every_row() -> None:
    groups = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3])
    cost = torch.tensor([5, 5, 1, 1, 1, 9, 2, 2])
    rows = torch.arange(8)
    shares = [Ranks(r, 2).shard(rows, groups, cost) for r in range(2)]
    assert sorted(torch.cat(shares).tolist()) == list(range(8))
    for share in shares:
        for g in groups[share].unique():
            assert set(share.tolist()) >= set(torch.nonzero(groups == g).squeeze(1).tolist())
    # longest first: 10 -> rank 0, 9 -> rank 1, 4 -> rank 1, 3 -> rank 0
    assert [int(cost[s].sum()) for s in shares] == [13, 13]
    assert shares[0].tolist() == [0, 1, 2, 3, 4]


def test_bad_strategy_is_named() -> None:
    with pytest.raises(Exception, match=r"learner.strategy\n?.*'zero3'"):
        validate_config({"learner": {"strategy": "zero3"}})
    with pytest.raises(ValueError, match=r"learner.strategy 'zero3' is not one of \['ddp', 'fsdp2'\]"):
        Ranks(0, 2, "zero3")  # a Ranks built outside the config


@pytest.mark.parametrize("name", ["fsdp2_2to1", "ddp_1to2"])
def test_a_checkpoint_resumes_at_another_world_size(name, runs) -> None:
    """Two steps at one world size, saved (sharded), one more at the other: the same as three
    steps at one rank, and the HF export loads in plain transformers."""
    import transformers

    straight, resumed = runs["one"], runs[name]
    assert resumed["version"] == 3
    assert_same({"metrics": straight["metrics"][2:], "state": straight["state"]}, resumed)
    plain = transformers.AutoModelForCausalLM.from_pretrained(runs["checkpoint"])
    assert plain.config.num_hidden_layers == TINY["num_layers"]
