"""Recipes ppo and dph end to end. ppo: a critic learner values the batch, the policy trains on GAE advantages,
the critic on the returns, and is checkpointed."""

from __future__ import annotations

import pytest

from coevo_cli import coevo, read_metrics, small
from orchestrator.config import ConfigError, load_config


def test_gae_belongs_to_recipe_ppo() -> None:
    with pytest.raises(ConfigError, match="advantage=gae needs a critic's values per token: recipe 'grpo' "
                                          r"estimates advantages from rewards alone \(its credit step has no GAE\)"):
        load_config(None, ["algorithm.advantage=gae"])
    with pytest.raises(ConfigError, match="recipe ppo trains with algorithm.advantage=gae"):
        load_config("ppo", ["algorithm.advantage=grpo"])
    assert load_config("ppo", []).ppo.lam == 0.95


@pytest.mark.long
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


def test_dph_needs_a_verifier_to_keep_correct_samples() -> None:
    with pytest.raises(ConfigError, match="dph.keep=correct needs a verifier reward function"):
        load_config("dph", ["rewards=[{name: rm, model: auto}]"])
    load_config("dph", ["rewards=[{name: rm, model: auto}]", "dph.keep=all"])
    assert load_config("dph", []).dph.divergence == "js"


@pytest.mark.long
@pytest.mark.slow
def test_dph_rehearses_the_initial_policys_samples(ray_env, warm_cache, tmp_path) -> None:
    run_dir = tmp_path / "dph"
    out = coevo(small(warm_cache, "recipe=dph", "dph.keep=all", "dph.prompts=8", "dph.samples=2", "dph.batch=8",
                      "train.max_steps=2", "train.eval_every=2", "--output-dir", str(run_dir)), ray_env, tmp_path)
    assert "dph: rehearsal set of 16 samples from the initial policy" in out, out[-3000:]
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["rehearsal/samples"] == 16 and r["rehearsal/divergence"] >= 0 for r in rows)
    assert rows[0]["rehearsal/divergence"] == pytest.approx(0.0, abs=1e-3)  # before any update: pi = pi_init


@pytest.mark.long
@pytest.mark.slow
def test_spark_trains_the_policy_as_its_own_judge(ray_env, warm_cache, tmp_path) -> None:
    run_dir = tmp_path / "spark"
    coevo(small(warm_cache, "recipe=spark", "rewards=[{name: correct, fn: integer_match}, {name: judge, judge: true, "
                "weight: 0.5}]", "train.max_steps=2", "train.eval_every=2", "--output-dir", str(run_dir)),
          ray_env, tmp_path)
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["self_judge/loss"] > 0 and 0 <= r["self_judge/accuracy"] <= 1 for r in rows)
    assert any(k.startswith("reward/judge") or k.startswith("reward_source/judge") for k in rows[-1]), sorted(rows[-1])
