"""Label-free rewards from agreement among the policy's own samples (no reference answer).

- `majority_vote` (the self-consistency reward of test-time RL, e.g. TTRL, Zuo et al. 2025): a
  response is rewarded when its answer is the group's majority answer.
- `co_reward` (Co-Reward, Zhang et al. 2025): each question is paired with an analogous one (for
  arithmetic, the commuted operands); each question is labelled by voting among its own rollouts,
  and its responses are rewarded by agreement with the *other* question's label — cross-referring
  the pair makes collapsing onto a shared wrong answer harder than plain majority vote.

Both are label-free (`@label_free_reward`: with `verifier.fraction` < 1 they still score the prompts the
verifier does not label) and group functions (`@group_reward`): `majority_vote` sees one prompt's responses,
`co_reward` a pair's (`group_by: <pair column>` in the reward spec) together with `prompts`, the
prompt of each response.
"""

from __future__ import annotations

import re
from collections import Counter

from actors.rewards import REWARD_FUNCTIONS, group_reward, label_free_reward
from actors.rewards.text import normalize_text

_INT = re.compile(r"-?\d+")


def extract_answer(response: str, extract: str = "int") -> str | None:
    """The answer a response gives: its first integer (`int`) or its normalised text (`text`)."""
    if extract == "int":
        found = _INT.search(response)
        return found.group() if found else None
    if extract == "text":
        text = normalize_text(response)
        return text or None
    raise ValueError(f"extract must be 'int' or 'text', got {extract!r}")


def majority(answers: list[str | None]) -> str | None:
    """The most common answer; None if there is none or the top count is tied (no label)."""
    counts = Counter(a for a in answers if a is not None).most_common(2)
    if not counts or (len(counts) == 2 and counts[0][1] == counts[1][1]):
        return None
    return counts[0][0]


@REWARD_FUNCTIONS.register("majority_vote")
@label_free_reward
@group_reward
def majority_vote(prompt: str, responses: list[str], extract: str = "int", **_) -> list[float]:
    """1 for each response whose answer is the group's majority answer, else 0. A tie for the
    majority labels nothing: every response gets 0. YAML: `{name: vote, fn: majority_vote}`."""
    answers = [extract_answer(r, extract) for r in responses]
    label = majority(answers)
    return [float(label is not None and a == label) for a in answers]


@REWARD_FUNCTIONS.register("co_reward")
@label_free_reward
@group_reward
def co_reward(prompt: str, responses: list[str], prompts: list[str] | None = None, extract: str = "int",
              **_) -> list[float]:
    """Co-Reward over a question pair: each response is rewarded for agreeing with the majority
    label of the analogous question's rollouts. A question without an analogue in the group (a
    pair of one, e.g. 3+3) falls back to its own majority. YAML:
    `{name: co, fn: co_reward, group_by: pair_id}` with `data.analogs: commuted`."""
    if prompts is None or len(prompts) != len(responses):
        raise ValueError("co_reward needs `prompts`, the prompt of each response (group_by a pair column)")
    answers = [extract_answer(r, extract) for r in responses]
    questions = sorted(set(prompts))
    if len(questions) > 2:
        raise ValueError(f"co_reward groups a question with its analogue; this group has {len(questions)} "
                         f"questions ({questions[:3]}...): check the group_by column")
    labels = {q: majority([a for a, p in zip(answers, prompts) if p == q]) for q in questions}
    other = {q: labels[next((x for x in questions if x != q), q)] for q in questions}
    return [float(other[p] is not None and a == other[p]) for a, p in zip(answers, prompts)]
