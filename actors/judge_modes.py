"""SPARK's pairwise and reflective judging (Liu et al. 2025), shared by the judge reward (the
Generator actor) and the judge's training (actors/objectives/self_judge.py), so both read the
same texts and the same verdict tokens.

- pairwise: "{prompt}{a}|{b}?" -> `first` when response a is the correct one, `second` when b is.
  As a reward, a response's score is its mean win probability against up to 2 x `opponents` other
  responses to the same prompt (ring pairs, each judged in both orders against position bias).
- reflective: the judge first writes a short greedy reflection after "{prompt}{response}|{prompt}"
  (on this task: its own answer to the problem), then after `cue` gives the yes/no verdict.

`score` is a generator's judgment of (prompt, response) rows in whichever format its JudgingSpec
(actors/judging.py) names: the pointwise ones (P(yes), sampled numbers) or SPARK's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from actors.judging import JudgingSpec, next_token_logits, parse_scores, render, single_token, yes_probability


@dataclass(frozen=True)
class Pairwise:
    """SPARK's pairwise format (spark.mode=pairwise): `template` has {prompt}, {a}, {b}."""
    template: str
    first: str  # the verdict token for "a is the correct one" (one token)
    second: str
    opponents: int  # each response meets up to 2 x opponents others of its group


@dataclass(frozen=True)
class Reflective:
    """SPARK's reflective format (spark.mode=reflective): a greedy reflection of up to `tokens` after
    `template`, then the yes/no verdict after `cue`."""
    template: str
    cue: str
    tokens: int


def score(spec: JudgingSpec, backend, prompts: list[str], responses: list[str], groups: list,
          sampling: dict) -> tuple[np.ndarray, list]:
    """The judge's score of each (prompt, response) and why there is none (None where there is one).
    `backend`: the generator's (model, tokenizer, device, generate, decode); `sampling`: temperature,
    top_p and top_k of the sampled judgments."""
    model, tok, device = backend.model, backend.tokenizer, backend.device
    fmt = spec.format
    if isinstance(fmt, Pairwise):
        first = single_token(tok, fmt.first, "spark.first")
        second = single_token(tok, fmt.second, "spark.second")
        return pairwise_win_rates(model, tok, prompts, responses, groups, fmt.template, first, second,
                                  fmt.opponents, device)
    if fmt is not None and not isinstance(fmt, Reflective):
        raise TypeError(f"JudgingSpec.format must be None, Pairwise or Reflective, got {fmt!r}")
    if isinstance(fmt, Reflective) or spec.mode == "yes_prob":
        yes = single_token(tok, spec.yes, "judge.yes")
        no = single_token(tok, spec.no, "judge.no")
        if isinstance(fmt, Reflective):
            texts = reflective_texts(model, tok, fmt.template, fmt.cue, prompts, responses, fmt.tokens, device)
        else:
            texts = [render(spec.template, p, r) for p, r in zip(prompts, responses)]
        return yes_probability(model, tok, texts, yes, no, device), [None] * len(texts)
    texts = [render(spec.template, p, r) for p, r in zip(prompts, responses)]
    out = backend.generate(texts, n=spec.samples, max_new_tokens=spec.max_new_tokens, **sampling)
    judgments = backend.decode(out.response_ids, out.response_lengths)
    values, errors = np.full(len(texts), np.nan, dtype=np.float32), []
    for j in range(len(texts)):
        value, why = parse_scores(judgments[j * spec.samples:(j + 1) * spec.samples], spec.pattern, spec.scale)
        values[j] = np.nan if value is None else value
        errors.append(why)
    return values, errors


def render_pair(template: str, prompt: str, a: str, b: str) -> str:
    return template.replace("{prompt}", prompt).replace("{a}", a).replace("{b}", b)


def opponent_pairs(n: int, opponents: int) -> list[tuple[int, int]]:
    """Unordered pairs (i, i + d mod n), d = 1..opponents: every member of a group of n meets up to
    2 x opponents others (all n - 1 once 2 x opponents >= n - 1), with n x opponents pairs at most."""
    pairs = {tuple(sorted((i, (i + d) % n))) for i in range(n) for d in range(1, min(opponents, n - 1) + 1)}
    return sorted(pairs)


def pairwise_win_rates(model, tokenizer, prompts: list[str], responses: list[str], groups: list,
                       template: str, first: int, second: int, opponents: int, device) -> tuple[np.ndarray, list]:
    """Each response's mean probability of beating its opponents in its group (NaN with a reason
    where the group holds no other response). P(i beats j) = (P(first | i, j) + P(second | j, i)) / 2.
    Cost: 2 forward passes per pair, at most 2 x opponents per response."""
    n = len(responses)
    members: dict = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    pairs = [(m[a], m[b]) for m in members.values() for a, b in opponent_pairs(len(m), opponents)]
    texts = [render_pair(template, prompts[i], responses[i], responses[j]) for i, j in pairs]
    texts += [render_pair(template, prompts[i], responses[j], responses[i]) for i, j in pairs]
    p_first = yes_probability(model, tokenizer, texts, first, second, device) if pairs else np.zeros(0)
    wins, meets = np.zeros(n), np.zeros(n)
    for k, (i, j) in enumerate(pairs):
        i_wins = (p_first[k] + 1.0 - p_first[len(pairs) + k]) / 2
        wins[i] += i_wins
        wins[j] += 1.0 - i_wins
        meets[i] += 1
        meets[j] += 1
    scores = np.where(meets > 0, wins / np.maximum(meets, 1), np.nan).astype(np.float32)
    errors = [None if meets[i] else "pairwise judging needs another response to the same prompt" for i in range(n)]
    return scores, errors


@torch.no_grad()
def reflect(model, tokenizer, texts: list[str], max_new_tokens: int, device, micro_batch: int = 128) -> list[str]:
    """Greedy continuations of `texts` (up to max_new_tokens, cut at EOS): the judge's reflection.
    A full forward pass per token (a handful of tokens), so it works on any wrapped model."""
    eos, out = tokenizer.eos_token_id, []
    for start in range(0, len(texts), micro_batch):
        ids = tokenizer(texts[start:start + micro_batch], add_special_tokens=False)["input_ids"]
        new = [[] for _ in ids]
        done = [False] * len(ids)
        for _ in range(max_new_tokens):
            nxt = next_token_logits(model, tokenizer.pad_token_id, [s + t for s, t in zip(ids, new)],
                                    device).argmax(-1).tolist()
            for i, t in enumerate(nxt):
                if not done[i]:
                    done[i] = t == eos
                    if not done[i]:
                        new[i].append(t)
            if all(done):
                break
        out.extend(tokenizer.decode(t) if t else "" for t in new)
    return out


def reflective_texts(model, tokenizer, template: str, cue: str, prompts: list[str], responses: list[str],
                     max_new_tokens: int, device) -> list[str]:
    """The judge's full reflect-then-judge texts: template, its reflection, then the verdict cue."""
    heads = [render(template, p, r) for p, r in zip(prompts, responses)]
    return [h + r + cue for h, r in zip(heads, reflect(model, tokenizer, heads, max_new_tokens, device))]
