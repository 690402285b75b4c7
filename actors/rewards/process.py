"""Process (per-step) rewards: split a response into reasoning steps, score each step, and place
the step rewards at each step's last token (`token_rewards.<source>`, consumed by the aggregation
stage's `process:` entry and then by the advantage estimator).

A process function is marked `@process_reward` and returns one float per step. Steps end at the
source's `step_delimiter` (the delimiter belongs to the step it ends; a trailing piece without a
delimiter is a step too; pieces with nothing but the delimiter are not steps). The empty delimiter
makes every response token one step.
"""

from __future__ import annotations

import re

import numpy as np

from actors.rewards import REWARD_FUNCTIONS, process_reward


def split_steps(response: str, delimiter: str) -> list[tuple[str, int]]:
    """[(step text, end offset in characters, exclusive)] of `response` cut after each delimiter."""
    if delimiter == "":
        raise ValueError("split_steps: the empty delimiter means one step per token (see step_ends)")
    steps, start = [], 0
    while start < len(response):
        cut = response.find(delimiter, start)
        end = len(response) if cut < 0 else cut + len(delimiter)
        text = response[start:end]
        if text[:len(text) - len(delimiter)] if cut >= 0 else text:  # something besides the delimiter
            steps.append((text, end))
        start = end
    return steps


def token_positions(token_ends: np.ndarray, step_ends: list[int]) -> np.ndarray:
    """For each step's end offset, the index of the token that completes it: the first token whose
    cumulative decoded length reaches the offset."""
    return np.searchsorted(token_ends, np.asarray(step_ends, dtype=np.int64), side="left")


def step_rewards_row(values: list[float], positions: np.ndarray, n_tokens: int) -> list[float | None]:
    """One response's token_rewards: the step values at their last tokens, None elsewhere. Two steps
    ending on one token (a token spanning a delimiter) add up."""
    row: list[float | None] = [None] * n_tokens
    for v, p in zip(values, positions):
        row[int(p)] = float(v) + (row[int(p)] or 0.0)
    return row


@REWARD_FUNCTIONS.register("step_pattern")
@process_reward
def step_pattern(prompt: str, response: str, steps: list[str], pattern: str = r"\S", reward: float = 1.0,
                 otherwise: float = 0.0, **_) -> list[float]:
    """A rule-based per-step reward: `reward` for a step that matches the regular expression
    `pattern`, else `otherwise`. The default (any non-blank step earns 1) is the naive process
    reward that rewards *more steps* — shape it with `aggregate.process: {<name>: {transform: clip}}`
    or `delta`. YAML: `{name: steps, fn: step_pattern, step_delimiter: "\\n", args: {pattern: "="}}`."""
    rx = re.compile(pattern)
    return [reward if rx.search(s) else otherwise for s in steps]
