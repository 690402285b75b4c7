"""Issue 32: the sorting task (a verification gap) and its verifier, learned rewards in the credit
step (orchestrator/judge_credit.py: calibration, gating, flat groups, the guard that falls back to
the labelled-only reward), the hacking count, and the recipes' safeguards (SPC's critic on the
policy's own labelled rollouts, self_rewarding's labels and guard, the judging warm-up on labelled
prompts only)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from actors import batch as B
from actors.rewards.sorting import problem_digits, sorted_digits
from orchestrator.config import ConfigError, load_config
from orchestrator.data import DatasetError, load_prompts, sorting
from orchestrator.evaluation import hacking
from orchestrator.judge_credit import LearnedRewards, gate_unsure, group_flatten, platt, weighted_vote
from orchestrator.recipes import RECIPES, Sources
from test_learner import config, prompts, reward_fn, scored  # noqa: F401  (fixtures: a scored batch)


def per_row(column: pa.ChunkedArray) -> list[np.ndarray]:
    return [np.asarray(v, np.float32) for v in column.to_pylist()]


# ---- the sorting task ------------------------------------------------------------------------------
def test_the_sorting_task_holds_distinct_problems_and_their_sorted_answers():
    tasks = sorting(length=5, size=300, eval_size=50, seed=3)
    prompts = tasks.train.column("prompt").to_pylist() + tasks.eval.column("prompt").to_pylist()
    assert len(prompts) == len(set(prompts)) == 300 and tasks.eval.num_rows == 50
    for p, a in zip(tasks.train.column("prompt").to_pylist(), tasks.train.column("answer").to_pylist()):
        assert p.endswith(">") and len(p) == 6 and a == "".join(sorted(p[:-1]))
        assert sorted_digits(p, a) == 1.0
    assert sorting(5, 300, 50, 3).train.column("prompt").to_pylist() == tasks.train.column("prompt").to_pylist()


def test_the_sorting_recipe_loads_with_a_labelled_quarter():
    cfg = load_config("grpo_sorting")
    prompts = load_prompts(cfg.data, cfg.seed, cfg.verifier.fraction)
    assert prompts.name == "sorting-6" and prompts.eval.num_rows == 200
    assert 0.2 < np.mean(prompts.train.column("labelled").to_numpy(zero_copy_only=False)) < 0.3


@pytest.mark.parametrize("size, eval_size, message", [(600_000, 200, "more than half"), (100, 100, "leaves none")])
def test_a_sorting_task_too_big_or_too_small_is_refused_by_name(size, eval_size, message):
    with pytest.raises(DatasetError, match=message):
        sorting(6 if size > 1000 else 4, size, eval_size, 0)


def test_the_sorting_task_has_no_analogs():
    cfg = load_config("grpo_sorting", ["data.analogs=commuted"])
    with pytest.raises(DatasetError, match="no analogous problems"):
        load_prompts(cfg.data, 0)


def test_the_sorting_verifier_checks_same_digits_in_order():
    assert sorted_digits("3121>", "1123") == 1.0
    assert sorted_digits("3121>", " 1123\n") == 1.0  # surrounding whitespace is not the answer
    assert sorted_digits("3121>", "123") == 0.0  # a digit dropped
    assert sorted_digits("3121>", "1213") == 0.0  # out of order
    assert sorted_digits("3121>", "1124") == 0.0  # another digit
    assert sorted_digits("3121>", "") == 0.0
    assert problem_digits("sort 907>") == "907"  # the last word before the separator


@pytest.mark.parametrize("prompt", ["3121", "31a1>", ">"])
def test_a_sorting_prompt_without_digits_is_a_bad_row(prompt):
    with pytest.raises(ValueError, match="sorting prompt"):
        sorted_digits(prompt, "1123")


def test_sorted_digits_is_a_registered_verifier():
    cfg = load_config("grpo_sorting", ["rewards=[{name: s, fn: sorted_digits}]"])
    assert cfg.fn_rewards()[0].fn == "sorted_digits"


# ---- learned rewards in the credit step ------------------------------------------------------------
def test_platt_scaling_recovers_a_known_logistic():
    rng = np.random.default_rng(0)
    x = rng.normal(size=4000)
    y = rng.random(4000) < 1 / (1 + np.exp(-(2.0 * x - 0.5)))
    a, b = platt(x, y)
    assert a == pytest.approx(2.0, abs=0.2) and b == pytest.approx(-0.5, abs=0.15)


def test_platt_scaling_of_scores_that_separate_the_labels_stays_finite_and_unsaturated():
    # a window the judge (or an unbounded reward model) ranks perfectly: with 0/1 targets the fit has
    # no finite optimum and every calibrated value became 0 or 1 (slopes of 1e4-3e5 were measured)
    for scale in (1.0, 300.0):
        scores = np.r_[np.linspace(1, 2, 16), np.linspace(-2, -1, 16)] * scale
        labels = np.r_[np.ones(16), np.zeros(16)]
        a, b = platt(scores, labels)
        assert np.isfinite([a, b]).all() and 0 < a * scale < 20
        p = 1 / (1 + np.exp(-(a * scores + b)))
        assert 0.01 < p.min() and p.max() < 0.99  # not saturated at 0 or 1
        assert p[:16].mean() == pytest.approx(17 / 18, abs=0.02) and p[16:].mean() == pytest.approx(1 / 18, abs=0.02)
        assert np.all(np.diff(p[:16]) > 0)  # the judge's order within a class is kept


def test_group_flatten_leaves_spread_groups_and_flattens_narrow_ones():
    values = np.array([0.50, 0.52, 0.1, 0.9, np.nan, 0.3])
    groups = np.array([0, 0, 1, 1, 2, 2])
    out, frac = group_flatten(values, groups, 0.1)
    assert out[:2] == pytest.approx([0.51, 0.51]) and out[2:4] == pytest.approx([0.1, 0.9])
    assert np.isnan(out[4]) and out[5] == 0.3  # a group of one usable value is left as it is
    assert frac == 0.5


def test_gate_unsure_gives_an_unsure_value_its_groups_sure_mean():
    values = np.array([0.9, 0.1, 0.55, 0.45, 0.52])
    groups = np.array([0, 0, 0, 1, 1])
    out, frac = gate_unsure(values, groups, 0.1)
    assert out == pytest.approx([0.9, 0.1, 0.5, 0.5, 0.5])  # group 1 has no sure value: 0.5
    assert frac == pytest.approx(3 / 5)


def judged(scores, labels, groups=None) -> pa.Table:
    n = len(scores)
    groups = list(range(n)) if groups is None else groups
    return pa.table({"prompt_id": [f"p{g}" for g in groups], "group_id": [f"g{g}" for g in groups],
                     "reward.correct": pa.array(labels, pa.float32(), mask=np.isnan(np.asarray(labels, float))),
                     "reward.judge": pa.array(scores, pa.float32())})


def credit_config(*overrides):
    return load_config("spark", ["rewards=[{name: correct, fn: integer_match}, {name: judge, judge: true, weight: 0}]",
                                 "aggregate.fill={correct: judge}", *overrides])


def test_the_guard_drops_a_judge_at_chance_and_brings_it_back_when_it_ranks():
    part = LearnedRewards(credit_config("judge_credit.min_auroc=0.6", "judge_credit.window=1"))
    rng = np.random.default_rng(1)
    labels = np.r_[np.ones(20), np.zeros(20), np.full(10, np.nan)]
    chance = part(judged(rng.random(50), labels))
    assert part.metrics()["learned/judge/guard"] == 1.0 and part.metrics()["learned/judge/auroc"] < 0.6
    assert chance.column("reward.judge").null_count == 50  # dropped: the recipe trains on its labels alone
    good = np.r_[np.linspace(0.6, 1, 20), np.linspace(0, 0.4, 20), np.full(10, 0.7)]
    back = part(judged(good, labels))
    assert part.metrics()["learned/judge/guard"] == 0.0 and part.metrics()["learned/judge/auroc"] == 1.0
    assert back.column("reward.judge").to_numpy(zero_copy_only=False) == pytest.approx(good.astype(np.float32))


def test_the_guard_drops_a_judge_the_batch_it_collapses_not_when_the_window_forgets():
    """Three good batches, then one at chance: the window's AUROC is still high, the batch's is not,
    and the judge is dropped at once; a good batch brings it back."""
    part = LearnedRewards(credit_config("judge_credit.min_auroc=0.6", "judge_credit.window=4"))
    labels = np.r_[np.ones(20), np.zeros(20)]
    good = np.r_[np.linspace(0.6, 1, 20), np.linspace(0, 0.4, 20)]
    for _ in range(3):
        part(judged(good, labels))
        assert part.metrics()["learned/judge/guard"] == 0.0
    flipped = part(judged(1 - good, labels))  # ranks every pair the wrong way round
    m = part.metrics()
    assert m["learned/judge/auroc"] >= 0.6 and m["learned/judge/auroc_batch"] == 0.0
    assert m["learned/judge/guard"] == 1.0 and flipped.column("reward.judge").null_count == 40
    part(judged(good, labels))
    assert part.metrics()["learned/judge/guard"] == 0.0


def test_pairs_ordered_reads_the_ranking_within_groups():
    """Two prompts, one the judge scores high and one it scores low: within each it orders the pair
    the wrong way round, though across them it puts a right answer above a wrong one."""
    part = LearnedRewards(credit_config())
    scores = [0.8, 0.9, 0.1, 0.2, 0.5]  # easy: right 0.8 < wrong 0.9; hard: right 0.1 < wrong 0.2
    labels = [1, 0, 1, 0, np.nan]  # the fifth row is unlabelled: not counted
    part(judged(scores, labels, groups=[0, 0, 1, 1, 2]))
    assert part.metrics()["learned/judge/pairs_ordered"] == 0.0
    part(judged([0.9, 0.8, 0.2, 0.2], [1, 0, 1, 0], groups=[0, 0, 1, 1]))  # one right, one tie
    assert part.metrics()["learned/judge/pairs_ordered"] == 0.75
    part(judged([0.9, 0.8], [1, 1], groups=[0, 0]))  # no (right, wrong) pair in a group
    assert "learned/judge/pairs_ordered" not in part.metrics()


def test_the_guard_waits_for_both_kinds_of_label():
    part = LearnedRewards(credit_config("judge_credit.min_auroc=0.6"))
    out = part(judged(np.random.default_rng(0).random(20), np.r_[np.ones(18), np.zeros(2)]))
    assert "learned/judge/auroc" not in part.metrics() and part.metrics()["learned/judge/guard"] == 0.0
    assert out.column("reward.judge").null_count == 0


def test_calibration_maps_a_judges_score_to_the_labels_frequency():
    part = LearnedRewards(credit_config("judge_credit.confidence=calibrated", "judge_credit.window=3"))
    rng = np.random.default_rng(2)
    for _ in range(3):  # the judge says 0.9 or 0.1, but is right 70% of the time
        right = rng.random(200) < 0.7
        truth = rng.random(200) < 0.5
        says = np.where(right == truth, 0.9, 0.1)
        out = part(judged(says, truth.astype(float)))
    cal = out.column("reward.judge").to_numpy(zero_copy_only=False)
    assert cal[says == 0.9].mean() == pytest.approx(0.7, abs=0.06) and cal[says == 0.1].mean() == pytest.approx(0.3, abs=0.06)
    assert "learned/judge/calib_slope" in part.metrics()


def test_a_score_that_is_no_probability_waits_for_its_calibration_and_a_probability_does_not():
    """Before the window holds 8 labelled rows of each kind, `calibrated` cannot fit: a reward
    model's or LaSeR's unbounded score is dropped (it would enter beside the verifier's 0/1 in its
    own units, and grpo_bernoulli refuses it), a judge's P(yes) enters as it is; once the fit is
    possible both are probabilities."""
    few = [1, 0, 1, 0, np.nan, np.nan]
    unbounded = LearnedRewards(credit_config("judge_credit.confidence=gated"))
    out = unbounded(judged([2.5, -1.0, 1.5, -0.3, 3.0, -2.0], few))
    assert out.column("reward.judge").null_count == 6 and unbounded.metrics()["learned/judge/uncalibrated"] == 1.0
    bounded = LearnedRewards(credit_config("judge_credit.confidence=calibrated"))
    out = bounded(judged([0.9, 0.2, 0.7, 0.4, 0.8, 0.1], few))
    assert out.column("reward.judge").to_numpy(zero_copy_only=False) == pytest.approx([0.9, 0.2, 0.7, 0.4, 0.8, 0.1])
    labels = np.r_[np.ones(10), np.zeros(10), np.nan, np.nan]
    out = unbounded(judged(np.r_[np.linspace(1, 3, 10), np.linspace(-3, -1, 10), 4.0, -4.0], labels))
    values = out.column("reward.judge").to_numpy(zero_copy_only=False)
    assert out.column("reward.judge").null_count == 0 and ((values >= 0) & (values <= 1)).all()
    assert unbounded.metrics()["learned/judge/uncalibrated"] == 0.0 and values[20] > 0.5 > values[21]


def test_learned_reward_state_goes_through_a_checkpoint():
    cfg = credit_config("judge_credit.min_auroc=0.6")
    part = LearnedRewards(cfg)
    part(judged(np.r_[np.zeros(10), np.ones(10)], np.r_[np.ones(10), np.zeros(10)]))  # a judge upside down
    again = LearnedRewards(cfg)
    again.load_state_dict(part.state_dict())
    assert again.guarded == {"judge": True} and again.history == part.history


def test_a_credit_step_without_judge_credit_options_has_no_learned_reward_part_and_an_option_adds_one():
    plain = credit_config("judge_credit.min_auroc=null")  # spark ships with the guard on
    assert not any(isinstance(r, LearnedRewards) for r in RECIPES.get("spark").credit(plain, Sources()).rewards)
    credit = RECIPES.get("spark").credit(credit_config("judge_credit.min_auroc=null", "judge_credit.confidence=gated"),
                                         Sources())
    assert any(isinstance(r, LearnedRewards) for r in credit.rewards)


@pytest.mark.parametrize("weight", ["0.25", "auroc"])
def test_fill_weight_scales_the_advantages_of_the_rows_the_verifier_did_not_label(scored, weight):
    """Two groups labelled, two filled by the judge: the labelled rows keep their advantages, the
    filled ones get them times the weight (`auroc`: 2 * AUROC - 1 on the window, here about 0.4)."""
    from orchestrator.credit import Credit

    groups = B.group_index(scored)
    labelled = groups < 2
    label = np.where(labelled, (np.arange(scored.num_rows) % 2).astype(float), np.nan)
    judge = np.random.default_rng(3).random(scored.num_rows)
    table = scored.append_column("reward.correct", pa.array(label, pa.float32(), mask=np.isnan(label)))
    table = table.append_column("reward.judge", pa.array(judge, pa.float32()))
    steps = {}
    for w in ("1", weight):
        cfg = credit_config("judge_credit.min_auroc=null", f"judge_credit.fill_weight={w}")
        credit = RECIPES.get("spark").credit(cfg, Sources())
        if w == "auroc":  # a window where the judge ranks 3 of 4 (right, wrong) pairs right
            part = next(r for r in credit.rewards if isinstance(r, LearnedRewards))
            part(judged(np.r_[np.full(15, 0.9), np.full(5, 0.1), np.full(20, 0.5)], np.r_[np.ones(20), np.zeros(20)]))
        steps[w] = credit.apply(table)
    (plain, _), (scaled, metrics) = steps["1"], steps[weight]
    factor = 0.25 if weight == "0.25" else 2 * metrics["learned/judge/auroc"] - 1
    assert metrics["learned/fill_weight"] == pytest.approx(factor) and (weight != "auroc" or 0.2 < factor < 0.8)
    assert "learned/fill_weight" not in steps["1"][1]
    for keep, a, b in zip(labelled, per_row(plain.column("advantages")), per_row(scaled.column("advantages"))):
        assert b == pytest.approx(a if keep else factor * a, abs=1e-6)
    assert any(a.any() for a, keep in zip(per_row(plain.column("advantages")), labelled) if not keep)


def test_fill_weight_is_a_number_in_0_1_or_auroc():
    with pytest.raises(ConfigError, match="fill_weight"):
        credit_config("judge_credit.fill_weight=1.5")
    with pytest.raises(ConfigError, match="fill_weight"):
        credit_config("judge_credit.fill_weight=skill")
    assert credit_config("judge_credit.fill_weight=auroc").judge_credit.active


def test_a_judge_credit_label_source_must_be_a_verifier():
    with pytest.raises(ConfigError, match="judge_credit.label_source 'judge' is not a verifier"):
        credit_config("judge_credit.label_source=judge")


# ---- hacking -----------------------------------------------------------------------------------------
def test_hacking_counts_evaluations_where_the_judge_rose_while_accuracy_fell():
    first = {"eval/judge_score": 0.5, "eval/accuracy": 0.6}
    assert hacking(first, first, None) == {}
    second = {"eval/judge_score": 0.6, "eval/accuracy": 0.5}
    flagged = hacking(second, second, first)
    assert flagged == {"eval/hacking": 1.0, "eval/hacking_count": 1.0}
    third = {"eval/judge_score": 0.7, "eval/accuracy": 0.55}
    assert hacking(third, third, {**second, **flagged}) == {"eval/hacking": 0.0, "eval/hacking_count": 1.0}


def test_hacking_reads_a_reward_models_score_under_its_own_key():
    """A reward model's evaluation (`eval/reward_model_score`) is flagged the same way; the judge's
    key, absent there, flags nothing."""
    first = {"eval/reward_model_score": 0.4, "eval/accuracy": 0.6}
    second = {"eval/reward_model_score": 0.7, "eval/accuracy": 0.5}
    assert hacking(second, second, first, "eval/reward_model_score") == {"eval/hacking": 1.0, "eval/hacking_count": 1.0}
    assert hacking(second, second, first) == {"eval/hacking_count": 0}


def test_the_judge_scores_the_evaluations_greedy_responses_without_generating_them_again():
    """An evaluation generates the held-out greedy responses once: `greedy_accuracy(keep=)` hands its
    tables (one a generator replica, in prompt order) to the judge's measure, which scores those
    rows instead of asking the generators again; without them it generates its own."""
    import asyncio
    from types import SimpleNamespace

    from actors import batch as B
    from orchestrator.evaluation import greedy_accuracy, judge_quality

    calls = []
    right = {"p0": True, "p1": False, "p2": True, "p3": False}

    class Pool:
        replicas = [0, 1]

        async def call(self, method, data, **kwargs):  # `table=False` is a keyword of the evaluate call
            calls.append((method, data.column("prompt_id").to_pylist()))
            ids = data.column("prompt_id").to_pylist()
            if method == "generate":
                return data.append_column("response", pa.array(["r"] * len(ids))), {}
            if method == "evaluate":
                return {"accuracy": sum(right[i] for i in ids) / len(ids), "samples": len(ids)}
            column = B.REWARD_PREFIX + ("judge" if method == "judge" else "correct")
            out = data.append_column(column, pa.array([float(right[i]) for i in ids]))
            if method == "judge":
                return out, {}

            async def scored():
                return out
            return scored(), {}

    config = SimpleNamespace(judge_rewards=lambda: [SimpleNamespace(name="judge")], accuracy_source=lambda: "correct")
    held_out = pa.table({"prompt_id": list(right), "prompt": ["a", "b", "c", "d"]})
    ctx = SimpleNamespace(config=config, pools={"generator": Pool(), "verifier": Pool()},
                          prompts=SimpleNamespace(eval=held_out),
                          split=lambda table, pieces: [table.slice(0, 2), table.slice(2)])
    responses: list = []
    accuracy = asyncio.run(greedy_accuracy(ctx, keep=responses))
    judged = asyncio.run(judge_quality(ctx, accuracy, None, responses))
    assert accuracy["eval/accuracy"] == 0.5 and judged["eval/judge_auroc"] == 1.0
    assert [c for c in calls if c[0] == "generate"] == [("generate", ["p0", "p1"]), ("generate", ["p2", "p3"])]
    assert ("judge", ["p0", "p1", "p2", "p3"]) in calls
    calls.clear()
    asyncio.run(judge_quality(ctx, accuracy, None))  # no responses handed over: it generates them itself
    assert calls[0] == ("generate", ["p0", "p1", "p2", "p3"])


# ---- the recipes' safeguards ------------------------------------------------------------------------
def test_judged_items_are_balanced_labelled_rollouts():
    from actors.judge_learner import labelled_items as policy_items

    table = pa.table({"prompt": [f"q{i}" for i in range(8)], "response": ["1", "2", "", "4", "5", "6", "7", "8"],
                      "reward.correct": pa.array([1, 1, 1, 0, 0, 0, None, 1], pa.float32())})
    rng = np.random.default_rng(0)
    items = policy_items(table, "correct", 0.5, 10, rng)
    correct = items.column("step_correct").to_pylist()
    assert correct.count(True) == correct.count(False) == 3  # the empty and the unlabelled rows never
    assert "q2" not in items.column("prompt").to_pylist() and "q6" not in items.column("prompt").to_pylist()
    assert policy_items(table, "correct", 0.5, 0, rng).num_rows == 0
    assert policy_items(table, "correct", 0.5, 2, rng).num_rows == 2


def test_self_rewarding_pairs_by_labels_where_they_exist_and_guards_a_judge_at_chance():
    from pipelines.self_rewarding import IterationSource

    class Ctx:
        config = load_config("self_rewarding", ["rewards=[{name: judge, judge: true}, {name: correct, fn: integer_match}]",
                                                "judge_credit.min_auroc=0.6"])

    source = IterationSource.__new__(IterationSource)
    source.ctx = Ctx()
    samples = pa.table({"reward.correct": pa.array([1, 0, 1, 0, None, None], pa.float32())})
    good = np.array([0.9, 0.1, 0.8, 0.2, 0.7, 0.3])
    scores, info = source._with_labels(samples, good)
    assert scores[:4] == pytest.approx([1.0009, 0.0001, 1.0008, 0.0002]) and scores[4:] == pytest.approx([0.7, 0.3])
    assert info["iter/judge_auroc"] == 1.0 and info["iter/guarded"] == 0.0
    scores, info = source._with_labels(samples, good[::-1].copy())  # upside down: guarded
    assert info["iter/guarded"] == 1.0 and np.isnan(scores[4:]).all() and not np.isnan(scores[:4]).any()


def test_the_judging_warm_up_reads_only_labelled_prompts():
    from pipelines.stages.judge import labelled_prompts

    train = pa.table({"prompt": ["a", "b", "c", "d"], "labelled": [False, True, False, True]})
    assert labelled_prompts(train, 10).column("prompt").to_pylist() == ["b", "d"]
    assert labelled_prompts(train, 1).column("prompt").to_pylist() == ["b"]
    assert labelled_prompts(train.drop_columns(["labelled"]), 3).num_rows == 3  # every prompt labelled
    with pytest.raises(RuntimeError, match="labels none"):
        labelled_prompts(train.filter(pa.array([True, False, True, False])), 10)



@pytest.mark.parametrize("kind, asked", [("own", {"greedy": True}), ("own_samples", {"n": 3}), ("distill", {"n": 3})])
def test_the_warm_ups_task_share_rehearses_greedy_or_sampled_answers(kind, asked):
    """`own` asks the generators for one greedy answer a prompt, `own_samples` (and `distill`) for
    `judge.warmup_task_samples` sampled ones (which keep the policy's distribution); empty answers
    are left out of the SFT rows; `distill` marks its rows for the SFT objective's KL."""
    import asyncio
    from types import SimpleNamespace

    from pipelines.stages.judge import task_rows

    calls = []

    class Generators:
        async def call(self, method, chunk, **kwargs):
            calls.append((method, {k: v for k, v in kwargs.items() if k in ("greedy", "n")}))
            n = kwargs.get("n", 1)
            prompts = [p for p in chunk.column("prompt").to_pylist() for _ in range(n)]
            answers = [f"{p}:{i}" if p != "b" else "" for p in chunk.column("prompt").to_pylist() for i in range(n)]

            async def table():
                return pa.table({"prompt": prompts, "response": answers})
            return table(), {}

    train = pa.table({"prompt_id": ["p0", "p1", "p2"], "prompt": ["a", "b", "c"], "answer": ["x", "y", "z"]})
    ctx = SimpleNamespace(prompts=SimpleNamespace(train=train), pools={"generator": Generators()},
                          split=lambda table, pieces: [table])
    rows = asyncio.run(task_rows(ctx, kind, samples=3))
    assert calls == [("generate", asked)]
    n = asked.get("n", 1)
    assert rows.column("prompt").to_pylist() == ["a"] * n + ["c"] * n  # prompt b's answers were empty
    assert rows.column("answer").to_pylist() == [f"{p}:{i}" for p in "ac" for i in range(n)]
    assert (rows.column("distill").to_pylist() == [True] * 2 * n) if kind == "distill" else \
        "distill" not in rows.schema.names
    assert asyncio.run(task_rows(ctx, "answers")).column("answer").to_pylist() == ["x", "y", "z"]

# ---- the shipped recipes' guard (issue 32: Cooper as first shipped took a policy from 0.63 to 0.17) ----

SHIPPED = {"spark": "judge", "spc": "critic", "laser": "self", "cooper": "rm", "self_judged_grpo": "judge"}


@pytest.mark.parametrize("recipe", sorted(SHIPPED))
def test_a_shipped_recipe_trains_on_its_labels_alone_while_its_judge_is_at_chance(recipe, scored):
    """Each shipped self-judging or co-evolving recipe, as shipped, takes a judge (or reward model) at
    chance on the labelled rows out of the advantage: its advantages are those of the batch without
    the judge's column, not those the judge's scores would give."""
    config = load_config(recipe)
    learned, label = SHIPPED[recipe], config.accuracy_source()
    groups = B.group_index(scored)
    labelled = groups < 2  # half the groups: labels 1, 0, 1, 0 with judge scores 0.8, 0.8, 0.2, 0.2
    k = np.array([int((groups[:i] == g).sum()) for i, g in enumerate(groups)]) % 4  # the row's place in its group
    labels = np.where(labelled, (k % 2 == 0).astype(float), np.nan)
    scores = np.where(labelled, np.where(k < 2, 0.8, 0.2), np.array([0.9, 0.1, 0.6, 0.3])[k])
    table = scored.drop_columns([c for c in scored.schema.names if c.startswith(B.REWARD_PREFIX)])
    table = table.append_column(B.REWARD_PREFIX + label, pa.array(labels, pa.float32(), mask=np.isnan(labels)))
    judged_ = table.append_column(B.REWARD_PREFIX + learned, pa.array(scores, pa.float32()))
    without = table.append_column(B.REWARD_PREFIX + learned, pa.nulls(table.num_rows, pa.float32()))
    if recipe == "laser":  # its reward is beta * (log pi(z | x, y) - c), from the generators' column
        judged_ = judged_.append_column("laser_logprob", pa.array(np.log(scores), pa.float32()))
        without = without.append_column("laser_logprob", pa.array(np.full(table.num_rows, np.nan), pa.float32()))

    def advantages(credit, batch):
        out, metrics = credit.apply(batch)
        return np.concatenate([np.asarray(a, np.float32) for a in out.column("advantages").to_pylist()]), metrics

    credit = lambda cfg: RECIPES.get(cfg.recipe).credit(cfg, Sources())  # noqa: E731
    shipped = credit(config)
    for _ in range(config.judge_credit.window):  # the window fills with the judge's labelled rows
        got, metrics = advantages(shipped, judged_)
    assert metrics[f"learned/{learned}/auroc"] == pytest.approx(0.5) and metrics[f"learned/{learned}/guard"] == 1.0
    labels_only, _ = advantages(credit(config), without)
    judge_on, _ = advantages(credit(load_config(recipe, ["judge_credit.min_auroc=null"])), judged_)
    assert got == pytest.approx(labels_only)
    assert not np.allclose(judge_on, labels_only)  # the judge at chance would have moved the policy


def test_shipped_self_rewarding_drops_its_judge_at_chance_from_an_iterations_pairs():
    from pipelines.self_rewarding import IterationSource

    class Ctx:
        config = load_config("self_rewarding")

    assert Ctx.config.iterations.labels and Ctx.config.judge_credit.min_auroc is not None
    source = IterationSource.__new__(IterationSource)
    source.ctx = Ctx()
    label = Ctx.config.accuracy_source()
    samples = pa.table({B.REWARD_PREFIX + label: pa.array([1, 0, 1, 0, None, None], pa.float32())})
    scores, info = source._with_labels(samples, np.array([0.8, 0.8, 0.2, 0.2, 0.9, 0.1]))  # at chance
    assert info["iter/guarded"] == 1.0 and np.isnan(scores[4:]).all()  # the unlabelled prompts give no pairs


def test_a_distilled_warm_up_is_refused_under_fsdp2():
    from orchestrator.config import load_config

    with pytest.raises(ValueError, match="distill.*fsdp2"):
        load_config("self_judged_grpo", ["judge.warmup_task=distill", "judge.warmup_steps=5",
                                         "learner.strategy=fsdp2"])


def test_the_judges_examples_come_from_warmup_samples_answers_a_labelled_prompt():
    """`judge.warmup_samples` asks the generators for that many answers to each labelled prompt (the
    rollout's group size where unset), each scored by the verifier; the warm-up's cache key carries it
    only where it is set, so warm-ups cached before it existed are still found."""
    import asyncio
    from types import SimpleNamespace

    from orchestrator.evaluation import labelled_samples
    from pipelines.stages.judge import cache_path

    asked = []

    class Pool:
        async def call(self, method, table, **kwargs):
            asked.append((method, kwargs.get("n")))

            async def out():
                if method == "score":  # the generators' output, a reference in a run
                    return await table
                n = kwargs.get("n") or 8
                return pa.table({"prompt": [p for p in table.column("prompt").to_pylist() for _ in range(n)]})
            return out(), {}

    ctx = SimpleNamespace(pools={"generator": Pool(), "verifier": Pool()}, split=lambda table, pieces: [table])
    prompts = pa.table({"prompt_id": ["p0", "p1"], "prompt": ["a", "b"]})
    assert asyncio.run(labelled_samples(ctx, prompts, -1000, 32)).num_rows == 64
    assert asyncio.run(labelled_samples(ctx, prompts, -1000)).num_rows == 16
    assert asked == [("generate", 32), ("score", None), ("generate", None), ("score", None)]

    from pipelines.stages import judge as stage

    judged = ["rewards=[{name: correct, fn: integer_match}, {name: judge, judge: true, weight: 0}]",
              "judge.warmup_steps=10"]
    keyed = lambda overrides: stage.cache_path(load_config("self_judged_grpo", overrides), None)  # noqa: E731
    original, stage.stage_path = stage.stage_path, lambda config, kind, source, label, extra: extra["judge"]
    try:
        unset, set32 = keyed(judged), keyed([*judged, "judge.warmup_samples=32"])
    finally:
        stage.stage_path = original
    assert "warmup_samples" not in unset and set32["warmup_samples"] == 32
    assert {k: v for k, v in set32.items() if k != "warmup_samples"} == unset


def test_weighted_vote_is_an_answers_share_times_its_verdict():
    """Probabilities: the sum of the verdicts on the group's responses giving the same answer over
    the group's size; unbounded scores: their mean plus the log of the share. A null value stays
    null and is not counted; a response with no answer is an answer of its own."""
    values = np.array([0.9, 0.7, 0.2, 0.6, np.nan, 0.8, 0.3])
    groups = np.array([0, 0, 0, 0, 0, 1, 1])
    answers = ["12", "12", "21", None, "12", "x", None]
    out = weighted_vote(values, groups, answers, bounded=True)
    assert out[:4] == pytest.approx([0.4, 0.4, 0.05, 0.15]) and np.isnan(out[4])
    assert out[5:] == pytest.approx([0.4, 0.15])
    scores = weighted_vote(np.array([1.0, 3.0, -2.0]), np.zeros(3, int), ["a", "a", "b"], bounded=False)
    assert scores == pytest.approx([2 + np.log(2 / 3)] * 2 + [-2 + np.log(1 / 3)])
    lone = weighted_vote(np.array([0.3, 0.9]), np.array([0, 1]), [None, None], bounded=True)
    assert lone == pytest.approx([0.3, 0.9])  # a group of one: its own verdict


def test_a_weighted_vote_ranks_the_groups_common_answer_above_a_lone_one_the_judge_prefers():
    """Six of eight samples give one answer the judge scores 0.6, two give others it scores 0.7:
    voted, the common answer leads, and the guard's window, the calibration and `pairs_ordered`
    read the voted values."""
    responses = ["123"] * 6 + ["132", "213"]
    labels = [1.0] * 6 + [0.0, 0.0]
    table = judged([0.6] * 6 + [0.7, 0.7], labels, groups=[0] * 8).append_column("response", pa.array(responses))
    plain = LearnedRewards(credit_config())
    plain(table)
    assert plain.metrics()["learned/judge/pairs_ordered"] == 0.0
    part = LearnedRewards(credit_config("judge_credit.weighted_vote=text"))
    out = part(table).column("reward.judge").to_numpy(zero_copy_only=False)
    assert out == pytest.approx([0.45] * 6 + [0.0875] * 2)
    assert part.metrics()["learned/judge/pairs_ordered"] == 1.0
    assert part.history["judge"][-1][0] == pytest.approx([0.45, 1.0])  # the window holds voted values


def test_weighted_vote_names_its_answer_kinds():
    assert credit_config("judge_credit.weighted_vote=int").judge_credit.active
    with pytest.raises(ConfigError, match="weighted_vote"):
        credit_config("judge_credit.weighted_vote=words")
