"""Fits, or says why: a CUDA out-of-memory error in any role ends the run at once (no retry, no
restart), naming the role, the phase and the settings that lower memory; and before any actor
starts, roles whose models cannot fit their GPU share are refused. The errors are torch's own
(`torch.cuda.OutOfMemoryError`, raised where a GPU would raise it)."""

from __future__ import annotations

import asyncio
import os
import textwrap

import pytest
import ray
import torch

from orchestrator import fit, memory
from orchestrator.config import ConfigError, load_config
from orchestrator.rank_group import RankGroup
from orchestrator.roles import Pool, RoleSpec, resolve
from test_pool_faults import cluster, run  # noqa: F401  (the module's cluster fixture)

MiB, GiB = 2**20, 2**30
OOM = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                                  "79.19 GiB of which 1.06 GiB is free.")


def test_torchs_out_of_memory_errors_are_told_from_the_others() -> None:
    assert memory.is_oom(OOM)
    assert memory.is_oom(ray.exceptions.RayTaskError("generate", "Traceback ...", OOM))
    assert memory.is_oom(RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be reported ..."))
    assert memory.is_oom(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"))
    assert not memory.is_oom(ValueError("shape mismatch"))
    assert not memory.is_oom(ray.exceptions.RayTaskError("generate", "Traceback ...", RuntimeError("NaN loss")))
    assert not memory.is_oom(None)


def test_the_message_names_the_role_the_phase_and_the_settings_to_turn() -> None:
    cfg = load_config(None, ["algorithm.micro_batch_size=64", "rollout.chunk_prompts=8"])
    msg = str(memory.out_of_memory("policy_learner", "learner", "train_step_published", OOM, cfg, 0.45))
    assert msg.startswith("role 'policy_learner' ran out of memory during a training step: CUDA out of memory. "
                          "Tried to allocate 2.00 GiB.")
    assert "The run stops here (a restart would run out again)" in msg
    for knob in ("algorithm.micro_batch_size=64", "learner.strategy=fsdp2", "learner.cpu_offload=true",
                 "roles.policy_learner.num_gpus=0.45"):
        assert knob in msg, knob
    if "gradient_checkpointing" in type(cfg.learner).model_fields:
        assert "learner.gradient_checkpointing=true" in msg
    msg = str(memory.out_of_memory("generator", "generator", "generate", OOM, cfg, 0.45, "replica 2"))
    assert msg.startswith("role 'generator' (replica 2) ran out of memory during generation")
    for knob in ("rollout.chunk_prompts=8", f"rollout.max_new_tokens={cfg.rollout.max_new_tokens}", "model.dtype=auto",
                 "roles.generator.num_gpus"):
        assert knob in msg, knob
    assert "micro_batch_size" not in msg


# ---- does it fit? ----------------------------------------------------------------------------------
PRESET_05B = ["model.tiny.hidden_size=1024", "model.tiny.num_layers=32", "model.tiny.num_heads=16",
              "model.tiny.num_kv_heads=4", "model.tiny.intermediate_size=4096", "rollout.max_new_tokens=200"]


def specs(cfg, **gpus) -> dict:
    from orchestrator.recipes import RECIPES, Sources
    roles = RECIPES.get(cfg.recipe).roles(cfg, Sources())
    return {n: resolve(RoleSpec(**{**s.__dict__, "num_gpus": gpus.get(n, 0)}), None, cfg) for n, s in roles.items()}


def test_the_parameter_count_is_the_models() -> None:
    cfg = load_config(None, PRESET_05B)
    assert fit.parameter_count(cfg.model) == 486_756_352  # issue 31's 0.5B preset: 486.8M
    from actors import modeling
    small = load_config(None, [])
    assert fit.parameter_count(small.model) == sum(p.numel() for p in modeling.build(small.model, 0)[0].parameters())


def test_models_that_cannot_fit_their_gpu_share_are_refused_before_start() -> None:
    cfg = load_config(None, PRESET_05B)
    with pytest.raises(ConfigError) as e:
        fit.check_fit(cfg, specs(cfg, generator=0.45, policy_learner=0.45), (8 * GiB, "stub GPU"))
    msg = str(e.value)
    assert msg.startswith("the roles' models do not fit the GPU memory they ask for (stub GPU, 8.0 GiB; a model "
                          "of 486.8M parameters; activations come on top):")
    # 16 bytes a parameter: 7.3 GiB against 0.45 x 8 GiB; the generator's bfloat16 copy + KV cache fits
    assert ("  policy_learner: at least 7.3 GiB a replica (float32 weights, gradients and AdamW states (16 bytes a "
            "parameter)); its share roles.policy_learner.num_gpus=0.45 is 3.6 GiB") in msg
    assert "  generator:" not in msg.split("to lower")[0]
    assert "algorithm.micro_batch_size" in msg and "learner.strategy=fsdp2" in msg
    fit.check_fit(cfg, specs(cfg, generator=0.45, policy_learner=0.45), (80 * GiB, "stub GPU"))  # fits
    fit.check_fit(cfg, specs(cfg, generator=0.45, policy_learner=0.45), None)  # size unknown: not checked
    fit.check_fit(cfg, specs(cfg), (1 * GiB, "stub GPU"))  # every role on the CPU: nothing to check
    # the KV cache of the samples counts: 256 x 200 new tokens is 1.6 GiB beside 0.9 GiB of weights
    with pytest.raises(ConfigError, match=r"  generator: at least 2.5 GiB a replica \(weights \(2 bytes a parameter\) "
                                          r"\+ the KV cache of 256 samples x 200 new tokens\)"):
        fit.check_fit(cfg, specs(cfg, generator=0.25, policy_learner=0.7), (8 * GiB, "stub GPU"))
    # a frozen reference adds its copy; fsdp2 ranks share the rest
    ref = load_config(None, PRESET_05B + ["algorithm.kl_coef=0.1"])
    need, why = fit.needs("policy_learner", specs(ref)["policy_learner"], ref, 1000)
    assert need == 16_000 + 2_000 and "its frozen reference (2 bytes a parameter)" in why
    fsdp = load_config(None, PRESET_05B + ["learner.strategy=fsdp2", "roles.policy_learner.replicas=4"])
    spec = resolve(specs(fsdp)["policy_learner"], fsdp.roles["policy_learner"], fsdp)
    assert fit.needs("policy_learner", spec, fsdp, 1000)[0] == 4_000


# ---- a role that runs out of memory ----------------------------------------------------------------
def test_a_generator_out_of_memory_ends_the_run_without_retry_or_restart(cluster) -> None:  # noqa: F811
    async def main():
        pool = Pool("generator", RoleSpec("pool_actors:Hungry", kind="generator", replicas=2, num_cpus=0),
                    load_config(None, ["rollout.chunk_prompts=4"]))
        await pool.ready()
        pids = await pool.broadcast("ping")
        with pytest.raises(memory.OutOfMemory) as e:
            await pool.call("generate", 1, table=False)
        again = None
        try:  # the pool is done: the next call gets the same error, no replica tries again
            await pool.call("generate", 2, table=False)
        except memory.OutOfMemory as second:
            again = second
        counts = await pool.broadcast("count")
        assert await pool.broadcast("ping") == pids  # nothing was restarted
        pool.shutdown()
        return e.value, again, counts

    error, again, counts = run(main())
    assert str(error).startswith("role 'generator' (replica 0) ran out of memory during generation: CUDA out of "
                                 "memory. Tried to allocate 20.00 GiB.")
    assert "rollout.chunk_prompts=4" in str(error) and not error.lost_learner
    assert again is error and sorted(counts) == [0, 1]  # one call, never retried on the other replica


def test_out_of_memory_at_start_up_names_the_role(cluster) -> None:  # noqa: F811
    from orchestrator.pools import ready

    async def main():
        pool = Pool("reward_model", RoleSpec("pool_actors:Hungry", kind="scorer", num_cpus=0, max_restarts=3,
                                             kwargs={"at_start": True}), load_config(None, []))
        try:
            await ready({"reward_model": pool})
        finally:
            pool.shutdown()

    with pytest.raises(memory.OutOfMemory, match=r"^role 'reward_model' ran out of memory during start-up "
                                                 r"\(building or loading its model\): CUDA out of memory"):
        run(main())


def test_a_rank_out_of_memory_ends_the_run_even_where_its_peer_then_dies(cluster) -> None:  # noqa: F811
    """A peer that dies after the rank ran out (NCCL's watchdog ends it) made this a lost learner,
    which restarts the run from its checkpoint: the same batch runs out again, train.learner_restarts
    times over."""
    async def main():
        group = RankGroup("policy_learner", RoleSpec("pool_actors:Ranked", kind="learner", replicas=2, num_cpus=0),
                          load_config(None, []))
        await group.ready()
        with pytest.raises(memory.OutOfMemory) as e:
            await group.call("reduce", 1.0, oom=1, peers_exit_s=1.0, table=False)
        stopped = all(rep.dead and not rep.alive for rep in group.replicas)
        group.shutdown()
        return e.value, stopped

    error, stopped = run(main())
    assert str(error).startswith("role 'policy_learner' (rank 1) ran out of memory during reduce: CUDA out of memory")
    assert not error.lost_learner and stopped


# ---- the whole run ---------------------------------------------------------------------------------
HUNGRY = '''
import torch
from actors.generation.hf import HFBackend

OOM = "CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity of 79.19 GiB"


class HungryBackend(HFBackend):
    def generate(self, prompts, n, max_new_tokens, **kwargs):
        if n > 1:  # sampling for a train batch (a held-out greedy evaluation passes)
            raise torch.cuda.OutOfMemoryError(OOM)
        return super().generate(prompts, n, max_new_tokens, **kwargs)


def hungry_loss(logprobs, old_logprobs, advantages, clip_eps=0.2, clip_eps_high=None, mask=None):
    raise torch.cuda.OutOfMemoryError(OOM)
'''


@pytest.mark.slow
@pytest.mark.parametrize("where", ["generator", "policy_learner"])
def test_coevo_run_stops_at_the_first_out_of_memory(where, ray_env, tmp_path) -> None:
    from coevo_cli import coevo

    (tmp_path / "coevo_test_hungry.py").write_text(textwrap.dedent(HUNGRY))
    setting = ("rollout.backend=coevo_test_hungry:HungryBackend" if where == "generator"
               else "algorithm.policy_loss=coevo_test_hungry:hungry_loss")
    # an untrained model's samples all score 0: without this the learner skips their forward/backward
    out = coevo(["warmup.enabled=false", "train.max_steps=3", "rollout.prompts_per_step=4",
                 "rollout.samples_per_prompt=2", "data.eval_size=8", "ray.num_cpus=2", "train.threads=1",
                 *(["roles.policy_learner.replicas=2", "roles.policy_learner.num_cpus=0.5",
                    "roles.generator.num_cpus=0.5"] if where == "policy_learner" else []),
                 "algorithm.skip_uniform_groups=false", setting, "--output-dir", str(tmp_path / "run")], ray_env, tmp_path, timeout=300, expect=1)
    phase = "generation" if where == "generator" else "a training step"
    assert f"error: OutOfMemory: role '{where}'" in out and f"ran out of memory during {phase}: CUDA out of memory" in out
    assert ("rollout.chunk_prompts" if where == "generator" else "algorithm.micro_batch_size") in out
    assert "restarting the run" not in out and "retrying its work elsewhere" not in out
    metrics = tmp_path / "run" / "metrics.jsonl"
    assert not metrics.is_file() or not metrics.read_text().strip()  # not one step went through


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_real_cuda_out_of_memory_error_is_recognised_and_the_gpu_is_measured() -> None:
    with pytest.raises(torch.cuda.OutOfMemoryError) as e:
        torch.empty(2**50, dtype=torch.uint8, device="cuda")
    assert memory.is_oom(e.value)
    msg = str(memory.out_of_memory("generator", "generator", "generate", e.value))
    assert "ran out of memory during generation: CUDA out of memory. Tried to allocate" in msg
    total, name = fit.gpu_memory()
    assert total == torch.cuda.get_device_properties(0).total_memory and name
