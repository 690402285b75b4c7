"""Text rewards: answer match, multiple choice, regex, format templates, DAPO's overlong penalty.

Every reward here is `fn(prompt, response, **columns) -> float`; `columns` holds the dataset row's
other columns and the reward's `args` from the recipe YAML, both as keyword arguments.

Bad input, the same way in every module of this package:

- a response (or reference) that is not valid UTF-8 text -- undecodable `bytes`, or a `str` holding
  a lone surrogate such as "\\udcff" -- raises `ValueError` naming the problem;
- a missing or null reference column raises `ValueError` listing the row's columns;
- an empty response gets the score an empty answer deserves (0 for a match, no penalty for length);
- an enormous response never hangs: each function says in its docstring what it does with one
  (scores it in full when that is linear-time C string work, looks only at a bounded window, or
  raises `ValueError` above `max_chars`).

The caller (the Verifier's sandboxed worker) turns an exception into a null reward plus its message.
"""

from __future__ import annotations

import functools
import re
import string

from actors.rewards import REWARD_FUNCTIONS

MISSING = object()  # default for a reference column the row may lack
MAX_CHARS = 1_000_000  # default cap for functions that refuse enormous responses (about 250k tokens)


# ---- helpers shared by the reward modules --------------------------------------------------------
def check_text(value, name: str = "response") -> str:
    """`value` as a `str` of valid UTF-8 text; undecodable bytes or lone surrogates raise ValueError."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{name} is not valid UTF-8: byte {raw[e.start]:#04x} at offset "
                             f"{e.start}") from None
    if not isinstance(value, str):
        raise TypeError(f"{name} must be text, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{name} is not valid UTF-8 text: lone surrogate {value[e.start]!r} at index "
                         f"{e.start} (undecodable bytes decoded with surrogateescape?)") from None
    return value


def require(value, name: str, columns: dict):
    """A reference column's value; a missing or null column raises ValueError naming it."""
    if value is MISSING:
        raise ValueError(f"row has no {name!r} column; columns: {sorted(columns)}")
    if value is None:
        raise ValueError(f"row's {name!r} is null")
    return value


def reference_text(value, columns: dict, name: str = "answer") -> str:
    """A required, non-empty text reference column (numbers are turned into their str())."""
    value = require(value, name, columns)
    text = check_text(value if isinstance(value, (str, bytes, bytearray)) else str(value), name)
    if not text.strip():
        raise ValueError(f"row's {name!r} is empty")
    return text


def refuse_longer(text: str, max_chars, name: str = "response") -> str:
    """Raise ValueError when `text` is over `max_chars` characters (None: no limit)."""
    if max_chars is not None and len(text) > int(max_chars):
        raise ValueError(f"{name} is {len(text):,} characters, over max_chars={int(max_chars):,}; not "
                         f"scored (raise args.max_chars to score longer texts)")
    return text


def tagged(text: str, tag: str | None) -> str | None:
    """Content of the last `<tag>...</tag>` in `text` (linear time); `text` itself when `tag` is
    None; None when there is no such block."""
    if not tag:
        return text
    end = text.rfind(f"</{tag}>")
    start = text.rfind(f"<{tag}>", 0, end) if end >= 0 else -1
    return None if start < 0 else text[start + len(tag) + 2:end]


def flag(value, name: str) -> bool:
    """A boolean argument; accepts YAML booleans and the strings true/false."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise TypeError(f"args.{name} must be true or false, got {value!r}")


# ---- answer match --------------------------------------------------------------------------------
_INT = re.compile(r"-?\d+")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_text(text: str) -> str:
    """Lower-case, drop punctuation and articles, squeeze whitespace (SQuAD-style)."""
    text = str(text).lower().translate(_PUNCT)
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


@REWARD_FUNCTIONS.register("exact_match")
def exact_match(prompt: str, response: str, answer=MISSING, extract_tag: str | None = None,
                **columns) -> float:
    """1 if the response equals the `answer` column after stripping surrounding whitespace.

    `args.extract_tag` (e.g. `answer`) compares only the content of the last `<tag>...</tag>`
    block (0 when there is none). The comparison is linear-time C string work, so an enormous
    response is scored in full (10 MB: milliseconds).

    YAML: `{name: acc, fn: exact_match}`
    """
    answer = reference_text(answer, columns)
    text = tagged(check_text(response), extract_tag)
    return float(text is not None and text.strip() == answer.strip())


@REWARD_FUNCTIONS.register("normalized_match")
def normalized_match(prompt: str, response: str, answer=MISSING, extract_tag: str | None = None,
                     **columns) -> float:
    """1 if response and `answer` agree after SQuAD normalisation (case, punctuation, articles,
    whitespace). `args.extract_tag` as in exact_match. Normalisation is linear in the response (about
    0.2 s for 10 MB); an enormous response is scored in full.

    YAML: `{name: acc, fn: normalized_match}`
    """
    answer = reference_text(answer, columns)
    text = tagged(check_text(response), extract_tag)
    return float(text is not None and normalize_text(text) == normalize_text(answer))


def _canonical_int(text: str) -> str | None:
    m = re.fullmatch(r"\s*([-+]?)(\d+)\s*", text)
    if m is None:
        return None
    digits = m.group(2).lstrip("0") or "0"
    return digits if digits == "0" or m.group(1) != "-" else "-" + digits


@REWARD_FUNCTIONS.register("integer_match")
def integer_match(prompt: str, response: str, answer=MISSING, **columns) -> float:
    """1 if the first integer in the response equals the integer `answer` (arithmetic tasks).

    Integers are compared as canonical digit strings, so a response of a million digits is fine
    (Python's int() refuses more than 4300 digits); the search is a linear regex scan.

    YAML: `{name: acc, fn: integer_match}`
    """
    answer = reference_text(answer, columns)
    gold = _canonical_int(answer)
    if gold is None:
        raise ValueError(f"row's 'answer' {answer[:100]!r} is not an integer")
    found = _INT.search(check_text(response))
    return float(found is not None and _canonical_int(found.group()) == gold)


# ---- multiple choice -------------------------------------------------------------------------------
# Where a model states its choice: "answer is", "Answer:", "correct option is", "\boxed{...}".
_CUE = re.compile(r"\banswer\b(?:\s+(?:is|would\s+be|should\s+be|must\s+be|will\s+be))?"
                  r"|\b(?:correct|right|best|final)\s+(?:option|choice)(?:\s+is)?"
                  r"|\\boxed", re.IGNORECASE)
# Decoration between a cue and the letter: markdown, LaTeX wrappers, quotes, ':' '=' '-', "option".
_DECOR = re.compile(r"(?:[\s*_$`'\"{}:=\-]|\\(?:text|textbf|mathrm|mathbf|boxed)\s*\{"
                    r"|\b(?:option|choice)\b)*", re.IGNORECASE)
_LETTER = re.compile(r"(\()?([A-Za-z])(\))?")
_LOWER_END = re.compile(r"[ \t]*(?:$|\n|[.,;:!?)\]}*$])")  # a bare lower-case letter must end here
_CONJ = re.compile(r"\s*(?:,|/|&|\bor\b|\band\b)\s*", re.IGNORECASE)
_WHOLE = re.compile(r"[\s*_$`'\"{}():.\-]*([A-Za-z])[\s*_$`'\"{}():.\-]*")
_PAREN = re.compile(r"\(([A-Za-z])\)")
_BARE = re.compile(r"(?<![A-Za-z0-9_'\\])([A-Z])(?![A-Za-z0-9_'])")
_AMBIGUOUS = "ambiguous"


def parse_choices(choices) -> str:
    """Choice letters as an upper-case string, from "ABCD", "A-E", ["A", "B", ...], or a list of
    option texts (a dataset's `choices` column, e.g. MMLU's): one letter per option from A."""
    if isinstance(choices, str):
        m = re.fullmatch(r"\s*([A-Za-z])\s*-\s*([A-Za-z])\s*", choices)
        letters = ([chr(c) for c in range(ord(m.group(1).upper()), ord(m.group(2).upper()) + 1)]
                   if m else [c for c in choices if not c.isspace() and c != ","])
    else:
        letters = [str(c).strip() for c in choices]
        if letters and 1 < len(letters) <= 26 and not all(len(c) == 1 and c.isalpha() for c in letters):
            letters = [chr(ord("A") + k) for k in range(len(letters))]  # option texts
    if not letters or any(len(c) != 1 or not c.isalpha() for c in letters):
        raise ValueError(f"args.choices must be letters like 'ABCD', 'A-E' or [A, B, C], got {choices!r}")
    return "".join(dict.fromkeys(c.upper() for c in letters))


def _letter_at(text: str, pos: int, choices: str) -> tuple[str | None, int]:
    """The choice letter right after `pos` (decoration skipped) and the index after it."""
    m = _LETTER.match(text, _DECOR.match(text, pos).end())
    if m is None:
        return None, pos
    after = text[m.end():m.end() + 1]
    if after.isalnum() or after == "_":  # part of a word ("Because", "a2")
        return None, pos
    letter = m.group(2)
    if letter.islower() and not (m.group(1) or m.group(3)) and not _LOWER_END.match(text, m.end()):
        return None, pos  # "the answer is a bit tricky": an article, not choice (a)
    return (letter.upper(), m.end()) if letter.upper() in choices else (None, pos)


def extract_choice(text: str, choices: str) -> str | None:
    """The chosen letter, `_AMBIGUOUS` when the response names two, or None when it names none.

    In order: the last answer cue ("The answer is (B)", "Answer: b", "\\boxed{C}"), where "B or C"
    right after the cue is ambiguous; a response that is only a letter ("b", "(B)."); letters in
    parentheses; upper-case letters standing alone (not "A" followed by a lower-case word). In
    the last two, two different letters are ambiguous.
    """
    for cue in reversed(list(_CUE.finditer(text))):
        letter, end = _letter_at(text, cue.end(), choices)
        if letter is None:
            continue
        conj = _CONJ.match(text, end + (text[end:end + 1] == "}"))
        if conj is not None:
            other, _ = _letter_at(text, conj.end(), choices)
            if other is not None and other != letter:
                return _AMBIGUOUS
        return letter
    whole = _WHOLE.fullmatch(text)
    if whole is not None and whole.group(1).upper() in choices:
        return whole.group(1).upper()
    for found in (
        {m.group(1).upper() for m in _PAREN.finditer(text) if m.group(1).upper() in choices},
        {m.group(1) for m in _BARE.finditer(text) if m.group(1) in choices
         and not (m.group(1) == "A" and re.match(r"\s+[a-z]", text[m.end():m.end() + 2]))},
    ):
        if len(found) == 1:
            return found.pop()
        if found:
            return _AMBIGUOUS
    return None


@REWARD_FUNCTIONS.register("multiple_choice")
def multiple_choice(prompt: str, response: str, answer=MISSING, choices="ABCDE",
                    extract_tag: str | None = None, tail_chars: int = 4000, **columns) -> float:
    """1 if the letter the response chooses equals the `answer` column's letter, else 0.

    The letter is read from answer statements ("(B)", "Answer: b", "The answer is B.",
    "\\boxed{C}"; the last one counts), from a response that is only a letter, or from letters
    in parentheses / standing alone; a response naming two different letters ("B or C", "(A) ...
    (C)" without an answer statement) scores 0. Letters outside `args.choices` ("ABCD", "A-E",
    a list; default A-E) are ignored; a list of option texts (say a dataset's `choices` column)
    stands for A, B, ... one per option. `args.extract_tag` reads only the last `<tag>` block.
    Only the last `args.tail_chars` characters (default 4000) are examined, so an enormous
    response is fast. The `answer` column may be "B", "b", "(B)", "B. <option text>", or an int
    option index counted from 0 (MMLU's convention: 1 is B).

    YAML: `{name: mc, fn: multiple_choice, args: {choices: A-D}}`
    """
    letters = parse_choices(choices)
    answer = require(answer, "answer", columns)
    if isinstance(answer, int) and not isinstance(answer, bool):  # an option index, 0-based
        if not 0 <= answer < len(letters):
            raise ValueError(f"row's 'answer' index {answer} is outside the {len(letters)} choices")
        answer = letters[answer]
    gold_text = reference_text(answer, columns)
    gold = extract_choice(gold_text.strip(), letters) if len(gold_text) < 1000 else None
    if gold in (None, _AMBIGUOUS):
        m = re.match(r"\s*\(?([A-Za-z])(?:[).:]|\s|$)", gold_text)
        gold = m.group(1).upper() if m and m.group(1).upper() in letters else None
    if gold is None:
        raise ValueError(f"row's 'answer' {gold_text[:100]!r} is not one of the choices {', '.join(letters)}")
    text = tagged(check_text(response), extract_tag)
    if text is None:
        return 0.0
    return float(extract_choice(text[-int(tail_chars):], letters) == gold)


# ---- regex and format ------------------------------------------------------------------------------
@functools.lru_cache(maxsize=64)
def _compile(pattern: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except re.error as e:
        raise ValueError(f"args.pattern {pattern!r} is not a valid regular expression: {e}") from None


@REWARD_FUNCTIONS.register("regex_match")
def regex_match(prompt: str, response: str, pattern: str | None = None, full_match: bool = False,
                max_chars: int | None = 100_000, **_) -> float:
    """1 if `args.pattern` (Python `re` syntax) is found in the response, or with
    `full_match: true` matches the whole response (as is: allow trailing whitespace with `\\s*`).
    Put flags inline: `(?is)` for ignore-case and dot-matches-newline. A user pattern may
    backtrack badly on long text, so a response over `args.max_chars` characters (default
    100,000) raises ValueError instead of running it.

    YAML: `{name: has_answer, fn: regex_match, args: {pattern: "Answer: \\\\d+", full_match: false}}`
    """
    if pattern is None:
        raise ValueError("regex_match needs args.pattern")
    compiled = _compile(str(pattern))
    text = refuse_longer(check_text(response), max_chars)
    found = compiled.fullmatch(text) if flag(full_match, "full_match") else compiled.search(text)
    return float(found is not None)


def _tag_names(tags) -> list[str]:
    names = [t.strip() for t in tags.split(",")] if isinstance(tags, str) else [str(t) for t in tags]
    if not names or any(not re.fullmatch(r"[A-Za-z_][\w\-.]*", t) for t in names):
        raise ValueError(f"args.format_tags must be tag names like [think, answer], got {tags!r}")
    return names


@REWARD_FUNCTIONS.register("format_reward")
def format_reward(prompt: str, response: str, format_tags=("think", "answer"), partial: bool = False,
                  nonempty: bool = False, **_) -> float:
    """1 if the response is exactly `<t1>...</t1><t2>...</t2>...` for `args.format_tags` (default
    `[think, answer]`): each tag opened and closed exactly once, in template order, nothing but
    whitespace before, between or after the blocks; else 0. `nonempty: true` also requires each
    block to hold non-whitespace text.

    `partial: true` gives partial credit: the fraction of these checks that pass -- each marker
    appears exactly once (2 per tag), the markers appear in order, nothing outside the blocks,
    and (with `nonempty`) each block non-empty; 1.0 still means exactly the template. Counting and
    finding markers is linear-time C string work, so an enormous response is scored in full.

    YAML: `{name: fmt, fn: format_reward, args: {format_tags: [think, answer], partial: false}}`
    """
    names = _tag_names(format_tags)
    text = check_text(response)
    markers = [m for t in names for m in (f"<{t}>", f"</{t}>")]
    checks = [text.count(m) == 1 for m in markers]
    starts = [text.find(m) for m in markers]
    in_order = all(s >= 0 for s in starts) and all(
        starts[k] + len(markers[k]) <= starts[k + 1] for k in range(len(markers) - 1))
    checks.append(in_order)
    if in_order:
        bounds = [0, *[x for k in range(0, len(markers), 2)
                       for x in (starts[k], starts[k + 1] + len(markers[k + 1]))], len(text)]
        outside = [text[bounds[k]:bounds[k + 1]] for k in range(0, len(bounds), 2)]
        inside = [text[starts[k] + len(markers[k]):starts[k + 1]] for k in range(0, len(markers), 2)]
    checks.append(in_order and all(not s.strip() for s in outside))
    if flag(nonempty, "nonempty"):
        checks.extend(in_order and bool(s.strip()) for s in (inside if in_order else names))
    if all(checks):
        return 1.0
    return sum(checks) / len(checks) if flag(partial, "partial") else 0.0


# ---- length ----------------------------------------------------------------------------------------
@REWARD_FUNCTIONS.register("overlong_penalty")
@REWARD_FUNCTIONS.register("length_penalty")
def overlong_penalty(prompt: str, response: str, max_length=None, cache_length=None,
                     response_length=None, response_ids=None, **_) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025), with L = the response length:

        0                                  if L <= max_length - cache_length
        (max_length - cache_length - L) / cache_length   up to L = max_length (linear to -1)
        -1                                 if L > max_length

    L counts tokens when the row has a `response_length` (or `response_ids`) column, else
    characters of the response: set `max_length` in the same unit. `cache_length` (L_cache)
    defaults to max_length / 5 (DAPO: L_max = 20480, L_cache = 4096 tokens). Registered as both
    `overlong_penalty` and `length_penalty`. An enormous response is scored (-1) at once.

    YAML: `{name: overlong, fn: overlong_penalty, args: {max_length: 20480, cache_length: 4096}}`
    """
    text = check_text(response)
    if max_length is None:
        raise ValueError("overlong_penalty needs args.max_length (L_max)")
    l_max = float(max_length)
    l_cache = l_max / 5 if cache_length is None else float(cache_length)
    if not 0 < l_cache <= l_max:
        raise ValueError(f"need 0 < cache_length <= max_length, got cache_length={cache_length!r}, "
                         f"max_length={max_length!r}")
    if response_length is not None:
        length = float(response_length)
    elif response_ids is not None:
        length = float(len(response_ids))
    else:
        length = float(len(text))
    if length <= l_max - l_cache:
        return 0.0
    if length <= l_max:
        return (l_max - l_cache - length) / l_cache
    return -1.0
