"""SPARK's judging modes (spark.mode): pairwise and reflective judge examples and losses against
values computed by hand from the same model, the pairwise win-rate reward, and the config errors."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from actors.judge_modes import opponent_pairs, pairwise_win_rates, reflective_texts, render_pair
from actors.judging import render, single_token, yes_probability
from actors.learner import Learner
from orchestrator.config import ConfigError, load_config, validate_config
from rl_step import generator, train
from test_learner import TINY, make_config
from test_learner import config, prompts, reward_fn, scored  # noqa: F401  (fixtures shared with test_learner)


def spark_config(reward_fn, **spark):
    return validate_config({
        "recipe": "spark", "seed": 0, "model": {"tiny": TINY},
        "rollout": {"prompts_per_step": 4, "samples_per_prompt": 4, "max_new_tokens": 4},
        "rewards": [{"name": "varied", "fn": reward_fn, "timeout_s": 10}, {"name": "judge", "judge": True}],
        "algorithm": {"lr": 1e-2}, "train": {"threads": 1}, "spark": spark})


def column(table, name) -> list:
    return table.column(name).to_pylist()


def test_opponent_pairs_are_a_bounded_ring() -> None:
    assert opponent_pairs(4, 1) == [(0, 1), (0, 3), (1, 2), (2, 3)]  # everyone meets 2 others
    assert opponent_pairs(4, 2) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]  # all of them
    assert opponent_pairs(2, 3) == [(0, 1)] and opponent_pairs(1, 2) == []


def test_pairwise_win_rate_is_the_mean_over_both_orders(config) -> None:  # noqa: F811
    """A group of 3 (k=1: every pair) and a lone response, which no pair can score."""
    learner = Learner(config)
    model, tok = learner.model, learner.tokenizer
    a, b = single_token(tok, "A", "a"), single_token(tok, "B", "b")
    template = "{prompt}{a}|{b}?"
    prompts, responses, groups = ["1+1="] * 3 + ["2+2="], ["2", "3", "11", "4"], ["g", "g", "g", "h"]
    scores, errors = pairwise_win_rates(model, tok, prompts, responses, groups, template, a, b, 1, "cpu")

    def p_first(x, y):
        return float(yes_probability(model, tok, [render_pair(template, "1+1=", x, y)], a, b, "cpu")[0])

    def beats(x, y):
        return (p_first(x, y) + 1 - p_first(y, x)) / 2

    assert scores[0] == pytest.approx((beats("2", "3") + beats("2", "11")) / 2, abs=1e-5)
    assert scores[2] == pytest.approx((beats("11", "2") + beats("11", "3")) / 2, abs=1e-5)
    assert np.isnan(scores[3]) and errors[3] == "pairwise judging needs another response to the same prompt"
    assert errors[:3] == [None] * 3


def test_pairwise_self_judge_trains_on_both_orders_of_each_correct_wrong_pair(reward_fn, scored) -> None:  # noqa: F811
    config = make_config(reward_fn)
    learner = Learner(config, objectives=["policy_gradient", {"name": "self_judge", "mode": "pairwise",
                                                              "per_update": 1000}])
    tok = learner.tokenizer
    a, b = single_token(tok, "A", "a"), single_token(tok, "B", "b")
    p, r, g = column(scored, "prompt"), column(scored, "response"), column(scored, "group_id")
    ok = np.array(column(scored, "reward.varied")) >= 0.5
    texts, first_right = [], []
    for c in range(len(r)):
        for w in range(len(r)):
            if g[c] == g[w] and ok[c] and not ok[w]:
                texts += [render_pair("{prompt}{a}|{b}?", p[c], r[c], r[w]), render_pair("{prompt}{a}|{b}?", p[c], r[w], r[c])]
                first_right += [True, False]
    assert texts, "the batch needs a group with a correct and a wrong response"
    p_first = yes_probability(learner.model, tok, texts, a, b, "cpu")
    expected = float(np.mean(-np.log(np.where(first_right, p_first, 1 - p_first))))
    metrics = train(learner, scored)
    assert metrics["self_judge/loss"] == pytest.approx(expected, rel=1e-4)
    assert metrics["self_judge/examples"] == len(texts)


def test_reflective_self_judge_trains_the_verdict_after_its_own_reflection(reward_fn, scored) -> None:  # noqa: F811
    config = make_config(reward_fn)
    learner = Learner(config, objectives=["policy_gradient", {"name": "self_judge", "mode": "reflective",
                                                              "per_update": 1000, "reflect_tokens": 3}])
    tok = learner.tokenizer
    texts = reflective_texts(learner.model, tok, "{prompt}{response}|{prompt}", "?", column(scored, "prompt"),
                             column(scored, "response"), 3, "cpu")
    heads = [render("{prompt}{response}|{prompt}", p, r) for p, r in zip(column(scored, "prompt"), column(scored, "response"))]
    assert all(t.startswith(h) and t.endswith("?") and len(t) <= len(h) + 4 for t, h in zip(texts, heads))
    p_yes = yes_probability(learner.model, tok, texts, single_token(tok, "Y", "y"), single_token(tok, "N", "n"), "cpu")
    ok = np.array(column(scored, "reward.varied")) >= 0.5
    expected = float(np.mean(-np.log(np.where(ok, p_yes, 1 - p_yes))))
    metrics = train(learner, scored)
    assert metrics["self_judge/loss"] == pytest.approx(expected, rel=1e-4)
    assert metrics["self_judge/examples"] == scored.num_rows


def test_the_self_judge_replays_the_last_batches_and_checkpoints_them(reward_fn, scored, tmp_path) -> None:  # noqa: F811
    """spark.replay: the last `replay` batches' labelled rollouts stay in the judge's draw beside this
    batch's, the oldest drop out, and a learner restored from a checkpoint replays the same ones."""
    config = make_config(reward_fn)
    half = scored.slice(0, scored.num_rows // 2)
    spec = {"name": "self_judge", "per_update": 1000, "replay": 1}
    learner = Learner(config, objectives=["policy_gradient", spec])
    seen = [train(learner, t)["self_judge/examples"] for t in (half, scored, half)]
    assert seen == [half.num_rows, scored.num_rows + half.num_rows, half.num_rows + scored.num_rows]
    out = learner.save(str(tmp_path / "ckpt"))
    fresh = Learner(config, model_source=out, objectives=["policy_gradient", spec])
    fresh.restore(out)
    assert train(fresh, scored)["self_judge/examples"] == scored.num_rows + half.num_rows  # the last batch: half
    plain = Learner(config, objectives=["policy_gradient", {"name": "self_judge", "per_update": 1000}])
    assert [train(plain, t)["self_judge/examples"] for t in (half, scored)] == [half.num_rows, scored.num_rows]
    with pytest.raises(ValueError, match="replay >= 0"):
        Learner(config, objectives=[{"name": "self_judge", "replay": -1}])


def test_the_pairwise_judge_reward_is_each_responses_win_rate(reward_fn, prompts) -> None:  # noqa: F811
    config = spark_config(reward_fn, mode="pairwise", opponents=1)
    gen = generator(config)
    table, _ = gen.generate(prompts.slice(0, 2), seq=0)
    judged, info = gen.judge(table)
    tok = gen.backend.tokenizer
    expected, _ = pairwise_win_rates(gen.backend.model, tok, column(table, "prompt"), column(table, "response"),
                                     column(table, "group_id"), "{prompt}{a}|{b}?", single_token(tok, "A", "a"),
                                     single_token(tok, "B", "b"), 1, "cpu")
    got = np.array(column(judged, "reward.judge"), dtype=float)
    empty = np.array(column(table, "response")) == ""
    assert np.allclose(got[~empty], expected[~empty], atol=1e-6) and info["errors/judge"] == empty.sum()


def test_the_recipe_hands_its_generators_the_judging_format_and_laser_token_as_arguments(reward_fn) -> None:
    """What a generator judges with and whether it returns LaSeR's log-prob come from its role's
    arguments (Recipe.generator_args), built from the judge, spark and laser sections."""
    from actors.judge_modes import Pairwise, Reflective
    from actors.laser import LaserSpec
    from orchestrator.recipes import RECIPES

    def args(config) -> dict:
        return RECIPES.get(config.recipe).generator_args(config)

    judging = args(spark_config(reward_fn, mode="pairwise", opponents=3, first="X"))["judging"]
    assert (judging.sources, judging.mode, judging.yes, judging.template) == (("judge",), "yes_prob", "Y",
                                                                             "{prompt}{response}?")
    assert judging.format == Pairwise("{prompt}{a}|{b}?", "X", "B", 3)
    reflective = args(spark_config(reward_fn, mode="reflective", verdict_cue="!"))["judging"].format
    assert reflective == Reflective("{prompt}{response}|{prompt}", "!", 4)  # rollout.max_new_tokens
    assert args(spark_config(reward_fn))["judging"].format is None  # pointwise
    grpo = make_config(reward_fn)
    assert args(grpo) == {}  # no judge and no laser source: a plain sampler
    laser = validate_config({**grpo.model_dump(), "rewards": [{"name": "varied", "fn": reward_fn},
                                                              {"name": "self", "laser": True, "weight": 0}],
                             "laser": {"token": "N"}})
    assert args(laser) == {"laser": LaserSpec("N")}
    with pytest.raises(RuntimeError, match="generator replica 0 was built without a judging spec"):
        generator(grpo).judge(pa.table({"prompt": ["1+1="], "response": ["2"]}))


def test_spark_mode_config_errors_are_named(reward_fn) -> None:
    with pytest.raises(ConfigError, match="spark.mode=pairwise compares responses to one prompt; "
                                          "rollout.samples_per_prompt is 1"):
        load_config("spark", ["spark.mode=pairwise", "rollout.samples_per_prompt=1"])
    with pytest.raises(ConfigError, match="spark.mode"):
        load_config("spark", ["spark.mode=listwise"])
    with pytest.raises(ConfigError, match=r"spark.pair_template must contain \{b\}"):
        load_config("spark", ["spark.pair_template='{prompt}{a}?'"])
    with pytest.raises(ConfigError, match="spark.reflect_template must contain {response}"):
        load_config("spark", ["spark.reflect_template='{prompt}|'"])
    with pytest.raises(ConfigError, match="spark.first and spark.second must differ, both are 'A'"):
        load_config("spark", ["spark.second=A"])
    with pytest.raises(ConfigError, match="spark.mode=reflective reads the judge's verdict-token probabilities; "
                                          "judge.mode=sampled"):
        load_config("spark", ["spark.mode=reflective", "judge.mode=sampled"])
    assert load_config("spark", ["spark.mode=reflective"]).spark.objective(load_config("spark", []))[
        "reflect_tokens"] == 5  # rollout.max_new_tokens of spark.yaml
    config = make_config(reward_fn)
    with pytest.raises(ValueError, match="self_judge mode must be one of pointwise, pairwise, reflective, got 'x'"):
        Learner(config, objectives=[{"name": "self_judge", "mode": "x"}])
    with pytest.raises(ValueError, match="spark.first 'AB' is 2 tokens"):
        Learner(config, objectives=[{"name": "self_judge", "mode": "pairwise", "first": "AB"}])


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["pairwise", "reflective"])
def test_spark_mode_end_to_end(mode, ray_env, warm_cache, tmp_path) -> None:
    """Two steps with the verifier on half the prompts and the judge filling in for it elsewhere (hot
    sampling: the warm policy gets nearly every training prompt right, and a pair needs a wrong answer)."""
    from coevo_cli import coevo, read_metrics, small

    run_dir = tmp_path / mode
    coevo(small(warm_cache, "recipe=spark", f"spark.mode={mode}", "spark.eval_prompts=8", "verifier.fraction=0.5",
                "rewards=[{name: correct, fn: integer_match}, {name: judge, judge: true, weight: 0}]",
                "aggregate.fill={correct: judge}", "rollout.temperature=2.0", "train.max_steps=2", "train.eval_every=2",
                "--output-dir", str(run_dir)), ray_env, tmp_path)
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["self_judge/loss"] > 0 and r["self_judge/examples"] > 0 for r in rows)
    assert all(0 <= r["reward/judge/mean"] <= 1 and r["reward/correct/filled_frac"] > 0 for r in rows)
    assert rows[-1]["eval/judge_auroc"] is None or 0 <= rows[-1]["eval/judge_auroc"] <= 1
    assert "eval/judge_agreement" in rows[-1] and "spark/batch_auroc" in rows[-1]


def test_judge_scores_count_only_rows_the_verifier_labelled() -> None:
    """spark/batch_auroc and eval/judge_*: the last row has no verifier label (verifier.fraction)."""
    import pyarrow as pa

    from pipelines.spark import judge_scores

    config = load_config("spark", ["rewards=[{name: correct, fn: integer_match}, {name: judge, judge: true}]"])
    table = pa.table({"reward.judge": pa.array([0.9, 0.2, 0.6, 0.1], pa.float32()),
                      "reward.correct": pa.array([1.0, 0.0, 0.0, None], pa.float32())})
    out = judge_scores(config, [table.slice(0, 2), table.slice(2)], "eval/judge")
    assert out["eval/judge_auroc"] == pytest.approx(1.0)  # the correct row outscores both wrong ones
    assert out["eval/judge_agreement"] == pytest.approx(2 / 3)  # 0.6 > 0.5 calls a wrong answer right
    assert out["eval/judge_score"] == pytest.approx((0.9 + 0.2 + 0.6) / 3, abs=1e-6)
