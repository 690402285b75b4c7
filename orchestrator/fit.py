"""Whether the roles' models fit the GPU memory they ask for, checked before any actor starts where
this process can see the GPU they run on (orchestrator.run).

Ray's GPU fractions decide where an actor runs, not how much memory it may take: roles that share
a GPU share its memory, so the check holds each role to its share (`roles.<name>.num_gpus` of the
GPU's memory), and Ray never lets the shares of one GPU add up to more than all of it.
"""

from __future__ import annotations

from orchestrator.config import ConfigError
from orchestrator.memory import advice

GiB = 2**30
# what a learner keeps per parameter: float32 weights, gradients and AdamW's two moments
LEARNER_BYTES = 16


def gpu_memory() -> tuple[int, str] | None:
    """(bytes, name) of this process's first GPU; None where it sees none (a driver off the GPU nodes)."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return int(props.total_memory), props.name


def parameter_count(model_cfg) -> int:
    """The policy's parameters, counted on the meta device (no weight is built or read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from actors import modeling

    with torch.device("meta"):
        if model_cfg.path:
            config = AutoConfig.from_pretrained(model_cfg.path, local_files_only=True)
            model = AutoModelForCausalLM.from_config(config)
        else:
            t = model_cfg.tiny
            model = modeling.tiny_model(modeling.char_tokenizer(), arch=t.arch, hidden_size=t.hidden_size,
                                        num_layers=t.num_layers, num_heads=t.num_heads, num_kv_heads=t.num_kv_heads,
                                        intermediate_size=t.intermediate_size)
    return sum(p.numel() for p in model.parameters())


def _kv_bytes_per_token(model_cfg, dtype_bytes: int) -> int:
    """Keys and values of one token over every layer."""
    if model_cfg.path:
        from transformers import AutoConfig

        c = AutoConfig.from_pretrained(model_cfg.path, local_files_only=True)
        layers, heads = c.num_hidden_layers, c.num_attention_heads
        kv, hidden = getattr(c, "num_key_value_heads", None) or heads, c.hidden_size
        head_dim = getattr(c, "head_dim", None) or hidden // heads
    else:
        t = model_cfg.tiny
        layers, kv, head_dim = t.num_layers, t.num_kv_heads, t.hidden_size // t.num_heads
    return 2 * layers * kv * head_dim * dtype_bytes


def needs(name: str, spec, config, params: int) -> tuple[int, str]:
    """(bytes, why) a replica of role `name` needs at least on its GPU: its model's weights (and a
    learner's gradients and AdamW states, a generator's KV cache of the new tokens). Activations and
    the prompts' KV cache come on top. Every model role is taken to host a model of the policy's size."""
    from actors.modeling import inference_dtype

    low = inference_dtype(config.model.dtype, "cuda").itemsize
    if spec.kind == "learner":
        ranks = spec.replicas if config.learner.strategy == "fsdp2" else 1
        total = LEARNER_BYTES * params // ranks
        why = f"float32 weights, gradients and AdamW states ({LEARNER_BYTES} bytes a parameter{f' / {ranks} ranks' if ranks > 1 else ''})"
        if (name == "policy_learner" and config.algorithm.kl_coef > 0) or name == "prm_learner":
            total += low * params
            why += f" + its frozen reference ({low} bytes a parameter)"
        return total, why
    if spec.kind == "generator":
        r = config.rollout
        prompts = r.chunk_prompts or max(1, r.prompts_per_step // max(1, spec.max_replicas))
        kv = _kv_bytes_per_token(config.model, low) * prompts * r.samples_per_prompt * r.max_new_tokens
        return low * params + kv, (f"weights ({low} bytes a parameter) + the KV cache of "
                                   f"{prompts * r.samples_per_prompt} samples x {r.max_new_tokens} new tokens")
    return low * params, f"weights ({low} bytes a parameter)"


def check_fit(config, specs: dict, gpu: tuple[int, str] | None) -> None:
    """Raise ConfigError where a role's model cannot fit its share of the GPU (`gpu`: memory, name;
    None: unknown here, nothing is checked). `specs`: resolved role specs."""
    on_gpu = {name: spec for name, spec in specs.items() if spec.num_gpus and spec.kind in ("learner", "generator", "scorer")}
    if gpu is None or not on_gpu:
        return
    total, gpu_name = gpu
    params = parameter_count(config.model)
    problems, kinds = [], {}
    for name, spec in on_gpu.items():
        need, why = needs(name, spec, config, params)
        have = spec.num_gpus * total
        if need > have:
            problems.append(f"  {name}: at least {need / GiB:.1f} GiB a replica ({why}); its share "
                            f"roles.{name}.num_gpus={spec.num_gpus:g} is {have / GiB:.1f} GiB")
            kinds[name] = spec
    if problems:
        tips = "\n".join(f"  {name}: {advice(name, spec.kind, config, spec.num_gpus)}" for name, spec in kinds.items())
        raise ConfigError(f"the roles' models do not fit the GPU memory they ask for ({gpu_name}, "
                          f"{total / GiB:.1f} GiB; a model of {params / 1e6:,.1f}M parameters; activations come on "
                          f"top):\n" + "\n".join(problems) + "\nto lower what they need, or give them more:\n" + tips)
