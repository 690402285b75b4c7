"""Log-probs and entropy from the final hidden states, in chunks (docs/learner.md#memory).

During one packed forward (actors.packing) the causal LM's output layer is replaced by a `TokenHead`:
it keeps only the positions that predict a response token (and, where asked, each row's tail), and
turns them into the sampled tokens' log-probs under the sampling distribution (actors.sampling) and,
where asked, its entropy, a chunk of tokens at a time. Each chunk's vocabulary logits live only
inside that chunk's computation: with gradients, the chunk is recomputed in the backward pass
(activation checkpointing), so a micro-batch never holds [tokens, vocabulary] logits in fp32.

The head runs inside the model's own forward, so a sharded model's (fsdp2) output layer is gathered
as usual.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils.checkpoint import checkpoint

from actors.sampling import processed_logits

CHUNK_BYTES = 256 * 2**20  # fp32 logits of one chunk


def _chunk_stats(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                 temperature: float, top_k: int, top_p: float, entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.nn.functional.linear(h, weight, bias).float()
    x = processed_logits(logits, temperature, top_k, top_p, keep=targets)
    lp = torch.log_softmax(x, dim=-1)
    logp = lp.gather(-1, targets[:, None]).squeeze(-1)
    if not entropy:
        return logp, logp.new_zeros(())
    if top_k > 0 or top_p < 1.0:  # the entropy's distribution does not keep the sampled token
        lp = torch.log_softmax(processed_logits(logits, temperature, top_k, top_p), dim=-1)
    p = lp.exp()
    return logp, -torch.where(p > 0, p * lp, torch.zeros_like(p)).sum(-1)


class TokenHead(torch.nn.Module):
    """Stands in for `head` (the LM's output layer) in one forward; results in `logp`, `entropy`, `tail`."""

    def __init__(self, head: torch.nn.Module, at: torch.Tensor, targets: torch.Tensor, tail: torch.Tensor | None,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, entropy: bool = False):
        super().__init__()
        self.head = head
        self.at, self.targets, self.tail_at = at, targets, tail
        self.sampling = (temperature, top_k, top_p)
        self.want_entropy = entropy
        self.logp = self.entropy = self.tail = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        h = hidden.reshape(-1, hidden.shape[-1])
        weight, bias = self.head.weight, getattr(self.head, "bias", None)
        chunk = max(64, CHUNK_BYTES // (4 * weight.shape[0]))
        selected = h[self.at]
        logps, ents = [], []
        for start in range(0, len(selected), chunk):
            args = (selected[start:start + chunk], weight, bias, self.targets[start:start + chunk], *self.sampling,
                    self.want_entropy)
            if len(selected) > chunk and torch.is_grad_enabled() and (selected.requires_grad or weight.requires_grad):
                lp, ent = checkpoint(_chunk_stats, *args, use_reentrant=False)
            else:
                lp, ent = _chunk_stats(*args)
            logps.append(lp)
            ents.append(ent)
        self.logp = torch.cat(logps) if logps else selected.new_zeros(0, dtype=torch.float32)
        if self.want_entropy:
            self.entropy = torch.cat(ents) if ents else self.logp
        if self.tail_at is not None:  # a handful of rows: their whole next-token logits
            self.tail = torch.nn.functional.linear(h[self.tail_at], weight, bias)
        return hidden.new_zeros(())


@contextlib.contextmanager
def installed(model: torch.nn.Module, head: TokenHead):
    """`model`'s output layer replaced by `head` inside the block."""
    inner = getattr(model, "module", model)
    original = inner.get_output_embeddings()
    inner.set_output_embeddings(head)
    try:
        yield head
    finally:
        inner.set_output_embeddings(original)
