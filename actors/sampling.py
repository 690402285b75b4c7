"""The sampling distribution, computed the same way by the generator and the learner.

Behaviour log-probs must describe the distribution tokens were actually drawn from: logits divided
by the temperature, then top-k and top-p truncation, renormalised. The generator samples through
`SamplingWarper` and the learner recomputes log-probs with `token_logprobs`; both call
`processed_logits`, so on-policy data gives ratio 1 (clip fraction 0) at any temperature or top-p.
"""

from __future__ import annotations

import torch


def processed_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                     keep: torch.Tensor | None = None) -> torch.Tensor:
    """Logits [..., V] -> temperature-scaled logits with truncated tokens set to -inf.

    top-k keeps the k largest; top-p keeps the most probable tokens until their probability mass
    reaches top_p (the token that crosses it included). `keep` ([...] token ids) is always kept: the
    learner passes the sampled tokens, so a near-tie that rounds differently in its full forward
    pass than in the generator's cached one can never turn a sampled token into -inf.
    """
    x = logits / temperature if temperature != 1.0 else logits
    if top_k <= 0 and top_p >= 1.0:
        return x
    remove = torch.zeros_like(x, dtype=torch.bool)
    if 0 < top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        remove |= x < kth
    if top_p < 1.0:
        masked = x.masked_fill(remove, float("-inf"))
        probs, order = torch.sort(masked.softmax(-1), dim=-1, descending=True)
        before = probs.cumsum(-1) - probs  # mass of the strictly more probable tokens
        drop_sorted = before >= top_p
        remove |= torch.zeros_like(remove).scatter(-1, order, drop_sorted)
    if keep is not None:
        remove.scatter_(-1, keep.unsqueeze(-1), False)
    return x.masked_fill(remove, float("-inf"))


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
                   top_p: float = 1.0) -> torch.Tensor:
    """Log-probs [B, T] of `tokens` [B, T] under the sampling distribution of `logits` [B, T, V]."""
    x = processed_logits(logits.float(), temperature, top_k, top_p, keep=tokens)
    return torch.log_softmax(x, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def token_entropy(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Entropy [B, T] of the sampling distribution at each position (tokens outside top-k/top-p have
    probability 0 and add nothing)."""
    lp = torch.log_softmax(processed_logits(logits.float(), temperature, top_k, top_p), dim=-1)
    p = lp.exp()
    return -torch.where(p > 0, p * lp, torch.zeros_like(p)).sum(-1)


class SamplingWarper:
    """A transformers logits processor applying `processed_logits` at each generation step."""

    def __init__(self, temperature: float, top_k: int, top_p: float):
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        return processed_logits(scores, self.temperature, self.top_k, self.top_p)


# Settings of a model's generation_config that change the sampling distribution in ways the
# learner does not reproduce; a run refuses them by name rather than train on wrong log-probs.
UNSUPPORTED_GENERATION = {
    "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
    "min_length": 0, "min_new_tokens": None, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0,
    "min_p": None, "bad_words_ids": None, "suppress_tokens": None, "begin_suppress_tokens": None,
    "sequence_bias": None, "forced_bos_token_id": None, "forced_eos_token_id": None,
    "exponential_decay_length_penalty": None, "renormalize_logits": False,
}


def unsupported_settings(generation_config) -> dict:
    """Settings of a transformers GenerationConfig that coevo's learner cannot reproduce."""
    found = {}
    for name, neutral in UNSUPPORTED_GENERATION.items():
        value = getattr(generation_config, name, neutral)
        if value not in (neutral, None) and not (isinstance(value, (list, dict)) and not value):
            found[name] = value
    return found
