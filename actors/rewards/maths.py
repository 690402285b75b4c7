"""Math answer rewards: symbolic equivalence with math-verify, reading the last \\boxed{} answer.

math-verify (and sympy under it) is imported inside the function, so importing this module stays
light. Its own signal-based timeouts are switched off (they fail outside a main thread); the
Verifier's sandboxed worker enforces the time limit instead, so a pathological expression (a
tower of powers) ends as a timed-out null reward, not a hang of the run.
"""

from __future__ import annotations

import logging
import re

from actors.rewards import REWARD_FUNCTIONS
from actors.rewards.text import MISSING, check_text, flag, normalize_text, reference_text, tagged

MAX_BOXED_CHARS = 10_000  # a \boxed{...} argument longer than this is not an answer
_BOXED = re.compile(r"\\(?:boxed|fbox)\b")
_WRAPPER = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_WORDS = re.compile(r"[A-Za-z]+(?: [A-Za-z]+)*")


def last_boxed(text: str) -> str | None:
    """The argument of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces matched and
    `\\{`/`\\}` skipped; `\\boxed 5` gives "5". None when the last one is missing, unclosed within
    MAX_BOXED_CHARS or empty: an earlier box does not stand in for a broken last one."""
    starts = [text.rfind("\\boxed"), text.rfind("\\fbox")]
    start = max(starts)
    if start < 0 or _BOXED.match(text, start) is None:
        return None
    i = start + (6 if start == starts[0] else 5)
    while i < len(text) and text[i] in " \t":
        i += 1
    if i < len(text) and text[i] != "{":
        m = re.match(r"[^\s$\\{}.,;]+(?:\.\d+)?", text[i:i + 100])
        return m.group() if m else None
    depth, j, stop = 0, i, min(len(text), i + MAX_BOXED_CHARS)
    while j < stop:
        ch = text[j]
        if ch == "\\":
            j += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                content = text[i + 1:j].strip()
                return content or None
        j += 1
    return None


def _as_words(text: str) -> str | None:
    """A textual answer ("Paris", "\\text{even}") as normalised words; None for anything else.
    Sympy reads "Paris" as the product P*a*r*i*s, equal to its anagrams, so words are compared
    as text instead."""
    for _ in range(3):
        text = _WRAPPER.sub(r"\1", text)
    text = text.replace("$", "").strip().rstrip(".")
    if not _WORDS.fullmatch(text) or len(text.replace(" ", "")) < 2:
        return None
    return normalize_text(text)


@REWARD_FUNCTIONS.register("math_verify")
def math_equivalence(prompt: str, response: str, answer=MISSING, boxed_only: bool = False,
                     extract_tag: str | None = None, tail_chars: int = 5000, float_rounding: int = 6,
                     **columns) -> float:
    """1 if the response's final answer is mathematically equivalent to the `answer` column.

    The final answer is the argument of the response's last `\\boxed{...}` when there is one
    (math-verify on its own merges several boxes into a set); otherwise math-verify extracts it
    from the last `args.tail_chars` characters (default 5000). With `boxed_only: true` a response
    without a closed last box scores 0. `args.extract_tag` (e.g. `answer`) looks only inside the last
    `<tag>...</tag>` block. Equivalence is math-verify's: `\\frac{1}{2}` = `0.5` = `1/2`, `$3$` =
    `3`, `x=5` = `5`, sets `\\{1,2\\}` = `\\{2,1\\}`, intervals `(1,2]` (endpoints and brackets
    must agree), `\\sqrt2/2` = `1/\\sqrt2`; a last box left unclosed (a response cut off
    mid-answer) scores 0, an earlier box does not stand in for it; floats are compared after rounding to
    `args.float_rounding` decimals (default 6). A purely textual answer ("Paris", "\\text{even}")
    is compared as normalised words, since sympy would equate anagrams. An `answer` holding a
    full solution is reduced to its last `\\boxed{}` too; one math-verify gets nothing from raises
    ValueError (a bad row, not a wrong response). An enormous response costs one `rfind` plus a
    parse of at most a few thousand characters.

    YAML: `{name: acc, fn: math_verify, args: {boxed_only: true}}`
    """
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns on every disabled timeout
    logging.getLogger("latex2sympy2_extended").setLevel(logging.ERROR)
    gold_text = reference_text(answer, columns)
    gold_text = last_boxed(gold_text) or gold_text
    gold_text = gold_text.strip()
    text = tagged(check_text(response), extract_tag)
    if text is None:
        return 0.0
    boxed = last_boxed(text)
    if boxed is None and (flag(boxed_only, "boxed_only") or _BOXED.search(text) is not None):
        return 0.0  # no box, or a broken last box (cut off mid-answer): no final answer

    gold_words = _as_words(gold_text)
    if gold_words is not None:
        if boxed is not None:
            return float(_as_words(boxed) == gold_words)
        pred = parse(text[-int(tail_chars):], parsing_timeout=None)
        return float(bool(pred) and _as_words(str(pred[-1])) == gold_words)

    gold = parse(gold_text if "$" in gold_text else f"${gold_text}$", parsing_timeout=None)
    if not gold:
        raise ValueError(f"math-verify cannot parse the row's 'answer' {gold_text[:200]!r}")
    if boxed is not None:
        pred = parse(f"\\boxed{{{boxed}}}", parsing_timeout=None)
    else:
        pred = parse(text[-int(tail_chars):], parsing_timeout=None)
    return float(bool(pred) and verify(gold, pred, float_rounding=int(float_rounding),
                                       timeout_seconds=None))


# The zygote imports math_verify (sympy) once, so no worker pays ~0.5 s for it on its first sample.
math_equivalence.reward_preload = ("math_verify",)
