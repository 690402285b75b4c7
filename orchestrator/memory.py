"""What an out-of-memory error in a role says: the run ends at once (a restart would run out
again), naming the role, the phase and the settings that lower its memory. Whether the roles'
models fit before they start: orchestrator.fit."""

from __future__ import annotations

# torch's own messages for memory it could not get (the CUDA allocator's, cuBLAS's workspace, the host's)
OOM_TEXT = ("CUDA out of memory", "CUDA error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED",
            "DefaultCPUAllocator: can't allocate memory")
# what a role was doing, by the actor method the driver called
PHASES = {"__init__": "start-up (building or loading its model)", "generate": "generation",
          "judge": "judging", "score": "scoring", "train_step": "a training step",
          "train_step_published": "a training step", "train_step_returns": "a training step",
          "sft_steps": "the SFT warm-up", "call_objective": "a recipe's own learner step (a warm-up's, a critic's)",
          "train_preference": "a preference step", "train_values": "a value step", "values_of": "computing values",
          "train_pairs": "a reward-model step", "update_and_score": "a PRM step",
          "update_weights": "loading a weight update", "receive_weights": "loading a weight update",
          "publish_parts": "exporting its weights", "send_weights": "sending its weights"}


class OutOfMemory(RuntimeError):
    """A role ran out of memory: the run ends (never a restart, which would run out again; unlike a
    RoleError with lost_learner, nothing catches it)."""
    lost_learner = False


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
        if section is None or not hasattr(section, key):
            return ""
        value = getattr(section, key)
        return " (unset now)" if value is None else f"={value}"

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
