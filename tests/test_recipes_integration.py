"""The co-evolving recipes end to end, small: `reward_model` from a file of pairs (its checkpoint
loads with transformers), a saved reward model as a reward source of GRPO (whose checkpoint holds
that frozen model and the KL reference: a resume needs neither's source), `cooper` (two learners,
two weight channels, one reward-model version per batch) and `prime` (dense token rewards)."""

from __future__ import annotations

import json

import pytest

from coevo_cli import coevo, read_metrics, small


def write_pairs(path, n: int) -> None:
    """Correct sums preferred over sums that are one off: a task a reward model can learn."""
    with path.open("w") as f:
        for i in range(n):
            a, b = i % 10, (i * 7) % 10
            f.write(json.dumps({"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1 + i % 3)}) + "\n")


@pytest.mark.slow
@pytest.mark.long  # ~1 min: the main suite stays near 15 minutes; CI's long stage runs it
def test_reward_model_from_pairs_then_as_a_reward_source(ray_env, warm_cache, tmp_path) -> None:
    write_pairs(tmp_path / "pairs.jsonl", 300)
    rm_dir = tmp_path / "rm"
    coevo(small(warm_cache, "recipe=reward_model", "reward_model.pairs_path=pairs.jsonl", "reward_model.eval_pairs=60",
                "reward_model.batch_pairs=32", "reward_model.lr=1e-3", "train.max_steps=16", "train.eval_every=8",
                "--output-dir", str(rm_dir)), ray_env, tmp_path)
    rows = read_metrics(rm_dir)
    assert [r["step"] for r in rows if "eval/pair_accuracy" in r] == [8, 16]
    assert all(r["rm/version"] == r["step"] for r in rows)
    # 240 training pairs in batches of 32: each epoch is 7 full batches and a short one, every pair once
    assert [r["rm/pairs"] for r in rows] == ([32] * 7 + [16]) * 2
    assert rows[-1]["rm/loss"] < rows[0]["rm/loss"]
    assert rows[-1]["eval/pair_accuracy"] > 0.6 and rows[-1]["eval/pairs"] == 60

    # the checkpoint is a transformers sequence classifier with one score
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    final = rm_dir / "checkpoints" / "final" / "rm_learner"
    model, tok = AutoModelForSequenceClassification.from_pretrained(final), AutoTokenizer.from_pretrained(final)
    with torch.no_grad():
        logits = model(**tok(["3+4=7", "3+4=8"], return_tensors="pt", add_special_tokens=False)).logits
    assert logits.shape == (2, 1) and torch.isfinite(logits).all()

    # ... and a reward source of any recipe, beside a verifier (with a KL reference, so that the
    # checkpoint holds both kinds of frozen model, below)
    run_dir = tmp_path / "grpo"
    coevo(small(warm_cache, f"rewards=[{{name: rm, model: '{final}'}}, {{name: correct, fn: integer_match, weight: 0}}]",
                "algorithm.kl_coef=0.01", "train.checkpoint_every=1", "train.max_steps=2", "train.eval_every=2",
                "train.dump_rollouts=true", "--output-dir", str(run_dir)), ray_env, tmp_path)
    import pandas as pd

    dump = pd.read_parquet(run_dir / "rollouts" / "step_2.parquet")
    assert dump["reward.rm"].notna().all() and dump["reward.correct"].notna().all()
    assert (dump["reward"] - dump["reward.rm"]).abs().max() < 1e-5  # the verifier only logs (weight 0)
    assert dump["reward_model_version"].eq(0).all()  # a frozen reward model stays at version 0
    last = read_metrics(run_dir)[-1]
    assert "eval/accuracy" in last
    # the frozen reward model is measured on the held-out greedy responses, as a judge would be
    assert isinstance(last["eval/reward_model_score"], float) and "eval/reward_model_auroc" in last
    resume_needs_no_cache(run_dir, rm_dir, ray_env, tmp_path)


def resume_needs_no_cache(run_dir, rm_dir, ray_env, tmp_path) -> None:
    """The frozen reward model and the KL reference live in the checkpoint (hard links, not copies):
    a resume needs neither the reward model's own directory (a cache another run may delete) nor the
    run's copies."""
    import os
    import shutil

    from transformers import AutoConfig

    final = run_dir / "checkpoints" / "final"
    assert AutoConfig.from_pretrained(final / "frozen" / "reward_models" / "rm") is not None
    assert AutoConfig.from_pretrained(final / "references" / "policy_learner") is not None
    weights = next((final / "frozen" / "reward_models" / "rm").glob("*.safetensors"))
    assert os.stat(weights).st_ino == os.stat(run_dir / "frozen" / "reward_models" / "rm" / weights.name).st_ino
    shutil.rmtree(rm_dir)
    shutil.rmtree(run_dir / "frozen")  # and the run's own copies: the checkpoint alone must do
    shutil.rmtree(run_dir / "policy_learner_reference")
    out = coevo(["--resume", "--output-dir", str(run_dir), "train.max_steps=3"], ray_env, tmp_path)
    assert "from final" in out
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3]
    final = run_dir / "checkpoints" / "final"  # the resumed run's checkpoints are complete too
    assert (final / "frozen" / "reward_models" / "rm" / "config.json").is_file()
    assert (final / "references" / "policy_learner" / "config.json").is_file()


@pytest.mark.slow
@pytest.mark.long  # ~1 min: the main suite stays near 15 minutes; CI's long stage runs it
def test_cooper_trains_both_models_one_reward_model_version_per_batch(ray_env, warm_cache, tmp_path) -> None:
    run_dir = tmp_path / "cooper"
    coevo(small(warm_cache, "recipe=cooper", "rewards=[{name: rm, model: auto}, {name: correct, fn: integer_match, weight: 0}]",
                "verifier.fraction=0.5", "verifier.accuracy_source=correct", "reward_model.warmup_steps=2",
                "rollout.temperature=2.0",  # the warm model is near-perfect on one digit: sample wrong answers too
                "reward_model.batch_pairs=16", "reward_model.pairs_per_group=2", "train.max_steps=5",
                "train.eval_every=5", "train.dump_rollouts=true", "--output-dir", str(run_dir)),
          ray_env, tmp_path, timeout=400)
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    import pandas as pd

    rm_versions = []
    for step in range(1, 6):
        dump = pd.read_parquet(run_dir / "rollouts" / f"step_{step}.parquet")
        versions = dump["reward_model_version"].unique()
        assert len(versions) == 1, f"step {step} mixes reward-model versions {versions}"
        rm_versions.append(int(versions[0]))
        assert dump["policy_version"].eq(step - 1).all()  # strict on-policy
        # the verifier labels only the sampled half of the prompts: the others carry no label, no error
        labelled = dump["reward.correct"].notna()
        assert dump.loc[~labelled, "reward_error.correct"].isna().all()
        assert dump.groupby("group_id")["reward.correct"].apply(lambda s: s.isna().all() or s.notna().all()).all()
    # each step's batch is scored by the reward model the previous step published
    assert rm_versions == [0] + [r["rm/version"] for r in rows[:-1]]
    assert rows[-1]["rm/version"] >= 1 and rows[-1]["channel/reward_model/version"] == rows[-1]["rm/version"]
    assert all(r["channel/reward_model/lag"] == 0 and r["channel/policy/lag"] == 0 for r in rows)
    for key in ("rm/batch_pair_accuracy", "rm/pairs", "role/rm_learner/busy_frac", "role/reward_model/busy_frac",
                "reward/rm/mean", "reward/correct/mean"):
        assert any(r.get(key) is not None for r in rows), key
    assert isinstance(rows[-1]["eval/reward_model_score"], float) and "eval/reward_model_auroc" in rows[-1]
    final = run_dir / "checkpoints" / "final"
    assert (final / "policy_learner" / "config.json").is_file() and (final / "rm_learner" / "config.json").is_file()


@pytest.mark.slow
def test_prime_dense_rewards_reach_the_advantages(ray_env, warm_cache, tmp_path) -> None:
    run_dir = tmp_path / "prime"
    coevo(small(warm_cache, "recipe=prime", "algorithm.advantage=rloo", "train.max_steps=3", "train.eval_every=3",
                "train.dump_rollouts=true", "--output-dir", str(run_dir)), ray_env, tmp_path, timeout=300)
    rows = read_metrics(run_dir)
    assert [r["prm/version"] for r in rows] == [1, 2, 3]
    assert all(r["prm/labelled"] == 32 and r["prm/loss"] > 0 for r in rows)
    import numpy as np
    import pandas as pd

    dump = pd.read_parquet(run_dir / "rollouts" / "step_3.parquet")
    assert all(len(t) == len(r) for t, r in zip(dump["token_rewards"], dump["response_ids"]))
    assert any(np.abs(t).max() > 0 for t in dump["token_rewards"] if len(t))
    assert (run_dir / "checkpoints" / "final" / "prm_learner" / "config.json").is_file()
    assert (run_dir / "prm_learner_reference" / "config.json").is_file()
