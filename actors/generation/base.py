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
    texts: list[str] | None = None  # per sample: the response text, where stop strings cut it; None: decode


def decode_responses(tokenizer, response_ids: np.ndarray, lengths: np.ndarray) -> list[str]:
    """Texts of flat response tokens (the Samples layout), special tokens dropped."""
    ends = np.cumsum(lengths)
    pieces = np.split(response_ids, ends[:-1]) if len(lengths) else []
    return tokenizer.batch_decode(pieces, skip_special_tokens=True)


def cut_at_stop(text: str, stop: list[str]) -> str:
    """`text` up to the stop string that completes first in it (ties: the first listed), which is
    where vLLM cuts a response with include_stop_str_in_output=False; unchanged if none occurs."""
    cut, end = None, None
    for s in stop:
        i = text.find(s)
        if i >= 0 and (end is None or i + len(s) < end):
            cut, end = i, i + len(s)
    return text if cut is None else text[:cut]


def stop_texts(texts: list[str], stopped: list[bool], stop: list[str]) -> list[str]:
    """The response texts the verifier sees: those a stop string ended, cut before it."""
    return [cut_at_stop(t, stop) if s else t for t, s in zip(texts, stopped)]


class Backend(Protocol):
    can_sleep: bool  # whether sleep/wake_up free accelerator memory (vLLM on a GPU)

    def generate(self, prompts: list[str], n: int, max_new_tokens: int, temperature: float,
                 top_p: float, top_k: int, greedy: bool, stop: list[str] = ()) -> Samples:
        """`stop`: a sample also ends after the token that completes one of these strings in its
        text (kept, with its log-prob); `Samples.texts` then holds the texts cut before the string."""

    def decode(self, response_ids: np.ndarray, lengths: np.ndarray) -> list[str]: ...

    def sleep(self, level: int) -> None:
        """Where `can_sleep`: free accelerator memory (1: weights offloaded, 2: discarded)."""

    def wake_up(self) -> None:
        """Undo `sleep`; after level 2 the weights are garbage until the next load."""

    def load_weights(self, payload: dict, version: int) -> None:
        """Load a published `{"version", "state"}` payload; all or nothing (actors.weights)."""

    def receive_weights(self, endpoint, link, rank: int, version: int, join: bool = True) -> None:
        """Take a version from a collective broadcast (actors.weight_transport), all or nothing."""
