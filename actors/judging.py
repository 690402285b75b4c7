"""The policy as a judge (LLM-as-a-judge): a judge prompt built from (prompt, response) and either
the probability of a "yes" token at its end, or a number parsed from k sampled judgments.

Used by the Generator actor (the judge shares the policy's weights and weight channel) and by the
judging warm-up that teaches a small model the judge format. A judgment that cannot be made (empty
response, an unparseable score) is a null with a reason, as with verifiers.

A generator judges only with a `JudgingSpec`, a role argument its recipe builds from the config's
judge section (and SPARK's format): the actor reads no recipe section itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class JudgingSpec:
    """How a generator judges (`Generator.judge`), from the judge section (pipelines/stages/judge.py)."""
    sources: tuple[str, ...]  # the judge reward sources it fills: reward.<name> / reward_error.<name>
    template: str  # {prompt}, {response}
    mode: str  # "yes_prob": P(yes) after the template; "sampled": numbers parsed from k judgments
    yes: str  # one token each
    no: str
    samples: int  # sampled mode: judgments per response
    max_new_tokens: int  # sampled mode
    pattern: str  # sampled mode: the score in a judgment
    scale: float  # sampled mode: parsed score / scale
    # SPARK's pairwise or reflective format (actors/judge_modes.py: Pairwise, Reflective); None: the
    # pointwise judgment above
    format: object = None


def render(template: str, prompt: str, response: str) -> str:
    """Fill a judge template ({prompt}, {response}) without str.format (braces in texts are harmless)."""
    return template.replace("{prompt}", prompt).replace("{response}", response)


def single_token(tokenizer, word: str, key: str) -> int:
    ids = tokenizer(word, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(f"{key} {word!r} is {len(ids)} tokens for this tokenizer; pick a word that is one token")
    return ids[0]


def next_token_logits(model, pad_id: int, ids: list[list[int]], device) -> torch.Tensor:
    """The logits after each token sequence, in one left-padded forward pass (every row's next-token
    logits are then at the last position)."""
    width = max(len(s) for s in ids)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, s in enumerate(ids):
        input_ids[i, width - len(s):] = torch.tensor(s)
        mask[i, width - len(s):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return model(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                 position_ids=positions.to(device)).logits[:, -1].float()


@torch.no_grad()
def yes_probability(model, tokenizer, texts: list[str], yes_id: int, no_id: int, device: str,
                    micro_batch: int = 128) -> np.ndarray:
    """P(yes) / (P(yes) + P(no)) for the token after each judge text: one forward pass each."""
    out = np.zeros(len(texts), dtype=np.float32)
    for start in range(0, len(texts), micro_batch):
        pair = verdict_logprobs(model, tokenizer, texts[start:start + micro_batch], yes_id, no_id, device)
        out[start:start + len(pair)] = pair[:, 0].exp().cpu().numpy()
    return out


def verdict_logprobs(model, tokenizer, texts: list[str], yes_id: int, no_id: int, device: str) -> torch.Tensor:
    """log P(yes), log P(no) of the token after each judge text, normalised over the two (rows x 2),
    with gradients unless the caller turned them off (a critic trains on them)."""
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    logits = next_token_logits(model, tokenizer.pad_token_id, ids, device)
    return torch.log_softmax(logits[:, [yes_id, no_id]], dim=-1)


def parse_scores(judgments: list[str], pattern: str, scale: float) -> tuple[float | None, str | None]:
    """The mean of the numbers parsed from k judgments (each divided by `scale`); None and a reason
    if none of them holds one."""
    found = []
    for text in judgments:
        match = re.search(pattern, text)
        if match:
            try:
                found.append(float(match.group(0)) / scale)
            except ValueError:
                continue
    if not found:
        shown = ", ".join(repr(j[:20]) for j in judgments[:3])
        return None, f"no score matching {pattern!r} in {len(judgments)} judgments ({shown})"
    return float(np.mean(found)), None
