"""Roles find the GPU by themselves (`roles.<name>.num_gpus: auto`): the plan from the cluster's
resources, an explicit num_gpus that wins, a CPU-only cluster as before, and on a fake cluster with
one GPU (`ray.init(num_gpus=1)`, the CUDA check stubbed) the generator and learner sharing it, with
the line that says where each landed."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import ray

from orchestrator import placement
from orchestrator.config import load_config
from orchestrator.recipes import RECIPES, Sources
from orchestrator.roles import AUTO, RoleSpec, resolve


def roles_of(cfg) -> dict:
    recipe = RECIPES.get(cfg.recipe)
    return {**recipe.stage_roles(cfg, Sources()), **recipe.roles(cfg, Sources())}


def plan(*overrides: str, gpus: float = 1, cuda_ok: bool = True, config: str | None = None) -> placement.Plan:
    cfg = load_config(config, list(overrides))
    return placement.make_plan(cfg, roles_of(cfg), {"CPU": 16, "GPU": gpus}, cuda_ok)


def test_one_gpu_is_shared_by_the_generator_and_the_learner() -> None:
    p = plan()
    assert p.gpus == {"generator": 0.45, "policy_learner": 0.45} and not p.notes  # the verifier runs no model


def test_enough_gpus_give_each_replica_a_whole_one() -> None:
    assert plan(gpus=2).gpus == {"generator": 1.0, "policy_learner": 1.0}
    assert plan("roles.generator.replicas=3", gpus=4).gpus == {"generator": 1.0, "policy_learner": 1.0}
    # four replicas on two GPUs: two to a GPU
    assert plan("roles.generator.replicas=3", gpus=2).gpus == {"generator": 0.45, "policy_learner": 0.45}
    # an elastic pool is planned at its most replicas
    assert plan("roles.generator.replicas={min: 1, max: 3}").gpus == {"generator": 0.22, "policy_learner": 0.22}


def test_a_cpu_only_cluster_keeps_every_role_on_the_cpu_and_says_nothing() -> None:
    p = plan(gpus=0)
    assert p.gpus == {"generator": 0.0, "policy_learner": 0.0} and not p.notes
    cfg = load_config(None, [])
    specs = p.assign(RECIPES.get(cfg.recipe).roles(cfg, Sources()))
    assert {n: resolve(s, cfg.roles.get(n), cfg).num_gpus for n, s in specs.items()} == {
        "generator": 0.0, "verifier": 0.0, "policy_learner": 0.0}
    # an unplanned spec (no cluster was asked) runs on the CPU, as before num_gpus could be auto
    assert resolve(RoleSpec("a:B", kind="generator"), None).num_gpus == 0.0


def test_an_explicit_num_gpus_wins_and_the_auto_roles_share_what_is_left() -> None:
    p = plan("roles.generator.num_gpus=0.2")
    assert p.gpus == {"policy_learner": 0.72}  # 0.9 of the 0.8 left
    cfg = load_config(None, ["roles.generator.num_gpus=0.2"])
    specs = p.assign(RECIPES.get(cfg.recipe).roles(cfg, Sources()))
    assert resolve(specs["generator"], cfg.roles["generator"], cfg).num_gpus == 0.2
    assert resolve(specs["policy_learner"], cfg.roles.get("policy_learner"), cfg).num_gpus == 0.72
    # 0 is explicit too: a CPU generator beside a learner with the whole GPU
    assert plan("roles.generator.num_gpus=0").gpus == {"policy_learner": 1.0}
    # `auto` written out is the default
    assert plan("roles.generator.num_gpus=auto").gpus == plan().gpus
    assert load_config(None, []).roles == {} and RoleSpec("a:B", kind="learner").num_gpus == AUTO


def test_learner_ranks_get_a_gpu_each_or_stay_on_the_cpu() -> None:
    p = plan("roles.policy_learner.replicas=2", gpus=1)
    assert p.gpus["policy_learner"] == 0.0 and "its 2 ranks need a GPU each" in p.notes[0]
    assert p.gpus["generator"] == 1.0  # alone on the GPU
    p = plan("roles.policy_learner.replicas=2", gpus=3)
    assert p.gpus == {"generator": 1.0, "policy_learner": 1.0}


def test_gpus_this_torch_cannot_use_leave_the_roles_on_the_cpu_with_a_note() -> None:
    p = plan(cuda_ok=False)
    assert p.gpus == {"generator": 0.0, "policy_learner": 0.0}
    assert "Ray counts 1 GPU(s), but this torch" in p.notes[0] and "ray.num_gpus=0" in p.notes[0]


def test_recipes_with_more_model_roles_share_one_gpu() -> None:
    assert plan(config="ppo").gpus == {"generator": 0.3, "policy_learner": 0.3, "critic": 0.3}
    cooper = plan(config="cooper").gpus
    assert set(cooper) == {"generator", "policy_learner", "rm_learner", "reward_model"}
    assert set(cooper.values()) == {0.22}


def test_describe_names_the_device_of_each_role() -> None:
    gpu = [{"device": "cuda", "gpus": ["0"], "node": "10.0.0.1"}]
    assert placement.describe("generator", 0.45, gpu) == "generator -> GPU 0 (0.45)"
    four = [{"device": "cuda", "gpus": [g], "node": n} for g, n in (("0", "a"), ("1", "a"), ("0", "b"), ("1", "b"))]
    assert placement.describe("generator", 0.5, four, nodes=True) == "generator x4 -> GPUs 0,1 (0.5 each) on a, b"
    assert placement.describe("verifier", 0, [{"device": "cpu", "gpus": [], "node": "a"}]) == "verifier -> CPU"


# ---- a fake cluster with one GPU -------------------------------------------------------------------
@pytest.fixture(scope="module")
def one_gpu():
    from orchestrator import cluster
    cluster.connect(SimpleNamespace(address=None, num_cpus=2, num_gpus=1, dashboard=False))
    yield
    ray.shutdown()


@pytest.mark.slow
def test_on_a_cluster_with_one_gpu_both_roles_land_on_it(one_gpu, monkeypatch, tmp_path) -> None:
    from orchestrator.pools import build_pools, ready
    from orchestrator.run import Run

    assert ray.cluster_resources().get("GPU") == 1
    monkeypatch.setattr(placement, "cuda_usable", lambda: True)  # this machine's torch has no CUDA
    cfg = load_config(None, [])
    run = Run(cfg, tmp_path, resume=False)
    printed = []
    run.progress = SimpleNamespace(print=printed.append)
    run.gpu_plan = run._plan_gpus(local=True, nested=False)
    assert run.gpu_plan.gpus == {"generator": 0.45, "policy_learner": 0.45} and not printed
    # the planned fractions, on stand-in actors (the real ones would look for CUDA): Ray places both
    specs = run.gpu_plan.assign({"generator": RoleSpec("pool_actors:Worker", kind="generator", num_cpus=0),
                                 "verifier": RoleSpec("pool_actors:Worker", kind="verifier", num_cpus=0),
                                 "policy_learner": RoleSpec("pool_actors:Worker", kind="learner", num_cpus=0)})

    async def main():
        pools = build_pools(specs, cfg)
        await asyncio.wait_for(ready(pools), 120)
        await run.report_placement(pools)
        again = await placement.landed(pools, run._placed)  # printed once per pool
        for pool in pools.values():
            pool.shutdown()
        return again

    assert asyncio.run(main()) is None
    assert printed == ["placement: generator -> GPU 0 (0.45), verifier -> CPU, policy_learner -> GPU 0 (0.45)"]


@pytest.mark.slow
def test_on_a_cluster_with_one_gpu_a_torch_without_cuda_keeps_the_cpu(one_gpu, monkeypatch, tmp_path) -> None:
    from orchestrator.run import Run

    monkeypatch.setattr(placement, "cuda_usable", lambda: False)
    run = Run(load_config(None, []), tmp_path, resume=False)
    printed = []
    run.progress = SimpleNamespace(print=printed.append)
    assert run._plan_gpus(local=True, nested=False).gpus == {"generator": 0.0, "policy_learner": 0.0}
    assert len(printed) == 1 and "cannot use CUDA" in printed[0]
    # a joined cluster's GPUs are taken at Ray's word (its workers have the CUDA, not this driver)
    run = Run(load_config(None, []), tmp_path, resume=False)
    run.progress = SimpleNamespace(print=printed.append)
    assert run._plan_gpus(local=False, nested=False).gpus == {"generator": 0.45, "policy_learner": 0.45}


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_machine_this_torch_counts_as_usable() -> None:
    assert placement.cuda_usable()
    assert plan(cuda_ok=placement.cuda_usable()).gpus == {"generator": 0.45, "policy_learner": 0.45}
