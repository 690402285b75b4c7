"""Recipe ppo end to end: a critic learner values the batch, the policy trains on GAE advantages,
the critic on the returns, and is checkpointed."""

from __future__ import annotations

import pytest

from coevo_cli import coevo, read_metrics, small
from orchestrator.config import ConfigError, load_config


def test_gae_belongs_to_recipe_ppo() -> None:
    with pytest.raises(ConfigError, match="advantage=gae needs a critic's values per token: recipe ppo"):
        load_config(None, ["algorithm.advantage=gae"])
    with pytest.raises(ConfigError, match="recipe ppo trains with algorithm.advantage=gae"):
        load_config("ppo", ["algorithm.advantage=grpo"])
    assert load_config("ppo", []).ppo.lam == 0.95


@pytest.mark.slow
def test_ppo_trains_its_critic(ray_env, warm_cache, tmp_path) -> None:
    """(A critic resumes as every learner role does: tests/test_checkpoint_contents.py.)"""
    run_dir = tmp_path / "ppo"
    coevo(small(warm_cache, "recipe=ppo", "algorithm.advantage=gae", "train.max_steps=3", "train.eval_every=3",
                "--output-dir", str(run_dir)), ray_env, tmp_path)
    final = run_dir / "checkpoints" / "final"
    assert (final / "critic" / "value_head.pt").is_file() and (final / "critic" / "sharded").is_dir()
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["critic/version"] for r in rows] == [1, 2, 3]  # the critic trained every step
    assert all(r["value/loss"] >= 0 for r in rows) and rows[-1]["train/advantage_abs_mean"] > 0
