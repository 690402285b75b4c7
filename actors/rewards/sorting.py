"""The sorting task's verifier: a response is right when it is the prompt's digits, every one of
them, in ascending order ("same digits, in order"). It reads the problem from the prompt itself, so
it needs no reference answer (the `sorting` task's `answer` column holds one, for SFT).

A task with a verification gap (issue 32): a small model learns to check a sorted answer (order and
the multiset of digits) well before it learns to produce one."""

from __future__ import annotations

from actors.rewards import REWARD_FUNCTIONS
from actors.rewards.text import check_text

SEPARATOR = ">"  # the sorting task's prompt is "<digits>>"


def problem_digits(prompt: str, separator: str = SEPARATOR) -> str:
    """The digits to sort: the prompt's last run of text before its last `separator`, which must be
    digits only (ValueError otherwise: a bad row, not a wrong response)."""
    prompt = check_text(prompt, "prompt")
    head, sep, _ = prompt.rpartition(separator)
    if not sep:
        raise ValueError(f"sorting prompt {prompt[:60]!r} has no {separator!r} after its digits")
    digits = head.split()[-1] if head.split() else ""
    if not digits.isdigit() or not digits.isascii():
        raise ValueError(f"sorting prompt {prompt[:60]!r}: {digits[:40]!r} before {separator!r} is not a digit string")
    return digits


@REWARD_FUNCTIONS.register("sorted_digits")
def sorted_digits(prompt: str, response: str, separator: str = SEPARATOR, **columns) -> float:
    """1 if the response (surrounding whitespace stripped) is the prompt's digits sorted ascending:
    the same digits, each as often, in order. Linear in the response; the reference answer is not
    read. YAML: `{name: sorted, fn: sorted_digits}`"""
    digits = problem_digits(prompt, separator)
    text = check_text(response).strip()
    return float(len(text) == len(digits) and text == "".join(sorted(digits)))
