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


def test_the_oracle_fill_is_the_verifier_label_free_and_wrong_on_a_fixed_share(bench, monkeypatch):
    """grpo_oracle_fill: the verifier as a label-free source (it scores the unlabelled prompts),
    flipped on the same answers every time for --oracle-flip; its overrides make a valid config."""
    import sys
    from argparse import Namespace

    monkeypatch.syspath_prepend(str(Path(bench.__file__).parent))
    sys.modules.pop("oracle_fill", None)
    from oracle_fill import oracle

    from orchestrator.config import load_config

    assert oracle.label_free
    assert oracle("3120>", "0123") == 1.0 and oracle("3120>", "0132") == 0.0
    answers = [f"{i:04d}" for i in range(2000)]
    flipped = [oracle("3120>", a, flip=0.2) != oracle("3120>", a) for a in answers]
    assert 0.15 < sum(flipped) / len(answers) < 0.25
    assert flipped == [oracle("3120>", a, flip=0.2) != oracle("3120>", a) for a in answers]  # the same ones
    assert not any(oracle("3120>", a, flip=0.0) != oracle("3120>", a) for a in answers)
    config, overrides = bench.recipes("sorted_digits", Namespace(
        oracle_flip=0.1, judge_warmup=200, judge_task="own", judge_task_fraction=0.5, judge_separate=False,
        judge_online=0, judge_online_lr=3e-4, judge_init="policy", eval_prompts=64, laser_warmup=300, rm_warmup=60,
        prompts=32, extra=[], steps=40))["grpo_oracle_fill"]
    cfg = load_config(config, [*overrides, "verifier.fraction=0.1"])
    oracle_spec = next(r for r in cfg.rewards if r.name == "oracle")
    assert oracle_spec.label_free and oracle_spec.args == {"verifier": "sorted_digits", "flip": 0.1}


def test_a_judge_from_scratch_drops_the_task_share_and_makes_a_valid_config(bench) -> None:
    """--judge-init scratch: self_judged_grpo's judge apart that learns starts from random weights;
    its warm-up has no task share (judge.warmup_task* left out), and the other recipes keep theirs."""
    from argparse import Namespace

    from orchestrator.config import load_config

    args = Namespace(oracle_flip=0.0, judge_warmup=800, judge_task="distill", judge_task_fraction=0.75,
                     judge_separate=True, judge_online=128, judge_online_lr=3e-4, judge_init="scratch", eval_prompts=64,
                     laser_warmup=300, rm_warmup=60, prompts=32, extra=[], steps=40)
    table = bench.recipes("sorted_digits", args)
    config, overrides = table["self_judged_grpo"]
    assert "judge.init=scratch" in overrides and not any(o.startswith("judge.warmup_task") for o in overrides)
    cfg = load_config(config, [*overrides, "verifier.fraction=0.1"])
    assert cfg.judge.init == "scratch" and cfg.judge.online_items == 128 and cfg.judge.warmup_steps == 800
    assert "judge.warmup_task=distill" in table["spc"][1]  # the others' warm-ups are as they were
