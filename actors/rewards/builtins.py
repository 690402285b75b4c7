"""Built-in verifiable rewards: answer match, integer match, math equivalence."""

from __future__ import annotations

import logging
import re
import string

from actors.rewards import REWARD_FUNCTIONS

_INT = re.compile(r"-?\d+")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_text(text: str) -> str:
    """Lower-case, drop punctuation and articles, squeeze whitespace (SQuAD-style)."""
    text = str(text).lower().translate(_PUNCT)
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


@REWARD_FUNCTIONS.register("exact_match")
def exact_match(prompt: str, response: str, answer, **_) -> float:
    return float(response.strip() == str(answer).strip())


@REWARD_FUNCTIONS.register("normalized_match")
def normalized_match(prompt: str, response: str, answer, **_) -> float:
    return float(normalize_text(response) == normalize_text(answer))


@REWARD_FUNCTIONS.register("integer_match")
def integer_match(prompt: str, response: str, answer, **_) -> float:
    """1 if the first integer in the response equals the integer answer (arithmetic tasks)."""
    found = _INT.search(response)
    return float(found is not None and int(found.group()) == int(str(answer).strip()))


@REWARD_FUNCTIONS.register("math_verify")
def math_equivalence(prompt: str, response: str, answer, **_) -> float:
    """Symbolic equivalence via math-verify. Its own signal-based timeouts are off (they fail
    outside a main thread); the verifier's subprocess enforces the time limit instead."""
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns on every disabled timeout
    gold = parse(str(answer) if "$" in str(answer) else f"${answer}$", parsing_timeout=None)
    pred = parse(response, parsing_timeout=None)
    return float(bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=None))
