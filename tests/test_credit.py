"""The credit step (orchestrator/credit.py): the columns it writes against the pure functions of
actors/algorithms, each recipe's declaration (GAE for ppo, PRIME's process weight), its state
through a checkpoint, and the policy learner training on the `advantages` column alone."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
import torch

from actors import batch as B
from actors.algorithms import ADVANTAGES
from actors.algorithms.advantages import gae_advantages, process_advantages
from actors.learner import Learner
from coevo_cli import coevo, read_metrics, small
from orchestrator.config import load_config
from orchestrator.credit import GAE, Credit
from orchestrator.recipes import RECIPES, Sources
from rl_step import credited
from test_learner import config, make_config, prompts, reward_fn, scored, weights  # noqa: F401  (fixtures)


def per_row(column: pa.ChunkedArray) -> list[np.ndarray]:
    return [np.asarray(v, np.float32) for v in column.to_pylist()]


def rewards_and_groups(table: pa.Table) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.from_numpy(table.column("reward").to_numpy().astype(np.float32)),
            torch.from_numpy(B.group_index(table)))


def test_the_outcome_advantage_is_on_every_response_token_with_the_reward_metrics(config, scored):
    table, metrics = credited(config, scored)
    rewards, groups = rewards_and_groups(table)
    assert np.array_equal(rewards.numpy(), scored.column("reward.varied").to_numpy())  # one source, weight 1
    expected = ADVANTAGES.get("grpo")(rewards, groups).numpy()
    for i, (adv, resp) in enumerate(zip(per_row(table.column("advantages")), table.column("response_ids").to_pylist())):
        assert len(adv) == len(resp) and np.all(adv == expected[i])
    assert table.column("uid").to_pylist() == scored.column("uid").to_pylist()  # rows in order, none lost
    assert metrics["reward/mean"] == pytest.approx(float(rewards.double().mean()))
    assert metrics["reward/varied/mean"] == pytest.approx(metrics["reward/mean"])
    assert metrics["train/advantage_abs_mean"] == pytest.approx(float(np.abs(expected).mean()))
    assert 0 <= metrics["samples/uniform_reward_groups_frac"] < 1
    B.validate(table)  # the contract holds the new columns


def test_recipe_ppo_declares_gae_and_the_batch_gains_the_critics_returns(reward_fn, scored):
    cfg = load_config("ppo", ["ppo.gamma=0.9", "ppo.lam=0.8", f"rewards=[{{name: varied, fn: '{reward_fn}'}}]"])
    credit = RECIPES.get("ppo").credit(cfg, Sources())
    assert isinstance(credit.advantages, GAE) and (credit.advantages.gamma, credit.advantages.lam) == (0.9, 0.8)
    lengths = pa.compute.list_value_length(scored.column("response_ids")).to_numpy()
    values = np.concatenate([np.linspace(0.1, 0.5, n) for n in lengths]).astype(np.float32)
    valued = scored.append_column("old_values", B.list_column(values, lengths, pa.float32()))
    table, metrics = credit.apply(valued)
    rewards, groups = rewards_and_groups(table)
    r_mask = B.response_mask(table)
    v, _ = B.to_padded(valued.column("old_values"), 0.0, torch.float32)
    adv, returns = gae_advantages(rewards, v, r_mask, 0.9, 0.8)
    valid = adv[r_mask]
    adv = torch.where(r_mask, (adv - valid.mean()) / (valid.std() + 1e-8), torch.zeros_like(adv))  # whitened
    assert np.array_equal(np.concatenate(per_row(table.column("advantages"))), adv[r_mask].numpy())
    assert np.array_equal(np.concatenate(per_row(table.column("returns"))), returns[r_mask].numpy())
    outcome = (adv * r_mask).sum(1) / r_mask.sum(1).clamp(min=1)
    assert metrics["train/advantage_abs_mean"] == pytest.approx(float(outcome.abs().mean()))
    with pytest.raises(B.BatchError, match="GAE needs the critic's per-token `old_values`"):
        credit.apply(scored)
    with pytest.raises(ValueError, match="algorithm.advantage=gae needs a critic's values per token"):
        Credit(cfg)  # an outcome estimator cannot run GAE


@pytest.mark.parametrize("weight", [0.0, 2.5])
def test_process_advantages_are_added_times_the_recipes_weight(config, scored, weight):
    lengths = pa.compute.list_value_length(scored.column("response_ids")).to_numpy()
    dense = np.concatenate([np.linspace(-1, 1, n) for n in lengths]).astype(np.float32)
    table = scored.append_column("token_rewards", B.list_column(dense, lengths, pa.float32()))
    out, _ = Credit(config, process_weight=weight).apply(table)
    rewards, groups = rewards_and_groups(out)
    r_mask = B.response_mask(out)
    padded, _ = B.to_padded(table.column("token_rewards"), 0.0, torch.float32)
    outcome = ADVANTAGES.get("grpo")(rewards, groups)
    expected = (outcome[:, None] + weight * process_advantages(padded, r_mask.float(), groups)) * r_mask
    assert np.array_equal(np.concatenate(per_row(out.column("advantages"))), expected[r_mask].numpy())
    prime = load_config("prime", ["prime.process_weight=0.3"])
    assert RECIPES.get("prime").credit(prime, Sources()).process_weight == 0.3
    assert RECIPES.get("cooper").credit(load_config("cooper", []), Sources()).process_weight == 1.0


def test_rows_the_reward_mask_keeps_out_get_zero_advantages(reward_fn, scored):
    """Parrot's Pareto selection (aggregate.select, dominated: mask): dominated rows keep their
    reward but train on nothing."""
    cfg = make_config(reward_fn).model_copy(update={"aggregate": {"select": {"pareto": ["varied"],
                                                                               "scope": "group"}}})
    table, metrics = credited(cfg, scored)
    mask = np.asarray(table.column("reward_mask").to_pylist())
    assert 0 < mask.sum() < len(mask) and metrics["reward/pareto/masked"] == int((~mask).sum())
    for keep, adv in zip(mask, per_row(table.column("advantages"))):
        assert keep or not adv.any()


def test_the_running_statistics_go_through_a_checkpoint_as_json(reward_fn, scored):
    """`normalize: running`: a credit step restored from its state (as loop_state.json holds it)
    gives the next batch what the uninterrupted one gives, bit for bit; a fresh one does not."""
    cfg = make_config(reward_fn).model_copy(update={"aggregate": {"normalize": {"varied": "running"}}})
    other = B.replace_column(scored, "reward.varied", pa.array(scored.column("reward.varied").to_numpy() * 3 + 1))
    uninterrupted = Credit(cfg)
    uninterrupted.apply(scored)
    expected, _ = uninterrupted.apply(other)
    first = Credit(cfg)
    first.apply(scored)
    state = json.loads(json.dumps(first.state_dict()))
    assert state["aggregator"]["normalize"]["varied"]["count"] == scored.num_rows
    resumed = Credit(cfg)
    resumed.load_state_dict(state)
    got, _ = resumed.apply(other)
    assert got.column("advantages").equals(expected.column("advantages"))
    assert got.column("reward").equals(expected.column("reward"))
    fresh, _ = Credit(cfg).apply(other)
    assert not fresh.column("reward").equals(expected.column("reward"))
    with pytest.raises(ValueError, match="credit step state must be a dict"):
        resumed.load_state_dict([1])


def test_the_policy_learner_trains_on_the_advantages_column_and_reads_no_reward(config, scored):
    table, _ = credited(config, scored)
    with pytest.raises(B.BatchError, match="trains on the per-token `advantages` column that the credit step writes"):
        Learner(config).train_step(scored)
    # the same rewards, advantages 0: no gradient, the weights stay
    zero = B.replace_column(table, "advantages", pa.array([[0.0] * len(a) for a in table.column("advantages")
                                                            .to_pylist()], pa.list_(pa.float32())))
    learner = Learner(config)
    before = weights(learner.model)
    metrics = learner.train_step(zero)
    assert metrics["train/grad_norm"] == 0 and all(torch.equal(v, weights(learner.model)[k]) for k, v in before.items())
    assert not any(k.startswith("reward/") for k in metrics)  # the credit step reports the rewards
    # the rewards dropped altogether: the learner trains exactly as on the credited batch
    bare = table.drop_columns(["reward", *[n for n in table.schema.names if n.startswith("reward.")]])
    a, b = Learner(config), Learner(config)
    ma, mb = a.train_step(table), b.train_step(bare)
    assert ma["train/loss"] == mb["train/loss"] and ma["train/grad_norm"] == mb["train/grad_norm"] > 0
    assert all(torch.equal(v, weights(b.model)[k]) for k, v in weights(a.model).items())


@pytest.mark.slow
def test_the_credit_state_is_checkpointed_with_the_loop_and_restored_on_resume(ray_env, warm_cache, tmp_path):
    """Running normalisation of the verifier's reward: a run interrupted after step 2 and resumed
    logs the rewards and advantages of an uninterrupted run, because the aggregator's statistics
    came back from loop_state.json (fresh ones would normalise step 3 by its batch alone)."""
    args = small(warm_cache, "rewards=[{name: correct, fn: integer_match, normalize: running}]",
                 "train.eval_every=100", "train.checkpoint_every=0")
    keys = ("reward/mean", "reward/std", "train/advantage_abs_mean", "train/loss", "train/grad_norm")
    reference = tmp_path / "reference"
    coevo([*args, "train.max_steps=3", "--output-dir", str(reference)], ray_env, tmp_path)
    run_dir = tmp_path / "run"
    coevo([*args, "train.max_steps=2", "--output-dir", str(run_dir)], ray_env, tmp_path)
    state = json.loads((run_dir / "checkpoints" / "final" / "loop_state.json").read_text())["credit"]
    assert state["aggregator"]["normalize"]["correct"]["count"] == 2 * 32  # two batches of 8 x 4 samples
    coevo(["--resume", "--output-dir", str(run_dir), "train.max_steps=3"], ray_env, tmp_path)
    rows, expected = read_metrics(run_dir), read_metrics(reference)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [{k: r[k] for k in keys} for r in rows] == [{k: r[k] for k in keys} for r in expected]
    assert all("reward/correct/mean" in r and "time/credit_s" in r for r in rows)


def test_a_checkpoint_from_before_the_credit_step_gives_its_learners_state_to_it(reward_fn, scored, tmp_path):
    """Older checkpoints kept the aggregator's statistics and LaSeR's c in the policy learner's
    learner_state.pt; a resume reads them from there (orchestrator.run: `legacy_state`)."""
    from orchestrator.credit import legacy_state

    cfg = make_config(reward_fn).model_copy(update={"aggregate": {"normalize": {"varied": "running"}}})
    before = Credit(cfg)
    before.apply(scored)
    (tmp_path / "policy_learner").mkdir()
    torch.save({"version": 3, "extra": {"skipped_steps": 0, "aggregator": before.aggregator.state_dict(),
                                        "laser_c": -2.5}}, tmp_path / "policy_learner" / "learner_state.pt")
    state = legacy_state(tmp_path / "policy_learner")
    assert state == {"aggregator": before.aggregator.state_dict(), "laser": {"c": -2.5}}
    resumed = Credit(cfg)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == before.state_dict()
    assert legacy_state(tmp_path / "missing") is None
