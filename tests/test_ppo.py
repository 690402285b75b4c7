"""Recipe ppo end to end: a critic learner values the batch, the policy trains on GAE advantages,
the critic on the returns; both are checkpointed and resumed."""

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
def test_ppo_trains_its_critic_and_resumes(ray_env, warm_cache, tmp_path) -> None:
    run_dir = tmp_path / "ppo"
    common = ["recipe=ppo", "algorithm.advantage=gae", "train.eval_every=3", "--output-dir", str(run_dir)]
    coevo(small(warm_cache, "train.max_steps=2", *common), ray_env, tmp_path)
    final = run_dir / "checkpoints" / "final"
    assert (final / "critic" / "value_head.pt").is_file() and (final / "policy_learner" / "config.json").is_file()
    out = coevo(["--resume", "--output-dir", str(run_dir), "train.max_steps=3"], ray_env, tmp_path)
    assert "from final (step 2)" in out, out[-3000:]
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["critic/version"] for r in rows] == [1, 2, 3]  # the critic trained every step, and resumed
    assert all(r["value/loss"] >= 0 for r in rows) and rows[-1]["train/advantage_abs_mean"] > 0
