"""Recipe spc (pipelines/spc.py): the game's rewards against hand-worked cases, the variants that are
not played, the choice of correct responses, the config errors, both learners in-process, and one
short run end to end with a resume."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from actors import batch as B
from actors.generator import Generator
from actors.judging import render, yes_probability
from coevo_cli import coevo, read_metrics, small
from orchestrator.config import ConfigError, load_config
from orchestrator.data import arithmetic
from actors.judge_learner import JudgeLearner
from pipelines.spc import (GAME, batch_auroc, game_rewards, pick_correct, sneaky_credit, sneaky_rewards,
                           variant_status)

TINY = ["model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1",
        "model.tiny.intermediate_size=64", "train.threads=1"]


def _judging(config):
    """The critic's read-out as the recipe hands it to its learner (the judge pool's JudgingSpec)."""
    return config.judge.generator_args(config, {})["judging"]


def test_the_game_rewards_the_winner_plus_one_and_the_loser_minus_one():
    # four judged steps: a wrong variant accepted (the sneaky generator fooled the critic), a wrong
    # variant flagged (the critic caught it), a correct step accepted, a correct step flagged
    accepts = np.array([True, False, True, False])
    step_correct = np.array([False, False, True, True])
    critic = game_rewards(accepts, step_correct)
    assert critic.tolist() == [-1.0, 1.0, 1.0, -1.0]
    # variants: the two played ones above, then one the verifier found correct and one it could not
    # label; the sneaky generator's reward is minus the critic's where it played
    valid = np.array([True, True, False, False])
    on_variants = np.array([critic[0], critic[1], np.nan, np.nan])
    assert sneaky_rewards(valid, on_variants, -1.0).tolist() == [1.0, -1.0, -1.0, -1.0]
    left_out = sneaky_rewards(valid, on_variants, None)
    assert left_out[:2].tolist() == [1.0, -1.0] and np.isnan(left_out[2:]).all()


def test_only_variants_the_verifier_confirms_wrong_are_played():
    status = variant_status(np.array([0.0, 1.0, np.nan, 0.0, 0.2]), ["17", "12", "x", "  ", "3"], threshold=0.5)
    assert status.tolist() == ["wrong", "not_wrong", "unverified", "empty", "wrong"]


def test_the_game_starts_from_one_verified_correct_response_per_prompt():
    table = pa.table({"prompt_id": ["a", "a", "a", "b", "b", "c", "d"],
                      "response": ["3", "4", "3", "5", "", "9", "2"],
                      "reward.correct": pa.array([1.0, 0.0, 1.0, 0.0, 1.0, None, 1.0], pa.float32())})
    rows = pick_correct(table, "correct", 0.5, limit=10, rng=np.random.default_rng(0))
    # a: rows 0 or 2; b: its correct response is empty; c: not labelled; d: row 6
    assert len(rows) == 2 and rows[0] in (0, 2) and rows[1] == 6
    assert len(pick_correct(table, "correct", 0.5, limit=1, rng=np.random.default_rng(0))) == 1
    assert pick_correct(table, "other", 0.5, limit=10, rng=np.random.default_rng(0)) == []
    table = table.append_column("reward.critic", pa.array([0.9, 0.1, 0.8, 0.3, 0.5, 0.9, 0.7], pa.float32()))
    assert batch_auroc(table, "critic", "correct") == 1.0  # labelled rows only: c's 0.9 is left out


@pytest.mark.parametrize("overrides, message", [
    (["rewards=[{name: critic, judge: true}]"], "recipe spc needs a verifier reward function"),
    (["rewards=[{name: correct, fn: integer_match}]"], "recipe spc needs exactly one judge reward source, the critic"),
    (["rewards=[{name: correct, fn: integer_match}, {name: c1, judge: true}, {name: c2, judge: true}]"],
     r"rewards has 2: \['c1', 'c2'\]"),
    (["judge.mode=sampled"], "recipe spc: judge.mode 'sampled'; the critic's verdict is P"),
    (["roles.critic_learner.replicas=2"],
     "roles.critic_learner.replicas=2: recipe spc trains its critic_learner on one rank"),
    (["spc.template='{prompt}!'"], "spc.template must contain {response}"),
    (["spc.variants=1"], "spc.variants"),
    (["spc.gamez=3"], "unknown key 'spc.gamez'"),
    (["spc.replay=2", "spc.policy_items=0"],
     "spc.replay=2 replays the policy's labelled rollouts to the critic; spc.policy_items is 0"),
])
def test_config_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config("spc", overrides)


def test_the_critic_learns_from_the_game_reward():
    """Flagging a wrong step and accepting a correct one both raise its expected reward: P(yes)
    falls on the wrong step and rises on the correct one, as the judge pool reads it."""
    config = load_config("spc", [*TINY, "spc.critic_lr=3e-3"])
    critic = JudgeLearner(config, judging=_judging(config), lr=config.spc.critic_lr, prefix="critic")
    table = pa.table({"prompt": ["2+3=", "2+3="], "response": ["6", "5"], "step_correct": [False, True]})
    texts = [render(config.judge.template, "2+3=", r) for r in ("6", "5")]

    def p_yes():
        return yes_probability(critic.model, critic.tokenizer, texts, critic.yes, critic.no, critic.device)

    before = p_yes()
    first = critic.train_game(table)
    # the two kinds weigh half each: E[R] = (-(2 p_wrong - 1) + (2 p_right - 1)) / 2
    assert first["critic/expected_reward"] == pytest.approx(float(before[1] - before[0]), abs=1e-5)
    for _ in range(20):
        last = critic.train_game(table)
    after = p_yes()
    assert after[0] < before[0] - 0.1 and after[1] > before[1] + 0.1, (before, after)
    assert last["critic/expected_reward"] > first["critic/expected_reward"] and last["critic/version"] == 21


def test_the_sneaky_learner_trains_on_the_game_reward_only():
    """Its batch has no column of the run's reward sources: the game's reward is its only one."""
    config = load_config("spc", [*TINY, "rollout.max_new_tokens=3"])
    prompts = arithmetic(1, ["+"], eval_size=10, seed=0).train.slice(0, 2)
    variants, _ = Generator(config, None).generate(prompts, n=4, seq=0)
    game = np.array([1.0, -1.0, -1.0, -1.0, -1.0, -1.0, 1.0, 1.0], np.float32)
    table = variants.append_column(B.REWARD_PREFIX + GAME, pa.array(game))
    from actors.learner import Learner

    learner = Learner(config, lr=1e-3, objectives=["policy_gradient"])
    before = {k: v.detach().clone() for k, v in learner.model.state_dict().items()}
    table, credit = sneaky_credit(config).apply(table)  # its own credit step: the game reward alone
    metrics = {**credit, **learner.train_step(table)}
    assert metrics["reward/mean"] == pytest.approx(float(game.mean()))
    assert table.column("reward").to_pylist() == pytest.approx(game.tolist())
    assert metrics["train/advantage_abs_mean"] > 0 and metrics["version"] == 1
    assert any(not torch.equal(before[k], v) for k, v in learner.model.state_dict().items())


def test_the_sneaky_game_under_grpo_bernoulli_is_grpo():
    """The game's +1 / -1 is an outcome, not a probability: with the policy on grpo_bernoulli (GRPO for
    rewards in [0, 1], which rejects -1) the sneaky learner's credit step is GRPO's exactly."""
    game = np.array([1.0, -1.0, -1.0, -1.0, -1.0, -1.0, 1.0, 1.0], np.float32)
    config = load_config("spc", [*TINY, "rollout.max_new_tokens=3"])
    prompts = arithmetic(1, ["+"], eval_size=10, seed=0).train.slice(0, 2)
    variants, _ = Generator(config, None).generate(prompts, n=4, seq=0)
    table = variants.append_column(B.REWARD_PREFIX + GAME, pa.array(game))
    advantages = {}
    for name in ("grpo", "grpo_bernoulli"):
        config = load_config("spc", [*TINY, "rollout.max_new_tokens=3", f"algorithm.advantage={name}"])
        out, _ = sneaky_credit(config).apply(table)
        advantages[name] = [a[0] for a in out.column("advantages").to_pylist()]
    assert advantages["grpo_bernoulli"] == pytest.approx(advantages["grpo"]) and any(advantages["grpo"])


@pytest.mark.long
@pytest.mark.slow
def test_spc_plays_the_game_and_resumes_both_players(ray_env, warm_cache, tmp_path) -> None:
    run_dir = tmp_path / "spc"
    # every prompt labelled, so each step has correct responses to start games from
    args = ["spc", *small(warm_cache, "verifier.fraction=1.0", "spc.games_per_step=4", "train.eval_every=2",
                          "--output-dir", str(run_dir))]
    coevo([*args, "train.max_steps=2"], ray_env, tmp_path)
    final = run_dir / "checkpoints" / "final"
    assert all((final / role / "config.json").is_file() for role in ("critic_learner", "sneaky_learner"))
    out = coevo(["--resume", "--output-dir", str(run_dir), "train.max_steps=3"], ray_env, tmp_path)
    assert "from final" in out, out[-3000:]
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        played = r["spc/games"] + sum(r[f"spc/invalid/{k}"] for k in ("not_wrong", "unverified", "empty"))
        assert r["spc/correct_responses"] > 0 and played == r["spc/variants"] == 4 * r["spc/correct_responses"]
    # both players learned every step, and came back from the checkpoint where they were
    assert [r["critic/version"] for r in rows] == [1, 2, 3] and [r["sneaky/version"] for r in rows] == [1, 2, 3]
    assert [r["channel/critic/version"] for r in rows] == [1, 2, 3]
    assert "eval/judge_auroc" in rows[1] and "judge/auroc" in rows[0]


def test_the_critic_replays_the_last_steps_policy_items_and_checkpoints_them(tmp_path):
    """spc.replay: the policy's labelled rollouts of the last `replay` steps join this step's items
    (the game's items are not replayed), the oldest drop out, and a restored critic replays the same."""
    config = load_config("spc", [*TINY, "spc.policy_items=8", "spc.replay=2"])
    critic = JudgeLearner(config, judging=_judging(config), lr=config.spc.critic_lr, replay=config.spc.replay,
                          prefix="critic")
    game = pa.table({"prompt": ["2+3="], "response": ["6"], "step_correct": [False]})

    def own(n):  # n policy items, half correct
        return pa.table({"prompt": ["1+1="] * n, "response": ["2"] * (n // 2) + ["3"] * (n - n // 2),
                         "step_correct": [True] * (n // 2) + [False] * (n - n // 2)})

    judged = [critic.train_game(game, own(n)) for n in (2, 4, 6)]
    assert [m["critic/steps_judged"] for m in judged] == [1 + 2, 1 + 4 + 2, 1 + 6 + 4 + 2]
    assert [m["critic/replayed"] for m in judged] == [0, 2, 6]
    assert critic.train_game(game, own(8))["critic/replayed"] == 6 + 4  # the first step's items dropped out
    critic.save(str(tmp_path / "ckpt"))
    fresh = JudgeLearner(config, model_source=str(tmp_path / "ckpt"), judging=_judging(config), lr=config.spc.critic_lr,
                         replay=2, prefix="critic")
    fresh.restore(str(tmp_path / "ckpt"))
    restored = fresh.train_game(None, own(2))
    assert restored["critic/replayed"] == 8 + 6 and restored["critic/steps_judged"] == 2 + 8 + 6
    # replay 0: this step's items only
    plain = JudgeLearner(config, judging=_judging(config), lr=config.spc.critic_lr, prefix="critic")
    assert [plain.train_game(game, own(4))["critic/steps_judged"] for _ in range(2)] == [5, 5]
