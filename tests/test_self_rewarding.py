"""Self-rewarding pieces: the judge (parse failures are nulls with a reason), CREAM's consistency,
and the recipes end to end, small: self_rewarding resumed in the middle of an iteration continues
that iteration; LaSeR's self-reward reaches the learner; Co-Reward's paired prompts stay paired
(on the self-judged GRPO run)."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pyarrow as pa
import pytest

from actors.judging import parse_scores, render, single_token, yes_probability
from actors.learner import Learner
from coevo_cli import coevo, read_metrics, small
from orchestrator.config import ConfigError, load_config
from pipelines.self_rewarding import kendall_consistency
from test_learner import make_config
from test_learner import config, prompts, reward_fn, scored  # noqa: F401  (fixtures shared with test_learner)


def test_a_judgment_without_a_score_is_null_with_a_reason():
    assert parse_scores(["score: 7", "8/10", "none"], r"\d+", 10) == (pytest.approx(0.75), None)
    value, why = parse_scores(["great answer", "hmm"], r"\d+", 10)
    assert value is None and "no score" in why and "2 judgments" in why


def test_the_generator_judges_and_reports_unparseable_judgments():
    from orchestrator.config import validate_config
    from orchestrator.data import arithmetic
    from rl_step import generator

    tiny = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}
    cfg = validate_config({"model": {"tiny": tiny}, "train": {"threads": 1},
                           "rollout": {"samples_per_prompt": 2, "max_new_tokens": 3},
                           "rewards": [{"name": "self", "judge": True}, {"name": "integer_match", "weight": 0}],
                           "judge": {"mode": "sampled", "samples": 2, "pattern": "NEVER-MATCHES"}})
    gen = generator(cfg)
    table, _ = gen.generate(arithmetic(1, ["+"], 10, 0).train.slice(0, 2), seq=0)
    judged, info = gen.judge(table)
    assert judged.column("reward.self").null_count == 4 and info["errors/self"] == 4
    assert all("no score matching" in e for e in judged.column("reward_error.self").to_pylist())
    yes_prob = validate_config({**cfg.model_dump(), "judge": {"mode": "yes_prob"}})
    judged, _ = generator(yes_prob).judge(table)
    scores = judged.column("reward.self").to_numpy()
    assert ((scores > 0) & (scores < 1)).all() and judged.column("judge_version").to_pylist() == [0] * 4


def test_cream_consistency_is_kendalls_tau_in_zero_one():
    a = np.array([0.9, 0.5, 0.1])
    assert kendall_consistency(a, a) == 1.0
    assert kendall_consistency(a, -a) == 0.0
    assert kendall_consistency(a, np.array([0.5, 0.5, 0.5])) == 0.5  # no comparable pair


def test_the_shipped_self_rewarding_recipe_adds_iterative_rpos_nll():
    """pipelines/self_rewarding.yaml ships Iterative RPO's NLL on the chosen responses at the paper's
    weight (with DPO alone one shipped seed ended below its start; docs/recipes.md)."""
    config = load_config("self_rewarding")
    assert config.iterations.nll_weight == 1.0 and config.iterations.loss == "dpo"


def test_the_preference_step_also_trains_the_judge_on_labelled_samples(reward_fn, scored) -> None:  # noqa: F811
    """iterations.judge_coef: the self_judge objective rides the preference step on the iteration's
    labelled samples: its loss is the verdict's cross-entropy on them, with the model of the step."""
    config = make_config(reward_fn)
    learner = Learner(config, objectives=["preference", {"name": "self_judge", "per_update": 1000, "coef": 0.5}])
    learner.snapshot_reference()
    prompts, responses = scored.column("prompt").to_pylist(), scored.column("response").to_pylist()
    pairs = pa.table({"prompt": prompts[:2], "chosen": responses[:2], "rejected": responses[2:4]})
    tok = learner.tokenizer
    texts = [render("{prompt}{response}?", p, r) for p, r in zip(prompts, responses)]
    p_yes = yes_probability(learner.model, tok, texts, single_token(tok, "Y", "y"), single_token(tok, "N", "n"), "cpu")
    ok = np.array(scored.column("reward.varied").to_pylist()) >= 0.5
    metrics = learner.train_preference(pairs, examples=scored.select(["prompt", "response", "reward.varied"]))
    expected = float(np.mean(-np.log(np.where(ok, p_yes, 1 - p_yes))))
    assert metrics["self_judge/loss"] == pytest.approx(expected, rel=1e-4)
    assert metrics["self_judge/examples"] == scored.num_rows and metrics["version"] == 1
    assert "self_judge/loss" not in learner.train_preference(pairs)  # no samples: the preference loss alone


def test_judge_coef_needs_the_labels_and_the_policy_as_judge():
    with pytest.raises(ConfigError, match="iterations.judge_coef=0.1 trains the judge on the iteration's "
                       "verifier-labelled samples; iterations.labels is false"):
        load_config("self_rewarding", ["iterations.judge_coef=0.1", "iterations.labels=false"])
    with pytest.raises(ConfigError, match="iterations.judge_coef=0.1 trains the policy as its own judge; with "
                       "judge.separate=true a model apart judges"):
        load_config("self_rewarding", ["iterations.judge_coef=0.1", "judge.separate=true"])


@pytest.mark.slow
@pytest.mark.long  # ~1 min: the main suite stays near 15 minutes; CI's long stage runs it
def test_self_rewarding_resumes_inside_an_iteration(ray_env, warm_cache, tmp_path) -> None:
    run_dir = tmp_path / "sr"
    args = small(warm_cache, "recipe=self_rewarding", "rewards=[{name: judge, judge: true}, "
                 "{name: correct, fn: integer_match, weight: 0}]", "verifier.accuracy_source=correct",
                 "iterations.iterations=2", "iterations.prompts=32", "iterations.epochs=2",
                 "iterations.batch_pairs=2", "iterations.cream=weight", "train.eval_every=3",
                 # the judge loss on the labelled half's samples, checkpointed with the pairs
                 "verifier.fraction=0.5", "iterations.labels=true", "iterations.judge_coef=0.5",
                 # diverse samples, so most prompts make a pair (identical responses tie)
                 "rollout.samples_per_prompt=8", "rollout.temperature=2.0")
    out = coevo([*args, "train.max_steps=3", "--output-dir", str(run_dir)], ray_env, tmp_path)
    assert "iteration 0:" in out
    state = json.loads((run_dir / "checkpoints" / "final" / "loop_state.json").read_text())["rollouts"]
    assert state["phase"] == "train" and state["iteration"] == 0
    assert sorted(state["tables_index"]) == ["examples", "pairs"]
    first = read_metrics(run_dir)
    out = coevo(["--resume", "--output-dir", str(run_dir), "train.max_steps=200"], ray_env, tmp_path)
    assert "iteration 0:" not in out and "iteration 1:" in out  # iteration 0's pairs were restored
    rows = read_metrics(run_dir)
    assert rows[:3] == first and [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    assert rows[3]["iter/index"] == 0 and rows[-1]["iter/index"] == 1
    assert rows[3]["iter/pairs"] == first[-1]["iter/pairs"]
    assert all(r["pref/loss"] > 0 for r in rows) and rows[-1]["version"] == len(rows)
    assert all(r["self_judge/examples"] > 0 for r in rows)  # the restored iteration's samples too
    assert (run_dir / "iterations" / "iter_1" / "config.json").is_file()
    assert any("eval/judge_auroc" in r for r in rows)
    # the iterations end the run before max_steps, between evaluations: its last step is evaluated
    assert len(rows) % 3 and "eval/accuracy" in rows[-1]


@pytest.mark.slow
@pytest.mark.long  # ~1 min: the main suite stays near 15 minutes; CI's long stage runs it
def test_laser_self_reward(ray_env, warm_cache, tmp_path) -> None:
    laser = tmp_path / "laser"
    laser_args = ["recipe=laser", "rewards=[{name: correct, fn: integer_match}, {name: self, laser: true, weight: 0}]",
                  "aggregate={fill: {correct: self}}", "verifier.fraction=0.5", "verifier.accuracy_source=correct",
                  "laser.eval_prompts=16", "laser.warmup_steps=4", "laser.warmup_resample=2", "laser.warmup_pairs=4",
                  "laser.balance=true", "rollout.temperature=2.0", "train.eval_every=3"]
    coevo(small(warm_cache, *laser_args, "train.max_steps=3", "train.dump_rollouts=true", "--output-dir", str(laser)),
          ray_env, tmp_path)
    rows = read_metrics(laser)
    assert all(r["train/laser_mse"] > 0 and r["train/laser_c"] < 0 for r in rows)
    summary = json.loads((laser / "summary.json").read_text())
    assert summary["laser_warmup/steps"] == 4 and summary["laser_warmup/pairs_min"] > 0
    assert "laser_warmup/self_reward_auroc_after" in summary and "laser_warmup/accuracy_after" in summary
    # RL keeps the offset c that r was aligned with in the warm-up, also when the warm-up is cached
    assert rows[0]["train/laser_c"] == pytest.approx(summary["laser_warmup/c"])
    # The SFT warm-up re-made (its cache entry lost) but the self-verification warm-up cached: the
    # run must train the cached aligned model, not the pools that hold the fresh SFT weights.
    for marker in warm_cache.glob("*/warmup.json"):
        marker.rename(marker.with_suffix(".bak"))
    try:
        again = tmp_path / "laser_again"
        out = coevo(small(warm_cache, *laser_args, "train.max_steps=1", "--output-dir", str(again)), ray_env, tmp_path)
    finally:
        for marker in warm_cache.glob("*/warmup.bak"):
            marker.rename(marker.with_suffix(".json"))
    assert "warm-up: using cached model" not in out.split("self-verification")[0]  # the SFT warm-up ran
    assert "self-verification warm-up: using cached model" in out
    assert read_metrics(again)[0]["train/laser_c"] == pytest.approx(summary["laser_warmup/c"])
    assert 0 < rows[0]["reward/correct/filled_frac"] < 1
    for key in ("eval/self_reward_auroc", "eval/best_of_8_accuracy", "eval/random_pick_accuracy",
                "eval/self_reward_pairs_ordered"):
        assert key in rows[-1]
    ordered = rows[-1]["eval/self_reward_pairs_ordered"]
    assert ordered is None or 0 <= ordered <= 1
    import pandas as pd

    dump = pd.read_parquet(laser / "rollouts" / "step_1.parquet")
    unlabelled = dump["reward.correct"].isna()
    assert unlabelled.any() and dump["laser_logprob"].notna().all()
    # the reward of an unlabelled sample is its self-reward
    assert np.allclose(dump.loc[unlabelled, "reward"], dump.loc[unlabelled, "reward.self"], atol=1e-6)


@pytest.mark.slow
def test_self_judged_grpo_reports_judge_quality_on_a_loopback_cluster(ray_env, warm_cache, tmp_path) -> None:
    """GRPO whose reward is the policy's own judgment reports how good the judge is, and flags
    hacking between evaluations. Run without the loopback switch in the environment: the embedded
    cluster binds to 127.0.0.1 by itself. The same run logs Co-Reward (weight 0) over commuted
    question pairs: the paired prompts stay paired. Its judging warm-up distils the task share
    (`judge.warmup_task=distill`: the learner holds a frozen teacher for it, then lets it go), its
    judge examples from 3 answers to each labelled prompt (`judge.warmup_samples`)."""
    env = {k: v for k, v in ray_env.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    run_dir = tmp_path / "run"
    out = coevo(small(warm_cache, "rewards=[{name: judge, judge: true}, {name: correct, fn: integer_match, weight: 0}, "
                      "{name: co, fn: co_reward, group_by: pair_id, weight: 0}]", "data.analogs=commuted",
                      "verifier.accuracy_source=correct", "algorithm.advantage=dr_grpo", "train.max_steps=4",
                      "judge.warmup_steps=4", "judge.warmup_resample=2", "judge.warmup_batch_size=8",
                      "judge.warmup_task=distill", "judge.warmup_task_samples=2", "judge.warmup_samples=3",
                      "train.eval_every=2", "train.dump_rollouts=true", "--output-dir", str(run_dir)), env, tmp_path)
    assert "started a local Ray cluster (2 CPUs, 127.0.0.1:" in out
    assert "judging warm-up 2: loss" in out and "judging warm-up 4: loss" in out  # re-drawn once
    drawn = re.search(r"judge examples from (\d+) answers to (\d+) labelled prompts", out)
    assert drawn and int(drawn[1]) == 3 * int(drawn[2])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["judge_warmup/steps"] == 4 and "judge_warmup/auroc_own_samples" in summary
    evals = [r for r in read_metrics(run_dir) if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [2, 4]
    assert all(0 <= r["eval/judge_score"] <= 1 and "eval/judge_auroc" in r for r in evals)
    assert "eval/hacking" not in evals[0] and evals[1]["eval/hacking"] in (0.0, 1.0)
    rows = read_metrics(run_dir)
    assert all(r["samples/lost"] == 0 for r in rows) and all(r["reward/co/errors"] == 0 for r in rows)
    import pandas as pd

    dump = pd.read_parquet(run_dir / "rollouts" / "step_2.parquet")
    twins = dump.groupby("pair_id")["prompt_id"].nunique()
    assert (twins == 2).any()  # a question and its twin were sampled and scored together


def test_rank_quality_orders_within_prompts_and_reranks() -> None:
    """Two prompts of 3 samples: scores order prompt 0's pairs 1 of 2 right and prompt 1's 2 of 2;
    best-of-3 picks a wrong sample for prompt 0 and a right one for prompt 1."""
    from orchestrator.evaluation import rank_quality

    scores = np.array([0.9, 0.5, 0.1, 0.2, 0.8, 0.7])
    correct = np.array([False, True, False, False, True, True])
    q = rank_quality(scores, correct, np.array([0, 0, 0, 1, 1, 1]))
    assert q["pairs"] == 4 and q["pairs_ordered"] == pytest.approx(3 / 4)
    assert q["best_of_n"] == pytest.approx(0.5) and q["random_pick"] == pytest.approx((1 / 3 + 2 / 3) / 2)
    assert rank_quality(scores, np.ones(6, bool), np.zeros(6, int))["pairs_ordered"] is None


@pytest.mark.slow
def test_sigterm_during_the_self_verification_warm_up_stops_it_within_seconds(ray_env, warm_cache, tmp_path) -> None:
    """`ray job stop` sends SIGTERM: a warm-up stage is cancelled where it waits (here inside a block
    of 5000 steps, which would otherwise finish first), the run exits at once, and the SFT warm-up
    that finished before it stays cached."""
    import signal
    import threading
    import time

    from coevo_cli import start, wait_for

    args = small(warm_cache, "recipe=laser", "rewards=[{name: correct, fn: integer_match}, "
                 "{name: self, laser: true, weight: 0}]", "aggregate={fill: {correct: self}}",
                 "verifier.fraction=0.5", "verifier.accuracy_source=correct", "laser.eval_prompts=8",
                 "laser.warmup_steps=5000", "laser.warmup_resample=5000", "laser.warmup_pairs=4",
                 "rollout.temperature=2.0", "--output-dir", str(tmp_path / "run"))
    proc = start(args, ray_env, tmp_path)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        wait_for(lambda: any(line.startswith("self-verification warm-up 25:") for line in lines), 240,
                 "the warm-up's first progress line", proc)
        assert any("self-verification warm-up: 5000 steps (laser.warmup_steps)" in line for line in lines)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        stopped_in = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    reader.join(timeout=10)
    out = "".join(lines)
    assert proc.returncode == 128 + signal.SIGTERM, out[-4000:]
    assert "stopped by SIGTERM during the self-verification warm-up, at step" in out
    assert "the warm-up stages that finished before it are cached" in out
    assert stopped_in < 30, (stopped_in, out[-3000:])  # Ray's shutdown included; the block had ~5000 steps to go
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert "[" in next(line for line in lines if line.startswith("self-verification warm-up 25:"))  # its estimate


@pytest.mark.slow
def test_a_self_verification_warm_up_without_pairs_says_what_to_change(ray_env, warm_cache, tmp_path) -> None:
    """Near-greedy sampling gives every prompt eight copies of one answer: no (correct, wrong) pair."""
    out = coevo(small(warm_cache, "recipe=laser", "rewards=[{name: correct, fn: integer_match}, "
                      "{name: self, laser: true, weight: 0}]", "aggregate={fill: {correct: self}}",
                      "verifier.accuracy_source=correct", "laser.eval_prompts=8", "laser.warmup_steps=4",
                      "rollout.temperature=0.01", "--output-dir", str(tmp_path / "run")), ray_env, tmp_path, expect=1)
    assert "none of" in out and "labelled training prompts has both a correct and a wrong sample" in out
    assert "laser.warmup_steps=0" in out and ("rollout.temperature" in out or "warmup.target_accuracy" in out)
