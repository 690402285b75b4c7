"""Episodes under faults (docs/environments.md): a generator killed with SIGKILL while its episodes
are running loses no sample and trains none twice, and a run of episodes interrupted mid-run
resumes to match an uninterrupted one step for step. The run: 1-digit addition with the
calculator (the warm-up demonstrates the calls), async so the generator is busy in the middle of a
batch's episodes when it is killed."""

from __future__ import annotations

import json
import os
import signal
import uuid

import pytest

from coevo_cli import coevo, finish, read_metrics, small, start, steps_logged, wait_for
from test_faults import DETERMINISTIC, MARK, actor_pids, check_no_loss, checkpoint_steps

# a call `<calc>3+4</calc>` is 16 tokens, its observation 13, the answer 2 and an end
EPISODES = ("env.name=calculator", "env.max_turns=3", "env.max_tokens=40", "env.observation_tokens=8",
            "rollout.max_new_tokens=18", "warmup.target_accuracy=0.5")


def check_episodes(run_dir, steps: int) -> None:
    """The trained rows are episodes: a loss mask as long as the response, false on observations."""
    import pandas as pd

    multi = 0
    for step in range(1, steps + 1):
        dump = pd.read_parquet(run_dir / "rollouts" / f"step_{step}.parquet",
                               columns=["response_ids", "loss_mask", "turns", "episode_end"])
        for ids, mask, turns in zip(dump["response_ids"], dump["loss_mask"], dump["turns"]):
            assert len(ids) == len(mask)
            if turns > 1:
                multi += 1
                assert not mask.all(), "an episode of several turns has observation tokens in its loss"
        assert set(dump["episode_end"]) <= {"done", "max_turns", "token_budget"}
    assert multi > 0, "no episode took more than one turn"


@pytest.mark.slow
@pytest.mark.long  # a fault run of episodes: CI's long stage (the main suite stays near 15 minutes)
def test_a_generator_killed_mid_episode_loses_no_episode(ray_env, warm_cache, tmp_path) -> None:
    mark = uuid.uuid4().hex
    run_dir = tmp_path / "run"
    steps = 10
    proc = start(small(warm_cache, *EPISODES, f"train.max_steps={steps}", f"train.eval_every={steps}",
                       "train.dump_rollouts=true", "train.max_staleness=1", "algorithm.off_policy=tis", "--output-dir", str(run_dir)),
                 {**ray_env, MARK: mark}, tmp_path)
    # async: from step 3 on the generator is running the next batch's episodes while the learner trains
    wait_for(lambda: steps_logged(run_dir) >= 3, 400, "step 3", proc)
    pids = actor_pids(mark, "Generator")
    assert pids, "no generator process found"
    os.kill(pids[0], signal.SIGKILL)
    out = finish(proc, 400)
    assert proc.returncode == 0, out[-6000:]
    check_no_loss(run_dir, steps)
    check_episodes(run_dir, steps)
    assert read_metrics(run_dir)[-1]["role/generator/failures"] >= 1


@pytest.mark.slow
@pytest.mark.long  # three runs of episodes: CI's long stage
def test_a_run_of_episodes_resumes_mid_run_to_match_an_uninterrupted_one(ray_env, warm_cache, tmp_path) -> None:
    args = small(warm_cache, *EPISODES, "train.max_steps=8", "train.eval_every=4", "train.checkpoint_every=0",
                 "train.dump_rollouts=true")
    reference = tmp_path / "reference"
    coevo([*args, "--output-dir", str(reference)], ray_env, tmp_path, timeout=600)
    expected = read_metrics(reference)

    run_dir = tmp_path / "run"
    proc = start([*args, "--output-dir", str(run_dir)], ray_env, tmp_path)
    wait_for(lambda: steps_logged(run_dir) >= 3, 300, "three steps", proc)
    proc.send_signal(signal.SIGINT)
    out = finish(proc, 120)
    assert proc.returncode == 130, out[-4000:]
    stopped_at = steps_logged(run_dir)
    state = json.loads((run_dir / "checkpoints" / f"step_{stopped_at}" / "loop_state.json").read_text())
    assert state["step"] == stopped_at < 8 and checkpoint_steps(run_dir) == [stopped_at]
    out = coevo(["--resume", "--output-dir", str(run_dir)], ray_env, tmp_path, timeout=400)
    assert f"from step_{stopped_at}" in out
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 9))
    for got, want in zip(rows, expected):
        for key in (*DETERMINISTIC, "env/turns_mean", "env/tool_calls_mean", "env/observation_token_frac"):
            assert got.get(key) == pytest.approx(want.get(key), abs=1e-6), (got["step"], key)
    check_no_loss(run_dir, 8)
    check_episodes(run_dir, 8)
