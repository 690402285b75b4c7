"""A learner that dies (kill -9, as an out-of-memory kill or a lost node would) no longer ends the
run: it restarts from the newest checkpoint, or from the first step when there is none yet, redoes
the steps after it, and finishes with every sample trained exactly once (train.learner_restarts)."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import uuid

import pytest

from coevo_cli import finish, read_metrics, small, start, steps_logged
from test_faults import MARK, actor_pids, check_no_loss


@pytest.mark.slow
def test_a_killed_learner_restarts_from_the_newest_checkpoint(ray_env, warm_cache, tmp_path) -> None:
    mark = uuid.uuid4().hex
    run_dir = tmp_path / "run"
    steps = 9
    proc = start(small(warm_cache, f"train.max_steps={steps}", f"train.eval_every={steps}", "train.checkpoint_every=4",
                       "train.dump_rollouts=true", "--output-dir", str(run_dir)), {**ray_env, MARK: mark}, tmp_path)
    killed, others = [], []  # the steps killed at; the other roles' processes before each kill and at the end
    killed_at = []  # when (time.time()) each kill was sent

    def survivors():
        return {cls: sorted(actor_pids(mark, cls)) for cls in ("Generator", "Verifier")}

    def killer():
        # first before any checkpoint (step 2), then after step_4's (step 6)
        for target, ready in ((2, lambda: True), (6, lambda: (run_dir / "checkpoints" / "step_4").is_dir())):
            while proc.poll() is None and not (steps_logged(run_dir) >= target and ready()):
                threading.Event().wait(0.05)
            pids = actor_pids(mark, "Learner")
            if proc.poll() is not None or not pids:
                return
            os.kill(pids[0], signal.SIGKILL)
            killed_at.append(time.time())
            killed.append(steps_logged(run_dir))
            others.append(survivors())  # after the kill (a scan takes a while): these do not die with it
        while proc.poll() is None and steps_logged(run_dir) < steps - 1:  # trained again after the restart
            threading.Event().wait(0.05)
        others.append(survivors())

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    started = time.monotonic()
    out = finish(proc, 500)
    wall = time.monotonic() - started
    thread.join(timeout=5)
    assert proc.returncode == 0, out[-6000:]
    assert len(killed) == 2, (killed, out[-4000:])
    assert "has died" in out and ".. The run" not in out  # the exit detail ends the sentence once
    keep = r"the learner roles start again, generator, verifier keep running"
    assert re.search(r"restarting the run from the first step \(no checkpoint yet\): steps 1-\d+ are redone; "
                     rf"{keep}; 1 more restart\(s\) allowed", out), [l for l in out.splitlines() if "restart" in l]
    assert re.search(r"restarting the run from its newest checkpoint, step_4: steps 5-\d+ are redone; "
                     rf"{keep}; 0 more restart\(s\) allowed", out), out[-4000:]
    # only the learner restarted: the generator and verifier are the same processes throughout
    assert len(others) == 3 and all(o["Generator"] and o["Verifier"] for o in others), others
    assert others[0] == others[1] == others[2], others
    check_no_loss(run_dir, steps)  # one metrics row per step, each sample trained on once
    assert read_metrics(run_dir)[-1]["version"] == steps
    # the summary and the last line count the whole command: its wall time, both restarts
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"] == 2 and [r["from_step"] for r in summary["restart_history"]] == [0, 4]
    # at least from the first kill to the summary's writing, both restarts inside (the interpreter's
    # start and Ray's shutdown around the run are not the run's, and on a loaded machine take long)
    span = (run_dir / "summary.json").stat().st_mtime - killed_at[0]
    assert span < summary["time/wall_s"] < wall and summary["time/restart_s"] > 0, (summary, span, wall)
    redone = summary["steps_redone"]
    assert redone == sum(r["at_step"] - r["from_step"] for r in summary["restart_history"]) > 0
    assert f"{steps} steps in {summary['time/wall_s']:.1f}s, after 2 learner restarts ({redone} steps redone)" in out
