"""The interface every generation backend implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass
class Samples:
    """Flat outputs for `len(prompts) * n` samples, prompt-major (prompt 0's n samples first)."""
    prompt_ids: list[np.ndarray]  # one int32 array per prompt (without padding)
    response_ids: np.ndarray  # flat int32 token ids of all responses, concatenated
    response_lengths: np.ndarray  # int64 per sample
    logprobs: np.ndarray  # flat float32, one per response token: log-prob under the sampling distribution
    finish_reason: list[str]  # per sample: stop / length
    next_logprobs: np.ndarray | None = None  # per sample: log pi(z | prompt, response), if asked for


def decode_responses(tokenizer, response_ids: np.ndarray, lengths: np.ndarray) -> list[str]:
    """Texts of flat response tokens (the Samples layout), special tokens dropped."""
    ends = np.cumsum(lengths)
    pieces = np.split(response_ids, ends[:-1]) if len(lengths) else []
    return tokenizer.batch_decode(pieces, skip_special_tokens=True)


class Backend(Protocol):
    def generate(self, prompts: list[str], n: int, max_new_tokens: int, temperature: float,
                 top_p: float, top_k: int, greedy: bool) -> Samples: ...

    def decode(self, response_ids: np.ndarray, lengths: np.ndarray) -> list[str]: ...

    def load_weights(self, payload: dict, version: int) -> None:
        """Load a published `{"version", "state"}` payload; all or nothing (actors.weights)."""

    def receive_weights(self, endpoint, link, rank: int, version: int, join: bool = True) -> None:
        """Take a version from a collective broadcast (actors.weight_transport), all or nothing."""
