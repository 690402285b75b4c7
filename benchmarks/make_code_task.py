"""Write a small code dataset: one-line Python functions with unit tests, for the `code_tests`
verifier and a tiny character-level model to learn end to end.

Each row is a completion task: the prompt is the start of a function ("def add_3(x): return "),
`answer` is the reference body ("x + 3", what the SFT warm-up trains on), the full solution is
prompt + answer, and `tests` holds three asserts with expected values computed from the reference.
`entry` names the function. Families are built from templates with numbers in their names
(add_3, mul_4, head_2, ...), so a small model can learn the mapping from name to body. The output
is deterministic: the same file every run.

    python benchmarks/make_code_task.py [OUT.jsonl] [--check]

OUT defaults to pipelines/examples/code_tasks.jsonl. `--check` also scores every reference
solution with `code_tests` in its sandbox (a few seconds); the reference is always checked in
this process first. Score responses with, e.g.:

    rewards:
      - {name: tests, fn: code_tests, timeout_s: 10, args: {extract: completion}}
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "pipelines" / "examples" / "code_tasks.jsonl"

INTS = [(0,), (5,), (-3,)]
INTS_B = [(2,), (7,), (12,)]
PAIRS = [(1, 2), (7, -3), (0, 9)]
WORDS = [("hello",), ("ab",), ("python",)]
LONG_WORDS = [("abcdefghij",), ("codeword12",), ("zyxwvutsrq",)]
LISTS = [([3, 1, 2],), ([5],), ([-1, 4, 4, 0],)]


def families() -> list[tuple[str, str, str, list[tuple]]]:
    """(name, parameters, body, test inputs) for every task, in a fixed order."""
    out = []
    for k in range(1, 10):
        out.append((f"add_{k}", "x", f"x + {k}", INTS))
        out.append((f"sub_{k}", "x", f"x - {k}", INTS))
    for k in range(2, 10):
        out.append((f"mul_{k}", "x", f"x * {k}", INTS))
        out.append((f"mod_{k}", "x", f"x % {k}", INTS_B))
        out.append((f"div_{k}", "x", f"x // {k}", INTS_B))
        out.append((f"repeat_{k}", "s", f"s * {k}", WORDS))
    for k in range(2, 5):
        out.append((f"pow_{k}", "x", f"x ** {k}", INTS))
    for k in range(0, 10):
        out.append((f"max_{k}", "x", f"max(x, {k})", INTS))
        out.append((f"min_{k}", "x", f"min(x, {k})", INTS))
        out.append((f"gt_{k}", "x", f"x > {k}", INTS_B))
        out.append((f"eq_{k}", "x", f"x == {k}", [(k,), (k + 1,), (-k - 1,)]))
    for k in range(1, 10):
        out.append((f"head_{k}", "s", f"s[:{k}]", LONG_WORDS))
        out.append((f"tail_{k}", "s", f"s[-{k}:]", LONG_WORDS))
        out.append((f"char_{k}", "s", f"s[{k}]", LONG_WORDS))
    for k in range(1, 6):
        for m in range(2, 5):
            out.append((f"add_{k}_mul_{m}", "x", f"(x + {k}) * {m}", INTS))
    out += [
        ("add", "a, b", "a + b", PAIRS), ("sub", "a, b", "a - b", PAIRS), ("mul", "a, b", "a * b", PAIRS),
        ("max2", "a, b", "max(a, b)", PAIRS), ("min2", "a, b", "min(a, b)", PAIRS),
        ("avg", "a, b", "(a + b) / 2", PAIRS), ("same", "a, b", "a == b", [(1, 1), (2, 3), (-4, -4)]),
        ("neg", "x", "-x", INTS), ("square", "x", "x * x", INTS), ("double", "x", "x + x", INTS),
        ("abs_", "x", "abs(x)", INTS), ("is_even", "x", "x % 2 == 0", INTS_B),
        ("is_odd", "x", "x % 2 == 1", INTS_B), ("first", "s", "s[0]", WORDS), ("last", "s", "s[-1]", WORDS),
        ("rev", "s", "s[::-1]", WORDS), ("upper", "s", "s.upper()", WORDS), ("twice", "s", "s + s", WORDS),
        ("length", "s", "len(s)", WORDS), ("total", "xs", "sum(xs)", LISTS),
        ("count", "xs", "len(xs)", LISTS),
        ("biggest", "xs", "max(xs)", LISTS), ("smallest", "xs", "min(xs)", LISTS),
        ("ordered", "xs", "sorted(xs)", LISTS), ("head", "xs", "xs[0]", LISTS),
        ("tail", "xs", "xs[-1]", LISTS), ("backwards", "xs", "xs[::-1]", LISTS),
    ]
    return out


def rows() -> list[dict]:
    out = []
    for i, (name, params, body, inputs) in enumerate(families()):
        prompt = f"def {name}({params}): return "
        namespace: dict = {}
        exec(prompt + body, namespace)  # our own reference, to compute the expected values
        fn = namespace[name]
        tests = [f"assert {name}({', '.join(map(repr, args))}) == {fn(*args)!r}" for args in inputs]
        for test in tests:  # the reference passes its own tests
            exec(test, dict(namespace))
        out.append({"id": f"code-{i}", "prompt": prompt, "answer": body, "tests": tests, "entry": name})
    return out


def check_in_sandbox(data: list[dict]) -> int:
    """Score every reference with code_tests (completion mode); the number that do not get 1."""
    sys.path.insert(0, str(ROOT))
    from actors.rewards.code import code_tests

    bad = 0
    for row in data:
        out = code_tests(row["prompt"], row["answer"], tests=row["tests"], entry=row["entry"],
                         extract="completion")
        if out != 1.0:
            bad += 1
            print(f"{row['id']}: {out.reason}", file=sys.stderr)
    return bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", default=str(DEFAULT_OUT), help="JSONL file to write")
    parser.add_argument("--check", action="store_true", help="also score every reference with code_tests")
    args = parser.parse_args(argv)
    data = rows()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(row) + "\n" for row in data), encoding="utf-8")
    print(f"wrote {len(data)} tasks to {out}")
    if args.check:
        bad = check_in_sandbox(data)
        print(f"sandbox check: {len(data) - bad}/{len(data)} references pass all their tests")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
