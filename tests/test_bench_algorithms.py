"""benchmarks/algorithms.py: the table's numbers from a run's metrics rows, and the ranking."""

from __future__ import annotations

import pytest

from bench_module import load


@pytest.fixture(scope="module")
def bench():
    return load("algorithms")


def rows(accuracies: dict[int, float], steps: int = 20) -> list[dict]:
    """Steps of 2 s each (the first starts at t=10), a 0.5 s evaluation where `accuracies` has one."""
    out = []
    for step in range(1, steps + 1):
        r = {"step": step, "time_s": 10.0 + 2 * step, "time/step_s": 2.0, "train/neg_logprob": float(step),
             "samples/distinct_per_group": 8.0 - step * 0.25}
        if step in accuracies:
            r.update({"eval/accuracy": accuracies[step], "time/eval_s": 0.5})
        out.append(r)
    return out


def test_score_counts_steps_and_time_to_the_first_eval_at_target(bench) -> None:
    s = bench.score(rows({5: 0.6, 10: 0.81, 15: 0.78, 20: 0.9}))
    assert s["steps_to_target"] == 10
    assert s["wall_to_target_s"] == pytest.approx(2 * 10 + 0.5)  # 10 steps of 2 s + that evaluation
    assert s["best_accuracy"] == 0.9 and s["final_accuracy"] == 0.9
    assert s["first_eval"] == {"step": 5, "accuracy": 0.6}
    assert s["final_entropy"] == pytest.approx(sum(range(16, 21)) / 5)  # mean of the last 5 steps
    assert s["final_distinct_per_group"] == pytest.approx(8.0 - 0.25 * 18)
    assert s["train_wall_s"] == pytest.approx(40.5)


def test_score_of_a_run_that_never_reaches_the_target(bench) -> None:
    s = bench.score(rows({5: 0.6, 10: 0.7}))
    assert s["steps_to_target"] is None and s["wall_to_target_s"] is None and s["best_accuracy"] == 0.7


def test_table_ranks_by_steps_to_target_then_best_accuracy(bench) -> None:
    def run(method, seed, acc):
        return {"method": method, "seed": seed, **bench.score(rows(acc))}

    runs = [run("slow", 0, {15: 0.8}), run("fast", 0, {5: 0.85}), run("never_high", 0, {5: 0.75}),
            run("never_low", 0, {5: 0.7}), {"method": "broken", "seed": 0, "error": "coevo run exited 1"}]
    lines = bench.table(runs, ["never_low", "slow", "broken", "fast", "never_high"]).splitlines()[2:]
    order = [line.split("|")[2].strip() for line in lines]
    assert order == ["fast", "slow", "never_high", "never_low", "broken"]
    assert "0/0 (1 failed)" in lines[-1]
    assert "| 1/1 | 5 |" in lines[0]


def test_render_refuses_a_file_that_is_not_its_results(bench, tmp_path) -> None:
    bad = tmp_path / "other.json"
    bad.write_text('{"rows": []}')
    with pytest.raises(SystemExit, match=r"other\.json: not a results file of benchmarks/algorithms.py \(KeyError"):
        bench.main(["--render", str(bad)])


def test_render_prints_the_table_of_two_files_together(bench, tmp_path, capsys) -> None:
    import json

    for name, method in (("a.json", "grpo"), ("b.json", "dph")):
        (tmp_path / name).write_text(json.dumps({"runs": [{"method": method, "seed": 0,
                                                           **bench.score(rows({5: 0.8}))}]}))
    assert bench.main(["--render", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "| grpo |" in out and "| dph |" in out


def test_render_at_step_scores_each_run_up_to_that_step(bench, tmp_path, capsys) -> None:
    import json

    (tmp_path / "a.json").write_text(json.dumps({"runs": [{"method": "grpo", "seed": 0,
                                                           **bench.score(rows({5: 0.6, 10: 0.9}))}]}))
    bench.main(["--render", str(tmp_path / "a.json"), "--at-step", "5"])
    line = next(x for x in capsys.readouterr().out.splitlines() if "| grpo |" in x)
    assert "| 0/1 |" in line and "| 0.600 |" in line  # the 0.9 at step 10 is past step 5
