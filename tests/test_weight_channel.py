"""`weights.transport=collective` end to end: a short default run whose generators take every
version over the learner's gloo group, and a generator killed mid-run that catches up through the
object store (then rejoins a new group) while the run loses nothing."""

from __future__ import annotations

import os
import signal
import uuid

import pandas as pd
import pytest

from coevo_cli import finish, read_metrics, small, start, wait_for, steps_logged
from test_faults import MARK, actor_pids, check_no_loss


@pytest.mark.long
@pytest.mark.slow
def test_collective_run_advances_generators_and_survives_a_killed_one(ray_env, warm_cache, tmp_path) -> None:
    mark = uuid.uuid4().hex
    run_dir = tmp_path / "run"
    steps = 8
    proc = start(small(warm_cache, f"train.max_steps={steps}", f"train.eval_every={steps}", "train.dump_rollouts=true",
                       "weights.transport=collective", "weights.bucket_mb=0.25", "roles.generator.replicas=2",
                       "roles.generator.num_cpus=0.5", "--output-dir", str(run_dir)), {**ray_env, MARK: mark}, tmp_path)
    wait_for(lambda: steps_logged(run_dir) >= 3, 240, "step 3", proc)
    pids = actor_pids(mark, "Generator")
    assert len(pids) == 2, pids
    os.kill(pids[0], signal.SIGKILL)
    out = finish(proc, 300)
    assert proc.returncode == 0, out[-6000:]
    check_no_loss(run_dir, steps)
    rows = read_metrics(run_dir)
    assert rows[-1]["role/generator/failures"] >= 1
    assert rows[0]["channel/policy/epochs"] == 1 and rows[-1]["channel/policy/epochs"] >= 2, \
        [r["channel/policy/epochs"] for r in rows]  # the restarted replica made a new group
    assert [r["channel/policy/lag"] for r in rows] == [0] * steps
    for step in range(1, steps + 1):  # strict on-policy: step N's samples come from version N-1
        versions = pd.read_parquet(run_dir / "rollouts" / f"step_{step}.parquet", columns=["policy_version"])
        assert set(versions["policy_version"]) == {step - 1}, (step, set(versions["policy_version"]))
