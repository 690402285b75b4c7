"""The scarce-label benchmark's upper bound (benchmarks/self_judges.py, recipe `grpo_oracle_fill`):
the task's own verifier as a label-free source, a judge that is always right, or one wrong on a
fixed share of answers (`flip`). It fills the prompts `verifier.fraction` leaves unlabelled, so a run
measures what a judge of that quality could add; no recipe uses it. Imported by the reward sandbox
from this directory (the benchmark puts it on PYTHONPATH)."""

from __future__ import annotations

import hashlib

from actors.rewards import REWARD_FUNCTIONS, label_free_reward


@label_free_reward
def oracle(prompt: str, response: str, verifier: str = "sorted_digits", flip: float = 0.0, **columns) -> float:
    """`verifier`'s 0/1 value, flipped for the (prompt, response) pairs whose hash falls below `flip`:
    the same answer is always judged the same way, as a judge's blind spot would be."""
    value = float(REWARD_FUNCTIONS.get(verifier)(prompt, response, **columns) >= 0.5)
    share = int(hashlib.sha256(f"{prompt}\x00{response.strip()}".encode()).hexdigest()[:8], 16) / 16 ** 8
    return 1.0 - value if share < flip else value
