"""Probe prompts (verifier.probe_share, orchestrator/probes.py): a share of the labelled training
prompts no judge or reward model trains on, on which the guards and the calibration read a learned
reward's quality."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from actors import batch as B
from orchestrator.config import ConfigError, load_config
from orchestrator.data import DatasetError, load_prompts, with_probes
from orchestrator.judge_credit import LearnedRewards
from orchestrator.probes import hide_labels, trainable_labelled
from test_judge_credit import credit_config, judged


def test_probes_are_a_seeded_share_of_the_labelled_prompts():
    cfg = load_config("grpo_sorting")
    train = load_prompts(cfg.data, cfg.seed, 0.25, probe_share=0.2).train
    labelled = train.column("labelled").to_numpy(zero_copy_only=False)
    probe = train.column("probe").to_numpy(zero_copy_only=False)
    assert not (probe & ~labelled).any()  # only labelled prompts are probes
    assert 0.15 < probe.sum() / labelled.sum() < 0.25
    again = load_prompts(cfg.data, cfg.seed, 0.25, probe_share=0.2).train
    assert again.column("probe").to_pylist() == train.column("probe").to_pylist()
    assert "probe" not in load_prompts(cfg.data, cfg.seed, 0.25).train.schema.names  # none unless asked


def test_probes_need_one_labelled_prompt_on_each_side():
    train = pa.table({"prompt": ["a", "b", "c"], "labelled": [True, False, False]})
    with pytest.raises(DatasetError, match=r"verifier.probe_share=0.5 holds (0|1) of the 1 labelled"):
        with_probes(train, 0.5, 0)
    every = with_probes(pa.table({"prompt": [str(i) for i in range(200)]}), 0.3, 0)  # no labelled column
    assert 40 < sum(every.column("probe").to_pylist()) < 80


def test_no_judge_warm_up_reads_a_probe():
    from pipelines.stages.judge import labelled_prompts

    train = pa.table({"prompt": ["a", "b", "c", "d", "e"], "labelled": [False, True, True, True, False],
                      "probe": [False, True, False, False, False]})
    assert trainable_labelled(train).column("prompt").to_pylist() == ["c", "d"]
    assert labelled_prompts(train, 10).column("prompt").to_pylist() == ["c", "d"]


def test_the_learners_batch_hides_the_verifiers_labels_on_probe_rows_only():
    table = pa.table({"probe": [True, False, False, True], "labelled": [True, True, False, True],
                      "reward.correct": pa.array([1, 0, None, 0], pa.float32()),
                      "reward.judge": pa.array([0.9, 0.2, 0.6, 0.4], pa.float32()),
                      "reward": pa.array([1, 0, 0.6, 0], pa.float32())})
    hidden = hide_labels(table, ["correct"])
    assert hidden.column("reward.correct").to_pylist() == [None, 0.0, None, None]
    for kept in ("reward.judge", "reward", "probe"):  # the judge's values and the aggregated reward stay
        assert hidden.column(kept).equals(table.column(kept))
    assert hide_labels(table.drop_columns(["probe"]), ["correct"]).equals(table.drop_columns(["probe"]))


def test_the_guard_reads_the_judge_on_probes_not_on_the_prompts_it_learned():
    """A judge that ranks its training prompts' samples perfectly and the probes' at random: without
    probes the guard trusts it; with them it drops it, and says the two AUROCs apart."""
    rng = np.random.default_rng(0)
    labels = np.tile([1.0, 0.0], 40)
    probe = np.r_[np.zeros(40, bool), np.ones(40, bool)]
    scores = np.where(probe, rng.random(80), np.where(labels == 1, 0.9, 0.1))
    table = judged(scores, labels).append_column("probe", pa.array(probe))
    plain = LearnedRewards(credit_config("judge_credit.min_auroc=0.7", "judge_credit.window=1"))
    plain(table.drop_columns(["probe"]))
    assert plain.metrics()["learned/judge/guard"] == 0.0 and plain.metrics()["learned/judge/auroc"] > 0.7
    probed = LearnedRewards(credit_config("judge_credit.min_auroc=0.7", "judge_credit.window=1",
                                          "verifier.fraction=0.5", "verifier.probe_share=0.5"))
    out = probed(table)
    m = probed.metrics()
    assert m["learned/judge/guard"] == 1.0 and m["learned/judge/auroc"] < 0.7
    assert m["learned/judge/auroc_trained"] == 1.0 and m["learned/judge/probe_rows"] == 40
    assert out.column("reward.judge").null_count == 80  # dropped: the labels alone train the policy


def test_calibration_fits_the_probes():
    """Calibrated on the probes, where the judge is weaker, its values are less sure than fitted on
    the prompts it trained on."""
    rng = np.random.default_rng(1)
    labels = np.tile([1.0, 0.0], 100)
    probe = np.r_[np.zeros(100, bool), np.ones(100, bool)]
    noise = np.where(probe, 0.35, 0.05)
    scores = np.clip(np.where(labels == 1, 0.7, 0.3) + rng.normal(0, 1, 200) * noise, 0.01, 0.99)
    table = judged(scores, labels).append_column("probe", pa.array(probe))
    sure = LearnedRewards(credit_config("judge_credit.confidence=calibrated", "judge_credit.window=1"))
    probed = LearnedRewards(credit_config("judge_credit.confidence=calibrated", "judge_credit.window=1",
                                          "verifier.fraction=0.5", "verifier.probe_share=0.5"))
    spread = [np.abs(p(t).column("reward.judge").to_numpy(zero_copy_only=False) - 0.5).mean()
              for p, t in ((sure, table.drop_columns(["probe"])), (probed, table))]
    assert spread[1] < spread[0] - 0.1


def test_self_rewarding_guards_on_the_probes_and_its_judge_loss_skips_them():
    from pipelines.self_rewarding import IterationSource, labelled_rows

    class Ctx:
        config = load_config("self_rewarding", ["rewards=[{name: judge, judge: true}, {name: correct, fn: integer_match}]",
                                                "judge_credit.min_auroc=0.6", "verifier.fraction=0.5",
                                                "verifier.probe_share=0.5"])

    source = IterationSource.__new__(IterationSource)
    source.ctx = Ctx()
    samples = pa.table({"prompt": list("abcdefgh"), "response": list("12345678"),
                        "reward.correct": pa.array([1, 0, 1, 0, 1, 0, None, None], pa.float32()),
                        "probe": [False, False, False, False, True, True, False, False]})
    judge = np.array([0.9, 0.1, 0.8, 0.2, 0.1, 0.9, 0.7, 0.3])  # right on the trained rows, wrong on the probes
    scores, info = source._with_labels(samples, judge)
    assert info["iter/judge_auroc"] == 0.0 and info["iter/guarded"] == 1.0 and np.isnan(scores[6:]).all()
    assert labelled_rows(samples, "correct").column("prompt").to_pylist() == ["a", "b", "c", "d"]


@pytest.mark.parametrize("overrides, message", [
    (["verifier.fraction=0.25", "verifier.probe_share=0.2"], "no reward source is learned"),
    (["recipe=spark", "rewards=[{name: correct, fn: integer_match}, {name: judge, judge: true, weight: 0}]",
      "verifier.fraction=0.25", "verifier.select=distinct", "verifier.probe_share=0.2"], "use verifier.select=random"),
    (["recipe=spark", "verifier.probe_share=1"], "less than 1"),
])
def test_a_probe_share_without_a_learned_reward_or_with_labels_picked_later_is_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_the_warm_ups_cache_keys_change_with_probes_and_not_without():
    from pipelines.stages import judge, reward_model

    base = load_config("self_judged_grpo", ["verifier.fraction=0.25"])
    probed = load_config("self_judged_grpo", ["verifier.fraction=0.25", "verifier.probe_share=0.2"])
    zero = load_config("self_judged_grpo", ["verifier.fraction=0.25", "verifier.probe_share=0"])
    assert judge.cache_path(base, None) == judge.cache_path(zero, None) != judge.cache_path(probed, None)
    coop = load_config("cooper")
    assert reward_model.cache_path(coop) != reward_model.cache_path(load_config("cooper", ["verifier.probe_share=0.2"]))


@pytest.mark.slow
def test_a_run_trains_the_policy_on_probes_and_no_learner_sees_their_labels(ray_env, warm_cache, tmp_path):
    import pandas as pd

    from coevo_cli import coevo, read_metrics, small

    run_dir = tmp_path / "run"
    coevo(small(warm_cache, "recipe=spark", "rewards=[{name: correct, fn: integer_match}, {name: judge, judge: true, weight: 0}]",
                "aggregate.fill={correct: judge}", "judge.warmup_steps=0", "judge_credit.min_auroc=0.5",
                "verifier.fraction=0.5", "verifier.probe_share=0.5", "rollout.temperature=2.0",
                "train.max_steps=2", "train.eval_every=2", "train.dump_rollouts=true", "--output-dir", str(run_dir)),
          ray_env, tmp_path, timeout=300)
    assert len(read_metrics(run_dir)) == 2
    seen = 0
    for step in (1, 2):
        dump = pd.read_parquet(run_dir / "rollouts" / f"step_{step}.parquet")
        probe = dump["probe"].astype(bool)
        assert not (probe & ~dump["labelled"]).any()
        assert dump.loc[probe, "reward.correct"].isna().all()  # the learners never saw a probe's label
        assert dump.loc[dump["labelled"] & ~probe, "reward.correct"].notna().all()
        assert dump.loc[probe, "reward"].notna().all()  # its reward was the verifier's, before it was hidden
        seen += int(probe.sum())
    assert seen > 0
