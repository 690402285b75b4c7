"""What a checkpoint holds: a learner role of any name (kinds are declared, not guessed from names),
the frozen models and references the run reads (so a resume needs no cache: checked end to end on
the GRPO run with a reward model in test_recipes_integration.py, which has both), and a durable
commit (every file and directory flushed before the rename, the parent after it)."""

from __future__ import annotations

import json
import os

import pytest

from coevo_cli import coevo, read_metrics, small
from test_recipes_integration import write_pairs

# A reward-model recipe whose learner role is named `critic`, defined by a user (`module:Class`).
CRITIC = '''
from orchestrator.roles import RoleSpec
from pipelines.reward_model import RewardModelTraining


class Critic(RewardModelTraining):
    name = "critic"

    @classmethod
    def roles(cls, config, sources):
        start = sources.learners.get("critic") or config.reward_model.init or sources.policy
        return {"critic": RoleSpec("actors.reward_learner:RewardLearner", (start,),
                                   config.reward_model.learner_args(config), kind="learner", num_cpus=1)}

    async def prepare(self, ctx):
        pass

    async def learn(self, ctx, tables, dump_path):
        out = await ctx.pools["critic"].call("train_pairs", *tables, table=False)
        ctx.versions["critic"] = out["rm/version"]
        return out

    async def evaluate(self, ctx):
        return {}
'''

FAST = ["warmup.enabled=false", "train.eval_every=100"]


@pytest.mark.slow
def test_a_learner_named_critic_is_checkpointed_and_resumed(ray_env, warm_cache, tmp_path) -> None:
    (tmp_path / "critic_recipe.py").write_text(CRITIC)
    write_pairs(tmp_path / "pairs.jsonl", 100)
    run_dir = tmp_path / "run"
    args = small(warm_cache, *FAST, "recipe=critic_recipe:Critic", "reward_model.pairs_path=pairs.jsonl",
                 "reward_model.eval_pairs=20", "reward_model.batch_pairs=16", "--output-dir", str(run_dir))
    coevo([*args, "train.max_steps=2"], ray_env, tmp_path)
    final = run_dir / "checkpoints" / "final"
    assert json.loads((final / "loop_state.json").read_text())["learners"] == ["critic"]
    assert (final / "critic" / "sharded" / ".metadata").is_file() and (final / "critic" / "config.json").is_file()
    out = coevo(["--resume", "--output-dir", str(run_dir), "train.max_steps=4"], ray_env, tmp_path)
    assert "from final" in out
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["rm/version"] for r in rows] == [1, 2, 3, 4]  # the critic's own state came back


def test_commit_flushes_every_file_and_directory_before_the_rename(tmp_path, monkeypatch) -> None:
    from orchestrator import checkpoint as ckpt

    tmp = ckpt.begin(tmp_path, "step_1")
    (tmp / "policy_learner").mkdir()
    (tmp / "policy_learner" / "model.safetensors").write_bytes(b"x")
    flushed, renamed = [], []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd):
        flushed.append((os.readlink(f"/proc/self/fd/{fd}"), bool(renamed)))
        real_fsync(fd)

    def rename(a, b):
        renamed.append((str(a), str(b)))
        real_rename(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    final = ckpt.commit(tmp, {"step": 1}, keep=2)
    before = {path for path, after in flushed if not after}
    for name in ("policy_learner/model.safetensors", "policy_learner", "loop_state.json", ""):
        assert str(tmp / name).rstrip("/") in before, name
    assert (str(tmp.parent), True) in flushed  # the rename itself, made durable
    assert final == tmp_path / "checkpoints" / "step_1" and (final / "loop_state.json").is_file()


def test_a_checkpoint_missing_its_frozen_model_is_refused_by_name(tmp_path) -> None:
    from orchestrator import frozen

    state = {"frozen": {"policy": None, "reward_models": {"rm": "frozen/reward_models/rm"}}}
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(FileNotFoundError, match=r"--resume: the checkpoint lacks its frozen model .*ckpt/frozen/"
                                                r"reward_models/rm \(no config.json\)"):
        frozen.from_checkpoint(tmp_path / "ckpt", tmp_path / "run", state, [])
    with pytest.raises(FileNotFoundError, match=r"the run's frozen model .*run/frozen/reward_models/rm is gone"):
        frozen.into_checkpoint(tmp_path / "tmp", tmp_path / "run", state["frozen"], [])


def test_held_state_refuses_a_malformed_checkpoint_entry_and_merges_a_batch_once() -> None:
    from orchestrator.held_state import HeldState

    held = HeldState(lambda state, delta: {"n": state.get("n", 0) + delta["n"]})
    with pytest.raises(ValueError, match=r"held role state must be \{'state': \{...\}, 'seen': \[...\]\}, got list"):
        held.load_state_dict([1, 2])
    assert held.merge({"batch": "a", "state": {"n": 2}}) and not held.merge({"batch": "a", "state": {"n": 2}})
    assert held.merge({"batch": None, "state": {"n": 1}}) and held.state == {"n": 3}
    copy = HeldState(held._merge)
    copy.load_state_dict(json.loads(json.dumps(held.state_dict())))
    assert not copy.merge({"batch": "a", "state": {"n": 2}}) and copy.state == {"n": 3}
