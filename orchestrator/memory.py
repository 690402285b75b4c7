"""GPU memory: whether the roles' models fit the GPU memory they ask for (checked before any actor
starts, where this process can see the GPU), and what an out-of-memory error in a role says: the
run ends at once (a restart would run out again), naming the role, the phase and the settings that
lower its memory.

Ray's GPU fractions decide where an actor runs, not how much memory it may take: roles that share
a GPU share its memory, so the check holds each role to its share (`roles.<name>.num_gpus` of the
GPU's memory) and the shares of one GPU never add up to more than all of it.
"""

from __future__ import annotations

from orchestrator.config import ConfigError
from orchestrator.roles import RoleError

GiB = 2**30
# what a learner keeps per parameter: float32 weights, gradients and AdamW's two moments
LEARNER_BYTES = 16
# torch's own messages for memory it could not get (the CUDA allocator's, cuBLAS's workspace, the host's)
OOM_TEXT = ("CUDA out of memory", "CUDA error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED",
            "DefaultCPUAllocator: can't allocate memory")
# what a role was doing, by the actor method the driver called
PHASES = {"__init__": "start-up (building or loading its model)", "generate": "generation",
          "judge": "judging", "score": "scoring", "train_step": "a training step",
          "train_step_published": "a training step", "train_step_returns": "a training step",
          "sft_steps": "the SFT warm-up", "laser_align_steps": "the self-verification warm-up",
          "train_preference": "a preference step", "train_values": "a value step", "values_of": "computing values",
          "train_pairs": "a reward-model step", "update_and_score": "a PRM step",
          "update_weights": "loading a weight update", "receive_weights": "loading a weight update",
          "publish_parts": "exporting its weights", "send_weights": "sending its weights"}


class OutOfMemory(RoleError):
    """A role ran out of memory: the run ends (never a restart, which would run out again)."""

    def __init__(self, message: str):
        super().__init__(message, lost_learner=False)


def is_oom(error: BaseException | None) -> bool:
    """Whether `error` (a Ray error wrapping an actor's exception, or one of its causes) is torch
    running out of memory."""
    seen = 0
    while error is not None and seen < 8:
        if type(error).__name__ == "OutOfMemoryError" and isinstance(error, RuntimeError):  # torch's
            return True
        if any(text in str(error) for text in OOM_TEXT):
            return True
        error = getattr(error, "cause", None) or error.__cause__
        seen += 1
    return False


def out_of_memory(name: str, kind: str, method: str, error: BaseException, config=None,
                  num_gpus: float = 0.0, where: str = "") -> OutOfMemory:
    """The error that ends the run: the role (`where`: which replica or rank), the phase, torch's
    first line, and what to turn."""
    phase = PHASES.get(method, method)
    first = _first_line(error)
    where = f" ({where})" if where else ""
    detail = f": {first.strip()[:300]}" if first else ""
    return OutOfMemory(f"role {name!r}{where} ran out of memory during {phase}{detail}. The run stops here (a "
                       f"restart would run out again). To lower its memory: {advice(name, kind, config, num_gpus)}")


def _first_line(error: BaseException) -> str:
    """torch's own line, from where it names the memory (a traceback's `torch.OutOfMemoryError: ` cut off)."""
    for line in str(getattr(error, "cause", None) or error).splitlines():
        for text in OOM_TEXT:
            if text in line:
                return line[line.index(text):]
    return ""


def advice(name: str, kind: str, config=None, num_gpus: float = 0.0) -> str:
    """The settings that lower role `name`'s memory, with their values in `config`."""
    def now(section, key: str) -> str:
        return f"={getattr(section, key)}" if section is not None and hasattr(section, key) else ""

    algo = getattr(config, "algorithm", None)
    learner = getattr(config, "learner", None)
    rollout = getattr(config, "rollout", None)
    model = getattr(config, "model", None)
    tips = []
    if kind == "learner":
        if algo is not None and "micro_batch_tokens" in type(algo).model_fields:
            tips.append(f"algorithm.micro_batch_tokens{now(algo, 'micro_batch_tokens')} (tokens per forward/backward)")
        tips.append(f"algorithm.micro_batch_size{now(algo, 'micro_batch_size')} (rows per forward/backward)")
        if learner is not None and "gradient_checkpointing" in type(learner).model_fields:
            tips.append(f"learner.gradient_checkpointing=true (now {learner.gradient_checkpointing})")
        tips.append(f"learner.strategy=fsdp2 with roles.{name}.replicas > 1 (shards weights, gradients and AdamW "
                    "states over the ranks), or learner.cpu_offload=true")
    elif kind == "generator":
        tips.append(f"rollout.chunk_prompts{now(rollout, 'chunk_prompts')} (prompts per generate call: fewer "
                    "samples' KV cache at once)")
        tips.append(f"rollout.max_new_tokens{now(rollout, 'max_new_tokens')}")
    if kind in ("generator", "scorer") or (kind == "learner" and algo is not None and algo.kl_coef > 0):
        tips.append(f"model.dtype{now(model, 'dtype')} (bfloat16 halves the copies that do not train)")
    share = f"={num_gpus:g}" if num_gpus else ""
    tips.append(f"roles.{name}.num_gpus{share} (its share of a GPU: the roles on one GPU share its memory, "
                "whatever their fractions; 1 gives it a GPU of its own)")
    return "; ".join(tips)


# ---- does it fit? ----------------------------------------------------------------------------------
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

