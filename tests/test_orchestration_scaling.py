"""benchmarks/orchestration_scaling.py's arithmetic: steady-state throughput over wall time between
metrics rows (bookkeeping between steps counts), efficiency against 1 replica of the same seed and
transport, and a clear error when a run logged too few steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bench():
    from benchmarks import orchestration_scaling
    return orchestration_scaling


def write_rows(path: Path, times: list[float], samples: int = 32) -> Path:
    rows = [{"step": i + 1, "time_s": t, "time/step_s": 0.5, "time/publish_s": 0.01 * (i + 1),
             "time/wait_rollouts_s": 0.3, "time/verify_s": 0.0, "time/learn_s": 0.2, "time/learner_s": 0.2,
             "samples/count": samples, "samples/lost": 0} for i, t in enumerate(times)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_throughput_is_over_wall_time_after_the_warm_up(bench, tmp_path) -> None:
    # step 1 is slow (warm-up); steps 3-5 take 1 s of wall time each, though each step took 0.5 s
    out = bench.steady_state(write_rows(tmp_path / "m.jsonl", [10.0, 11.0, 12.0, 13.0, 14.0]), skip=1)
    assert out["steps_measured"] == 3
    assert out["samples_per_s"] == pytest.approx(32.0)  # 3 x 32 samples over 14 - 11 s
    assert out["step_s"] == 0.5 and out["publish_s"] == pytest.approx(0.04) and out["publish_s_max"] == pytest.approx(0.05)


def test_too_few_steps_is_named(bench, tmp_path) -> None:
    path = write_rows(tmp_path / "m.jsonl", [1.0, 2.0])
    with pytest.raises(ValueError, match=r"m\.jsonl: 2 step rows; a steady state after --skip 1 warm-up steps "
                                         r"needs at least 3 \(raise --steps\)"):
        bench.steady_state(path, skip=1)


def test_efficiency_is_against_one_replica_of_the_same_seed_and_transport(bench) -> None:
    results = [{"replicas": 1, "seed": 0, "transport": "object_store", "samples_per_s": 10.0},
               {"replicas": 1, "seed": 1, "transport": "object_store", "samples_per_s": 20.0},
               {"replicas": 4, "seed": 0, "transport": "object_store", "samples_per_s": 36.0},
               {"replicas": 4, "seed": 1, "transport": "object_store", "samples_per_s": 80.0},
               {"replicas": 4, "seed": 0, "transport": "collective", "samples_per_s": 36.0}]
    bench.add_efficiency(results)
    assert [r["efficiency"] for r in results] == [1.0, 1.0, 0.9, 1.0, None]  # no 1-replica collective run
