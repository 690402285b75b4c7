"""vLLM backend (`rollout.backend: vllm`): vLLM samples, coevo's batch contract comes out.

All vLLM specifics live in `actors.generation.vllm_adapter`; vLLM is imported only when a backend
is built, so the main install (no vLLM) still lists and validates the backend name.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from actors.chat import stop_token_ids
from actors.generation import BACKENDS
from actors.generation.base import Samples, decode_responses, stop_texts
from actors.sampling import unsupported_settings
from actors.weights import WeightMismatchError, check_state, payload_state


@BACKENDS.register("vllm")
class VLLMBackend:
    def __init__(self, model: torch.nn.Module, tokenizer, device: str = "cpu", seed: int = 0,
                 sleep_mode: bool = False):
        from actors.generation.vllm_adapter import Engine

        unsupported = unsupported_settings(model.generation_config)
        if unsupported:
            raise ValueError(f"the model's generation_config sets {unsupported}, which the learner cannot "
                             "reproduce in its log-probs; remove them from generation_config.json")
        self.tokenizer = tokenizer
        self.device = device
        # the generation_config's eos ids, the tokenizer's, and the chat template's end-of-turn tokens
        self.eos_ids = stop_token_ids(model.generation_config, tokenizer)
        self.engine = Engine(model, tokenizer, device=device, seed=seed, sleep_mode=sleep_mode)
        # Only names, shapes and dtypes are kept to check updates against (the weights live in vLLM).
        self.reference = model.to("meta")

    @property
    def can_sleep(self) -> bool:
        return self.engine.can_sleep

    def sleep(self, level: int) -> None:
        self.engine.sleep(level)

    def wake_up(self) -> None:
        self.engine.wake_up()

    @property
    def model(self):  # the yes/no judge reads logits from an HF model, which vLLM does not expose
        raise NotImplementedError("rollout.backend=vllm has no HF model for judge.mode=yes_prob; "
                                  "use judge.mode=generate or rollout.backend=hf")

    def generate(self, prompts: list[str], n: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, top_k: int = 0, greedy: bool = False, next_token: int | None = None,
                 stop: list[str] = ()) -> Samples:
        if next_token is not None:
            raise NotImplementedError("rollout.backend=vllm does not compute LaSeR's next-token log-prob; "
                                      "use rollout.backend=hf for laser rewards")
        enc = self.tokenizer(prompts, add_special_tokens=False)
        prompt_ids = [np.asarray(ids, dtype=np.int32) for ids in enc["input_ids"]]
        return self._generate(prompt_ids, n, max_new_tokens, temperature, top_p, top_k, greedy, stop)

    def generate_ids(self, prompt_ids: list[np.ndarray], max_new_tokens: int, temperature: float = 1.0,
                     top_p: float = 1.0, top_k: int = 0, greedy: bool = False, stop: list[str] = ()) -> Samples:
        """One sample per prompt given as token ids. A multi-turn episode's next turn sends its whole
        context again; vLLM's prefix cache (on: vllm_adapter.Engine) finds the earlier turns' blocks
        by their token ids, so only the new tokens are computed."""
        return self._generate([np.asarray(p, dtype=np.int32) for p in prompt_ids], 1, max_new_tokens,
                              temperature, top_p, top_k, greedy, stop, each=True)

    def _generate(self, prompt_ids: list[np.ndarray], n: int, max_new_tokens: int, temperature: float,
                  top_p: float, top_k: int, greedy: bool, stop, each: bool = False) -> Samples:
        # The seed comes from torch's generator, which the Generator seeds per request (`seq`): a
        # retried request draws the same samples. One sample per context (episodes): one seed each,
        # so the n episodes of a row, whose first contexts are the same, draw differently.
        if greedy:
            seed = None
        elif each:
            seed = torch.randint(0, 2**31 - 1, (len(prompt_ids),)).tolist()
        else:
            seed = int(torch.randint(0, 2**31 - 1, ()).item())
        groups = self.engine.generate([p.tolist() for p in prompt_ids], n=n, max_tokens=max_new_tokens,
                                      temperature=temperature, top_p=top_p, top_k=top_k, greedy=greedy,
                                      stop_token_ids=self.eos_ids, seed=seed, stop=stop)
        flat = [c for group in groups for c in group]
        tokens = [c.token_ids for c in flat]
        out = Samples(
            prompt_ids=prompt_ids,
            response_ids=np.asarray([t for ts in tokens for t in ts], dtype=np.int32),
            response_lengths=np.asarray([len(ts) for ts in tokens], dtype=np.int64),
            logprobs=np.asarray([lp for c in flat for lp in c.logprobs], dtype=np.float32),
            finish_reason=["stop" if c.finish_reason == "stop" else "length" for c in flat],
        )
        if stop:  # texts cut as the HF backend cuts them (the verifier sees the same whichever backend)
            out.texts = stop_texts(self.decode(out.response_ids, out.response_lengths),
                                   [c.stop_string is not None for c in flat], stop)
        return out

    def decode(self, response_ids: np.ndarray, lengths: np.ndarray) -> list[str]:
        return decode_responses(self.tokenizer, response_ids, lengths)

    def load_weights(self, payload: dict, version: int) -> None:
        """A published `{"version", "state"}` payload (numpy from the object store, or tensors from a
        collective transport): checked whole against the model's names/shapes/dtypes, then loaded."""
        if payload.get("version") != version:
            raise WeightMismatchError(f"weight update for the vLLM generator says version {payload.get('version')} "
                                      f"but was sent as version {version}")
        state = payload_state(payload)
        check_state(self.reference, state, where="vLLM generator's model")
        with warnings.catch_warnings():  # object-store arrays are read-only; vLLM copies them
            warnings.simplefilter("ignore", UserWarning)
            tensors = {k: torch.as_tensor(v) for k, v in state.items()}
        self.engine.load_weights(tensors)

    def receive_weights(self, endpoint, link, rank: int, version: int, join: bool = True) -> None:
        """The collective transport (actors.weight_transport): it checks the staged version against
        `_EngineSink.state_dict()` and installs it through `load_state_dict`, i.e. the same in-place
        `Engine.load_weights` as the object store."""
        from actors.weight_transport import node_ip

        endpoint.receive(link, rank, _EngineSink(self), version, where="vLLM generator's model",
                         device=self.device, bind=node_ip(), join=join)


class _EngineSink:
    """What the collective receiver needs of a model: names/shapes/dtypes, and a strict full load."""

    def __init__(self, backend: VLLMBackend):
        self.backend = backend

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.backend.reference.state_dict()

    @property
    def coevo_casts_updates(self) -> bool:  # actors.weights.CASTS_UPDATES: the engine's dtype is model.dtype's
        return getattr(self.backend.reference, "coevo_casts_updates", False)

    def load_state_dict(self, state: dict[str, torch.Tensor], strict: bool = True) -> None:
        self.backend.engine.load_weights(state)
