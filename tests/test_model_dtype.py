"""`model.dtype`: every copy that does not train (generators and judges, frozen references, reward
models) in bfloat16 on a GPU and float32 on a CPU by default, or the dtype asked for; the learner's
float32 updates load into such a copy cast, all or nothing; the learner's own weights stay float32.
bfloat16 runs on a CPU too, so the copies are checked here with the explicit setting."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actors import modeling
from actors.generator import Generator
from actors.learner import Learner
from actors.weights import WeightMismatchError, export_state, inference_copy, load_state
from orchestrator.config import ConfigError, load_config, validate_config
from orchestrator.data import arithmetic

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}


def config(dtype: str = "auto", **algorithm):
    return validate_config({"model": {"tiny": TINY, "dtype": dtype}, "train": {"threads": 1},
                            "rollout": {"prompts_per_step": 2, "samples_per_prompt": 2, "max_new_tokens": 3},
                            "algorithm": {"lr": 1e-2, **algorithm}})


def test_auto_is_bfloat16_on_a_gpu_and_float32_on_a_cpu() -> None:
    assert modeling.inference_dtype("auto", "cuda") == torch.bfloat16
    assert modeling.inference_dtype("auto", "cuda:1") == torch.bfloat16
    assert modeling.inference_dtype("auto", "cpu") == torch.float32
    assert modeling.inference_dtype("float16", "cpu") == torch.float16
    assert modeling.inference_dtype("float32", "cuda") == torch.float32
    assert load_config(None, []).model.dtype == "auto"
    with pytest.raises(ConfigError, match=r"model.dtype: Input should be 'auto', 'float32', 'bfloat16' or "
                                          r"'float16' \(got 'int8'\)"):
        load_config(None, ["model.dtype=int8"])


def test_a_low_precision_copy_takes_float32_updates_cast_and_still_refuses_what_does_not_fit() -> None:
    tok = modeling.char_tokenizer()
    master = modeling.tiny_model(tok, **TINY, seed=1)
    copy = inference_copy(modeling.tiny_model(tok, **TINY, seed=2), torch.bfloat16)
    assert {p.dtype for p in copy.parameters()} == {torch.bfloat16}
    load_state(copy, export_state(master, 1), 1)  # float32 numpy into bfloat16, cast on load
    for name, value in master.state_dict().items():
        assert torch.equal(copy.state_dict()[name], value.to(torch.bfloat16)), name
    # all or nothing still: a missing key loads nothing
    before = {k: v.clone() for k, v in copy.state_dict().items()}
    bad = export_state(modeling.tiny_model(tok, **TINY, seed=3), 2)
    del bad["state"]["model.norm.weight"]
    with pytest.raises(WeightMismatchError, match="missing 1 keys"):
        load_state(copy, bad, 2)
    assert all(torch.equal(before[k], v) for k, v in copy.state_dict().items())
    # an integer tensor is never cast into a floating one
    bad = export_state(master, 3)
    bad["state"]["model.norm.weight"] = bad["state"]["model.norm.weight"].astype(np.int64)
    with pytest.raises(WeightMismatchError, match="model.norm.weight: dtype int64 != torch.bfloat16"):
        load_state(copy, bad, 3)
    # a float32 copy (the learner's dtype) casts nothing: a float16 update is refused as before
    plain = inference_copy(modeling.tiny_model(tok, **TINY), torch.float32)
    half = export_state(master, 4)
    half["state"] = {k: v.astype(np.float16) for k, v in half["state"].items()}
    with pytest.raises(WeightMismatchError, match="dtype float16 != torch.float32"):
        load_state(plain, half, 4)


def test_generators_hold_model_dtype_and_load_the_learners_float32_weights() -> None:
    assert {p.dtype for p in Generator(config(), None).backend.model.parameters()} == {torch.float32}  # auto, CPU
    cfg = config("bfloat16")
    generator = Generator(cfg, None)
    assert {p.dtype for p in generator.backend.model.parameters()} == {torch.bfloat16}
    learner = Learner(cfg)
    assert {p.dtype for p in learner.model.parameters()} == {torch.float32}  # master weights
    prompts = arithmetic(1, ["+"], eval_size=10, seed=0).train.slice(0, 2)
    table, info = generator.generate(prompts, seq=0)
    assert table.num_rows == 4 and np.isfinite(np.concatenate(table.column("behavior_logprobs").to_pylist())).all()
    with torch.no_grad():  # weights of a later version
        for p in learner.model.parameters():
            p.add_(0.01)
    assert generator.update_weights(1, learner.publish() | {"version": 1}) == 1
    for name, value in learner.model.state_dict().items():
        assert torch.equal(generator.backend.model.state_dict()[name], value.to(torch.bfloat16)), name


def test_the_learners_reference_is_a_frozen_copy_in_model_dtype() -> None:
    learner = Learner(config("bfloat16", kl_coef=0.1))
    assert {p.dtype for p in learner.reference.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in learner.model.parameters()} == {torch.float32}
    learner.reset_optimizer()  # the reference RL starts from: a new frozen copy, same dtype
    assert {p.dtype for p in learner.reference.parameters()} == {torch.bfloat16}
    assert not any(p.requires_grad for p in learner.reference.parameters())
    # on a CPU, auto keeps it float32 (the KL at step 0 is exactly 0, as before)
    assert {p.dtype for p in Learner(config(kl_coef=0.1)).reference.parameters()} == {torch.float32}
