"""A workload with controlled generation and training costs, for measuring the loop's overlap.

`rollout.backend=benchmarks.synthetic:SleepBackend` generates random tokens after sleeping
`COEVO_SYNTH_GEN_S` seconds per call; `algorithm.advantage=benchmarks.synthetic:slow_grpo` sleeps
`COEVO_SYNTH_TRAIN_S` seconds in the learner before computing GRPO advantages. Sleeping costs no CPU,
so on a 2-core machine the two stages can overlap fully: async step time should approach
max(T_generate, T_train), strict on-policy T_generate + T_train.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from actors.algorithms.advantages import group_relative, grpo
from actors.generation.base import Samples
from actors.weight_transport import node_ip
from actors.weights import load_state


class SleepBackend:
    """Generation is a sleep; weights are installed for real into the (tiny) model it is given, so a
    publish costs what it costs with either `weights.transport`."""

    def __init__(self, model, tokenizer, device: str = "cpu"):
        self.model, self.device = model, device
        self.tokenizer, self.rng = tokenizer, np.random.default_rng(0)
        self.vocab = [i for i in range(len(tokenizer)) if i not in tokenizer.all_special_ids]

    def generate(self, prompts, n, max_new_tokens, temperature=1.0, top_p=1.0, top_k=0, greedy=False) -> Samples:
        time.sleep(float(os.environ.get("COEVO_SYNTH_GEN_S", "0.2")))
        ids = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        rows = len(prompts) * n
        lengths = np.full(rows, max_new_tokens, dtype=np.int64)
        tokens = self.rng.choice(self.vocab, size=int(lengths.sum())).astype(np.int32)
        return Samples(prompt_ids=[np.asarray(i, np.int32) for i in ids], response_ids=tokens,
                       response_lengths=lengths,
                       logprobs=np.full(len(tokens), -np.log(len(self.vocab)), np.float32),
                       finish_reason=["length"] * rows)

    def decode(self, response_ids, lengths):
        return self.tokenizer.batch_decode(np.split(response_ids, np.cumsum(lengths)[:-1]), skip_special_tokens=True)

    def load_weights(self, payload, version):
        load_state(self.model, payload, version, where="synthetic generator's model")

    def receive_weights(self, endpoint, link, rank: int, version: int, join: bool = True) -> None:
        endpoint.receive(link, rank, self.model, version, where="synthetic generator's model", device=self.device,
                         bind=node_ip(), join=join)


@group_relative
def slow_grpo(rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    time.sleep(float(os.environ.get("COEVO_SYNTH_TRAIN_S", "0.2")))
    return grpo(rewards, groups)
