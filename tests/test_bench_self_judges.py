"""benchmarks/self_judges.py --held-out: the held-out file grown with fresh sorting problems that
are in neither split, the same ones every time, and the errors for what it cannot do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench_module import load


@pytest.fixture(scope="module")
def bench():
    return load("self_judges")


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def problems(digits: list[str]) -> list[dict]:
    return [{"prompt": f"{d}>", "answer": "".join(sorted(d))} for d in digits]


def test_held_out_grows_with_fresh_sorted_problems_in_neither_split(bench, tmp_path):
    train = write(tmp_path / "train.jsonl", problems([f"{i:03d}" for i in range(0, 600)]))
    held = [f"{i:03d}" for i in range(600, 620)]
    grown = []
    for name in ("a", "b"):
        eval_ = write(tmp_path / f"eval_{name}.jsonl", problems(held))
        assert bench.extend_held_out("sorting", train, eval_, 100) == 100
        grown.append([json.loads(line) for line in eval_.read_text().splitlines()])
    rows = grown[0]
    assert rows[:20] == problems(held) and len(rows) == 100
    fresh = [r["prompt"] for r in rows[20:]]
    assert len(set(fresh)) == 80 and not set(fresh) & {f"{i:03d}>" for i in range(620)}
    assert all(r["answer"] == "".join(sorted(r["prompt"][:-1])) and len(r["answer"]) == 3 for r in rows)
    assert grown[0] == grown[1]  # its own seed: the same fresh problems every time


def test_held_out_says_what_it_cannot_do(bench, tmp_path):
    train = write(tmp_path / "train.jsonl", problems(["123"]))
    eval_ = write(tmp_path / "eval.jsonl", problems(["321", "213"]))
    with pytest.raises(SystemExit, match="--held-out 1: the task holds 2 held-out prompts already"):
        bench.extend_held_out("sorting", train, eval_, 1)
    with pytest.raises(SystemExit, match="--held-out 5: only the sorting task has problems to spare; addition"):
        bench.extend_held_out("addition", train, eval_, 5)
    assert bench.extend_held_out("sorting", train, eval_, 2) == 2
