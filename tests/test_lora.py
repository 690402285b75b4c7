"""LoRA on the learner, in-process (no Ray): only the adapters train and sit in the optimizer, on the
padded and the packed path; the KL reference is the base (adapters off, no copy); generators get the
merged weights; a checkpoint holds the adapter and a merged export plain transformers loads; a
resume puts base and adapter back; a warm-up trains the base."""

from __future__ import annotations


import pytest
import torch
from transformers import AutoModelForCausalLM

from actors import lora
from actors.generator import Generator
from actors.learner import Learner
from actors.verifier import Verifier
from orchestrator.config import ConfigError, validate_config
from orchestrator.data import arithmetic
from rl_step import credited
from user_module import on_path

TINY = {"arch": "qwen2", "hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
        "intermediate_size": 64}
REWARD_MODULE = """
def varied(prompt, response, answer, **_):
    return float(sum(map(ord, response)) % 3) / 2
"""


@pytest.fixture(scope="module")
def reward_fn(tmp_path_factory):
    with on_path(tmp_path_factory, "coevo_test_lora_rewards", REWARD_MODULE) as module:
        yield f"{module}:varied"


def make_config(reward_fn, packing="off", kl=0.0, lora_settings=None, **learner):
    return validate_config({
        "seed": 0, "model": {"tiny": TINY},
        "rollout": {"prompts_per_step": 4, "samples_per_prompt": 4, "max_new_tokens": 4},
        "rewards": [{"name": "varied", "fn": reward_fn, "timeout_s": 10}],
        "algorithm": {"lr": 1e-2, "kl_coef": kl},
        "learner": {"packing": packing, "lora": lora_settings or {"r": 4, "alpha": 8}, **learner},
        "train": {"threads": 1}})


@pytest.fixture(scope="module")
def scored(reward_fn):
    config = make_config(reward_fn)
    prompts = arithmetic(1, ["+"], eval_size=10, seed=0).train.slice(0, 4)
    table, _ = Generator(config, None).generate(prompts, seq=0)
    verifier = Verifier(config)
    try:
        table, _ = verifier.score(table)
    finally:
        verifier.close()
    return credited(config, table)[0]  # the loop's credit step on the driver: the advantages column


def snapshot(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def logprobs(learner, model, table) -> torch.Tensor:
    ids, mask, positions, r_ids, r_mask, p_width = learner._sequences(table)
    with torch.no_grad():
        return learner._token_logprobs(model, ids, mask, positions, r_ids, p_width) * r_mask


@pytest.mark.parametrize("packing", ["off", "on"])
def test_only_the_adapters_train_and_sit_in_the_optimizer(reward_fn, scored, packing):
    learner = Learner(make_config(reward_fn, packing=packing))
    assert learner.packing == (packing == "on")
    in_optimizer = {id(p) for g in learner.optimizer.param_groups for p in g["params"]}
    adapters = {id(p) for p in lora.adapter_parameters(learner.model)}
    assert in_optimizer == adapters and adapters
    before = snapshot(learner.model)
    for _ in range(2):
        metrics = learner.train_step(scored)
        assert metrics["train/step_skipped"] == 0 and metrics["train/grad_norm"] > 0
    after = learner.model.state_dict()
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    assert moved and all(".lora_" in k for k in moved)
    assert any(".lora_A." in k for k in moved) and any(".lora_B." in k for k in moved)


def test_packed_and_padded_paths_agree_through_peft(reward_fn, scored):
    padded, packed = Learner(make_config(reward_fn, packing="off")), Learner(make_config(reward_fn, packing="on"))
    m_padded, m_packed = padded.train_step(scored), packed.train_step(scored)
    assert m_padded["train/loss"] == pytest.approx(m_packed["train/loss"], rel=1e-4, abs=1e-6)
    for (k, a), b in zip(padded.model.state_dict().items(), packed.model.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-5), k


@pytest.mark.parametrize("packing", ["off", "on"])
def test_the_kl_reference_is_the_base_without_a_copy(reward_fn, scored, packing):
    learner = Learner(make_config(reward_fn, packing=packing, kl=0.5))
    assert isinstance(learner.reference, lora.AdapterOff) and not list(learner.reference.parameters())
    start = logprobs(learner, learner.model, scored)
    for _ in range(3):
        metrics = learner.train_step(scored)
    assert metrics["train/kl"] > 0  # the policy moved away from the reference
    assert not torch.allclose(logprobs(learner, learner.model, scored), start, atol=1e-4)
    assert torch.allclose(logprobs(learner, learner.reference, scored), start, atol=1e-5)


def test_generators_get_the_merged_weights(reward_fn, scored):
    config = make_config(reward_fn)
    learner, generator = Learner(config), Generator(config, None)
    learner.train_step(scored)
    learner.train_step(scored)
    generator.update_weights(learner.version, learner.publish())
    assert torch.allclose(logprobs(learner, learner.model, scored), logprobs(learner, generator.backend.model, scored),
                          atol=1e-5)


def test_checkpoint_holds_the_adapter_and_a_merged_model_transformers_loads(tmp_path, reward_fn, scored):
    config = make_config(reward_fn)
    learner = Learner(config)
    learner.train_step(scored)
    learner.save_reference(str(tmp_path / "base"))
    out = tmp_path / "ckpt"
    learner.save(str(out))
    assert (out / lora.ADAPTER_DIR / "adapter_model.safetensors").is_file()
    plain = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    assert not hasattr(plain, "peft_config")
    assert torch.allclose(logprobs(learner, plain, scored), logprobs(learner, learner.model, scored), atol=1e-5)
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base", local_files_only=True)
    assert torch.allclose(logprobs(learner, base, scored), logprobs(learner, lora.AdapterOff(learner.model), scored),
                          atol=1e-5)

    # resume: a learner built from the checkpoint's merged export, its adapter and the run's base
    state, optimizer = snapshot(learner.model), learner.optimizer.state_dict()
    resumed = Learner(config, model_source=str(out))
    assert resumed.restore(str(out)) == learner.version
    resumed.load_reference(str(tmp_path / "base"))
    for k, v in resumed.model.state_dict().items():
        assert torch.equal(v, state[k]), k
    got = resumed.optimizer.state_dict()["state"]
    assert len(got) == len(optimizer["state"]) and all(
        torch.equal(got[i]["exp_avg"], optimizer["state"][i]["exp_avg"]) for i in got)
    # and it trains on exactly as the original does
    a, b = learner.train_step(scored), resumed.train_step(scored)
    assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-6)


def test_a_warm_up_trains_the_base_then_rl_the_adapters(reward_fn):
    learner = Learner(make_config(reward_fn))
    prompts = arithmetic(1, ["+"], eval_size=10, seed=0).train.slice(0, 8)
    before = snapshot(learner.model)
    learner.sft_steps([prompts], lr=1e-2)
    moved = [k for k, v in learner.model.state_dict().items() if not torch.equal(before[k], v)]
    assert moved and not any(".lora_" in k for k in moved)
    assert lora.adapters_zero(learner.model)
    learner.end_warmup()
    assert {id(p) for g in learner.optimizer.param_groups for p in g["params"]} == \
        {id(p) for p in lora.adapter_parameters(learner.model)}
    assert all(p.requires_grad == (".lora_" in n) for n, p in learner.model.named_parameters())


def test_a_moving_reference_folds_the_adapters_into_the_base(reward_fn, scored):
    learner = Learner(make_config(reward_fn, kl=0.1))
    learner.train_step(scored)
    now = logprobs(learner, learner.model, scored)
    learner.snapshot_reference()
    assert lora.adapters_zero(learner.model)
    assert torch.allclose(logprobs(learner, learner.model, scored), now, atol=1e-5)
    assert torch.allclose(logprobs(learner, learner.reference, scored), now, atol=1e-5)


@pytest.mark.parametrize("settings,match", [
    ({"learner": {"strategy": "fsdp2", "lora": {"r": 4}}}, "not supported with learner.strategy=fsdp2"),
    ({"learner": {"lora": {"target_modules": ["lm_head"]}}}, "'lm_head' is not supported"),
    ({"learner": {"lora": {"target_modules": []}}}, "target_modules is empty"),
    ({"learner": {"lora": {"r": 0}}}, "lora.r"),
])
def test_bad_lora_settings_are_named(settings, match):
    with pytest.raises(ConfigError, match=match):
        validate_config(settings)


def test_unknown_target_modules_are_named(reward_fn):
    with pytest.raises(ValueError, match=r"learner.lora.target_modules=\['nope_proj'\]"):
        Learner(make_config(reward_fn, lora_settings={"target_modules": ["nope_proj"]}))
