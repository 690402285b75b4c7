"""The Learner in-process (no Ray) on a real rollout batch from the Generator, scored by the Verifier."""

from __future__ import annotations

import math
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

from actors.algorithms import ADVANTAGES, POLICY_LOSSES
from actors.generator import Generator
from actors.learner import Learner
from actors.verifier import Verifier
from actors import batch as B
from orchestrator.config import Config, validate_config
from orchestrator.data import arithmetic
from rl_step import credited, generator, train
from user_module import on_path

TINY = {"arch": "qwen2", "hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
        "intermediate_size": 64}

# A reward that varies between samples of one prompt even for an untrained model, so GRPO
# advantages are non-zero and a step really moves the weights.
REWARD_MODULE = """
def varied(prompt, response, answer, **_):
    return float(sum(map(ord, response)) % 3) / 2
"""


def make_config(reward_fn: str | None = None, rollout: dict | None = None, **algorithm) -> Config:
    rewards = {"rewards": [{"name": "varied", "fn": reward_fn, "timeout_s": 10}]} if reward_fn else {}
    return validate_config({
        "seed": 0,
        "model": {"tiny": TINY},
        "rollout": {"prompts_per_step": 4, "samples_per_prompt": 4, "max_new_tokens": 4, **(rollout or {})},
        **rewards,
        "algorithm": {"lr": 1e-2, **algorithm},
        "train": {"threads": 1},
    })


@pytest.fixture(scope="module")
def reward_fn(tmp_path_factory):
    with on_path(tmp_path_factory, "coevo_test_learner_rewards", REWARD_MODULE) as module:
        yield f"{module}:varied"


@pytest.fixture(scope="module")
def config(reward_fn) -> Config:
    return make_config(reward_fn)


@pytest.fixture(scope="module")
def prompts() -> pa.Table:
    return arithmetic(1, ["+"], eval_size=10, seed=0).train.slice(0, 4)


def rollout_and_score(config, prompts) -> pa.Table:
    rollouts, _ = generator(config).generate(prompts, seq=0)
    verifier = Verifier(config)
    try:
        table, _ = verifier.score(rollouts)
    finally:
        verifier.close()
    return table


@pytest.fixture(scope="module")
def scored(config, prompts) -> pa.Table:
    table = rollout_and_score(config, prompts)
    assert table.num_rows == 16
    assert "reward.varied" in table.schema.names and "answer" in table.schema.names
    assert len(set(table.column("reward.varied").to_pylist())) > 1, "reward should vary for the test to mean anything"
    return table


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def changed(before, after) -> list[str]:
    return [k for k in before if not torch.equal(before[k], after[k])]


METRIC_KEYS = ("reward/mean", "reward/std", "reward/varied/mean", "train/loss", "train/pg_loss",
               "train/clip_frac", "train/neg_logprob", "train/grad_norm", "train/skipped_nonfinite",
               "train/step_skipped", "train/advantage_abs_mean", "samples/count", "samples/tokens",
               "samples/response_length", "samples/truncated_frac", "samples/uniform_reward_groups_frac",
               "samples/distinct_per_group", "policy/version_min", "reward/varied/errors", "version")


def test_train_step_updates_weights(config, scored):
    learner = Learner(config)
    before = weights(learner.model)
    metrics = train(learner, scored)
    for key in METRIC_KEYS:
        assert key in metrics, key
    assert all(math.isfinite(float(v)) for v in metrics.values() if v is not None)
    assert metrics["train/step_skipped"] == 0
    assert metrics["train/skipped_nonfinite"] == 0
    assert metrics["samples/count"] == 16
    n_resp = int(pa.compute.sum(pa.compute.list_value_length(scored.column("response_ids"))).as_py())
    n_prompt = int(pa.compute.sum(pa.compute.list_value_length(scored.column("prompt_ids"))).as_py())
    assert metrics["samples/tokens"] == n_resp + n_prompt
    assert metrics["samples/response_length"] == pytest.approx(n_resp / 16)
    assert metrics["reward/mean"] == pytest.approx(float(np.mean(scored.column("reward.varied").to_numpy())))
    assert metrics["version"] == 1 and learner.version == 1
    assert metrics["train/advantage_abs_mean"] > 0
    assert metrics["train/grad_norm"] > 0
    # The learner starts from the generator's weights (same seed): ratios are ~1, nothing is clipped.
    assert metrics["train/clip_frac"] == 0
    assert metrics["reward/varied/errors"] == 0
    after = weights(learner.model)
    assert changed(before, after), "a train step must move the weights"


def test_behaviour_logprobs_match_learner(config, scored):
    """The learner's recomputed log-probs of the sampled tokens equal the generator's."""
    learner = Learner(config)
    ids, mask, positions, r_ids, r_mask, p_width = learner._sequences(scored)
    with torch.no_grad():
        lp = learner._token_logprobs(learner.model, ids, mask, positions, r_ids, p_width)
    old, _ = B.to_padded(scored.column("behavior_logprobs"), 0.0, torch.float32)
    assert torch.allclose(lp * r_mask, old * r_mask, atol=1e-4)


def test_micro_batches_accumulate_to_the_same_step(config, scored):
    full = train(Learner(config), scored)
    small = train(Learner(config.model_copy(update={"algorithm": config.algorithm.model_copy(
        update={"micro_batch_size": 3})})), scored)
    for key in ("train/loss", "train/pg_loss", "train/grad_norm", "train/clip_frac"):
        assert small[key] == pytest.approx(full[key], rel=1e-4, abs=1e-6), key


def test_kl_term_with_reference(reward_fn, scored):
    learner = Learner(make_config(reward_fn, kl_coef=0.1))
    assert learner.reference is not None
    first = train(learner, scored)
    assert first["train/kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference before any step
    second = train(learner, scored)
    assert second["train/kl"] > 0


def test_nan_behaviour_logprob_skips_step(config, scored):
    lp = scored.column("behavior_logprobs").combine_chunks()
    values = lp.flatten().to_numpy().copy()
    values[0] = np.nan
    bad_lp = pa.ListArray.from_arrays(lp.offsets, pa.array(values, pa.float32()))
    bad = scored.set_column(scored.schema.get_field_index("behavior_logprobs"), "behavior_logprobs", bad_lp)

    learner = Learner(config)
    before = weights(learner.model)
    metrics = train(learner, bad)
    assert metrics["train/step_skipped"] == 1
    assert metrics["train/skipped_nonfinite"] == 1
    assert not changed(before, weights(learner.model))
    # the next good batch trains normally; the skip count is cumulative
    metrics = train(learner, scored)
    assert metrics["train/step_skipped"] == 0
    assert metrics["train/skipped_nonfinite"] == 1
    assert changed(before, weights(learner.model))


def test_nan_policy_loss_skips_step(monkeypatch, config, scored):
    monkeypatch.setattr(POLICY_LOSSES, "_items", POLICY_LOSSES.snapshot())

    @POLICY_LOSSES.register("nan_loss")
    def nan_loss(logprobs, old_logprobs, advantages, clip_eps=0.2):
        loss = logprobs * float("nan")
        return loss, {"clip_frac": torch.zeros_like(logprobs)}

    learner = Learner(config)
    learner.algo = config.algorithm.model_copy(update={"policy_loss": "nan_loss"})
    before = weights(learner.model)
    metrics = train(learner, scored)
    assert metrics["train/step_skipped"] == 1
    assert metrics["train/skipped_nonfinite"] == 1
    assert not changed(before, weights(learner.model))


def test_user_advantage_estimator_is_used(monkeypatch, config, scored):
    monkeypatch.setattr(ADVANTAGES, "_items", ADVANTAGES.snapshot())
    ADVANTAGES.register("zero")(lambda rewards, groups: torch.zeros_like(rewards))
    learner = Learner(config)
    before = weights(learner.model)
    zero = config.model_copy(update={"algorithm": config.algorithm.model_copy(update={"advantage": "zero"})})
    metrics = train(learner, scored, config=zero)  # the credit step estimates the advantages
    assert metrics["train/advantage_abs_mean"] == 0
    assert metrics["train/grad_norm"] == 0
    assert not changed(before, weights(learner.model))  # zero advantage, zero gradient


def test_dump_path_writes_advantages(tmp_path, config, scored):
    learner = Learner(config)
    path = tmp_path / "rollouts" / "step_1.parquet"
    train(learner, scored, dump_path=str(path))
    df = pd.read_parquet(path)
    assert len(df) == scored.num_rows
    assert "advantages" in df.columns and "reward" in df.columns and "answer" in df.columns
    groups = torch.from_numpy(pa.compute.dictionary_encode(scored.column("group_id")).combine_chunks()
                              .indices.to_numpy().astype(np.int64))
    rewards = torch.from_numpy(scored.column("reward.varied").to_numpy().astype(np.float32))
    expected = ADVANTAGES.get("grpo")(rewards, groups).numpy()
    for i, (adv, resp) in enumerate(zip(df["advantages"], df["response_ids"])):
        assert len(adv) == len(resp)  # one value per response token
        assert np.allclose(adv, expected[i])
    assert list(df["uid"]) == scored.column("uid").to_pylist()


def test_save_loads_with_transformers(tmp_path, config, scored):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    learner = Learner(config)
    train(learner, scored)
    out = learner.save(str(tmp_path / "ckpt"))
    assert (tmp_path / "ckpt" / "sharded" / ".metadata").is_file()  # the optimizer, any world size
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert tok("12+3=", add_special_tokens=False)["input_ids"] == \
        learner.tokenizer("12+3=", add_special_tokens=False)["input_ids"]
    assert tok.pad_token_id == learner.tokenizer.pad_token_id
    assert tok.eos_token_id == learner.tokenizer.eos_token_id
    ids = torch.tensor([tok("12+3=", add_special_tokens=False)["input_ids"]])
    learner.model.eval()
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, learner.model(ids).logits, atol=1e-5)

    fresh = Learner(config, model_source=out)  # and the learner can resume from it
    assert fresh.restore(out) == 1  # its version comes back with the optimizer
    assert not changed(weights(learner.model), weights(fresh.model))
    assert fresh.optimizer.state_dict()["state"][0]["step"] == learner.optimizer.state_dict()["state"][0]["step"]


def test_publish_updates_generator(config, prompts, scored):
    learner = Learner(config)
    train(learner, scored)
    gen = Generator(config, None)
    assert gen.update_weights(1, learner.publish()) == 1
    out, info = gen.generate(prompts, n=2)
    assert out.column("policy_version").to_pylist() == [1] * 8 and info["version"] == 1
    assert not changed(weights(learner.model), weights(gen.backend.model))


def test_sft_step_lowers_loss(config, prompts):
    learner = Learner(config)
    losses = [learner.sft_step(prompts, lr=3e-3)["warmup/loss"] for _ in range(20)]
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < 0.8 * losses[0], losses
    learner.end_warmup()
    assert learner._sft_lr is None


def test_sft_loss_on_packed_sequences_equals_the_masked_answer_loss(config, prompts):
    """The SFT step packs prompt + answer + EOS right-padded without an attention mask; its loss must
    be the token-mean answer cross-entropy of the left-padded, masked layout generation uses."""
    learner = Learner(config)
    prompts = pa.table({"prompt": ["1+2=", "13+96=", "7+80="], "answer": ["3", "109", "87"]})
    masked = pa.table({"prompt_ids": learner._tokenize(prompts.column("prompt").to_pylist()),
                       "response_ids": learner._tokenize(prompts.column("answer").to_pylist(), eos=True)})
    ids, mask, positions, r_ids, r_mask, p_width = learner._sequences(masked)
    with torch.no_grad():
        logp = learner._token_logprobs(learner.model, ids, mask, positions, r_ids, p_width)
    expected = float(-(logp * r_mask).sum() / r_mask.sum())
    packed, targets = learner.objectives["sft"].packed_answers(prompts)
    assert int((targets != -100).sum()) == int(r_mask.sum())  # every answer token and EOS, once
    assert learner.sft_step(prompts, lr=1e-9)["warmup/loss"] == pytest.approx(expected, rel=1e-5)


def test_distilled_rows_learn_the_teachers_distribution_and_the_others_their_answers(config):
    """`distill` rows: the KL from the warm-up's frozen teacher (the policy when the warm-up first
    distils), zero at the start and with no gradient; the other rows: cross-entropy on their answers,
    the token mean over both. Moving the policy on plain rows makes the distilled ones pull it back."""
    learner = Learner(config)
    plain = pa.table({"prompt": ["1+2=", "13+96="], "answer": ["3", "109"], "distill": [False, False]})
    own = pa.table({"prompt": ["7+80=", "2+2="], "answer": ["87", "5"], "distill": [True, True]})
    both = pa.concat_tables([plain, own])
    sft = learner.objectives["sft"]
    ids, targets = sft.packed_answers(both)
    with torch.no_grad():
        logits = learner.model(input_ids=ids).logits.float()
        ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    mask = targets != -100
    plain_tokens = mask[:2].sum()
    # at the start the teacher is the model: the distilled rows add nothing but their token count
    expected = float((ce.view_as(mask)[:2] * mask[:2]).sum() / mask.sum())
    assert learner.sft_step(both, lr=1e-9)["warmup/loss"] == pytest.approx(expected, rel=1e-4)
    assert learner.sft_step(own, lr=1e-9)["warmup/loss"] == pytest.approx(0.0, abs=1e-6)
    assert plain_tokens < mask.sum()
    for _ in range(10):  # the policy moves away from the teacher ...
        learner.sft_step(plain.drop_columns(["distill"]), lr=3e-3)
    pulled = [learner.sft_step(own, lr=3e-3)["warmup/loss"] for _ in range(10)]
    assert pulled[0] > 1e-3 and pulled[-1] < pulled[0]  # ... and the KL brings it back
    teacher = learner.warmup_teacher()
    assert all(not p.requires_grad for p in teacher.parameters())
    learner.end_warmup()
    assert learner._teacher is None


def test_async_warm_up_uses_every_core_then_gives_them_back(config, prompts):
    """Async roles get one torch thread each (they share the cores), but the SFT warm-up runs alone:
    it takes every core, and training afterwards is back on the role's share."""
    from orchestrator.config import load_config
    from orchestrator.roles import RoleSpec, resolve

    spec = resolve(RoleSpec("actors.learner:Learner", kind="learner"), None,
                   load_config(None, ["train.max_staleness=1", "algorithm.off_policy=tis"]))
    assert spec.threads == 1 and spec.shared_threads
    assert not resolve(RoleSpec("actors.learner:Learner", kind="learner"), None, load_config(None, [])).shared_threads
    learner = Learner(config, role={"threads": 1, "alone_threads": 0})
    seen = []
    step = learner.sft_step
    learner.sft_step = lambda batch, lr: (seen.append(torch.get_num_threads()), step(batch, lr))[1]
    learner.sft_steps([prompts, prompts], lr=1e-3)
    assert seen == [os.cpu_count()] * 2 and torch.get_num_threads() == 1


def test_repeated_uid_is_refused():
    """Exactly-once accounting: a sample offered twice in one train batch is an error, not a double count."""
    import pyarrow as pa
    from actors import batch as B
    from actors.learner import Learner
    from orchestrator.config import validate_config
    from actors.generator import Generator

    cfg = validate_config({"model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2,
                                             "num_kv_heads": 1, "intermediate_size": 64}},
                           "rollout": {"max_new_tokens": 2, "samples_per_prompt": 2}})
    rollout, _ = Generator(cfg, None).generate(pa.table({"prompt_id": ["a"], "prompt": ["1+1="], "answer": ["2"]}))
    rollout = rollout.append_column("reward.integer_match", pa.array([1.0, 0.0], pa.float32()))
    with pytest.raises(B.BatchError, match="repeated uids"):
        train(Learner(cfg), rollout, rollout)


@pytest.mark.parametrize("mini_batches", [1, 2, 4])
def test_mini_batches_take_that_many_optimizer_steps(reward_fn, scored, mini_batches):
    learner = Learner(make_config(reward_fn, mini_batches=mini_batches))
    metrics = train(learner, scored)
    steps = {int(s["step"]) for s in learner.optimizer.state_dict()["state"].values()}
    assert steps == {mini_batches}
    assert metrics["train/step_skipped"] == 0 and math.isfinite(metrics["train/loss"])


def test_on_policy_at_temperature_and_top_p_nothing_is_clipped(reward_fn, prompts):
    """Behaviour log-probs describe the distribution actually sampled (temperature 0.7, top-p 0.9),
    and the learner recomputes exactly that: at step 1 with one mini-batch the ratio is 1."""
    config = make_config(reward_fn, rollout={"temperature": 0.7, "top_p": 0.9, "top_k": 20})
    table = rollout_and_score(config, prompts)
    learner = Learner(config)
    ids, mask, positions, r_ids, r_mask, p_width = learner._sequences(table)
    with torch.no_grad():
        lp = learner._token_logprobs(learner.model, ids, mask, positions, r_ids, p_width, **learner.sampling)
    old, _ = B.to_padded(table.column("behavior_logprobs"), 0.0, torch.float32)
    assert torch.allclose(lp * r_mask, old * r_mask, atol=1e-4)
    assert train(learner, table)["train/clip_frac"] == 0
    # the same data read with the temperature ignored would not be on-policy
    with torch.no_grad():
        plain = learner._token_logprobs(learner.model, ids, mask, positions, r_ids, p_width)
    assert not torch.allclose(plain * r_mask, old * r_mask, atol=1e-3)


@pytest.mark.parametrize("mini_batches", [3, 5])
def test_mini_batches_is_exact_even_when_rows_do_not_divide(reward_fn, scored, mini_batches):
    metrics = train(Learner(make_config(reward_fn, mini_batches=mini_batches)), scored)
    assert metrics["train/optimizer_steps"] == mini_batches  # 16 rows: near-equal sizes, none empty


def test_skipping_zero_advantage_rows_gives_the_same_update(reward_fn, scored):
    """Groups whose rewards are all equal have advantage 0: skipping their forward/backward must not
    change the update (the token-mean still counts their tokens, AdamW still steps)."""
    # make one group uniform so there is something to skip
    reward = scored.column("reward.varied").to_numpy().copy()
    groups = B.group_index(scored)
    reward[groups == 0] = 1.0
    table = scored.set_column(scored.schema.get_field_index("reward.varied"), "reward.varied",
                              pa.array(reward, pa.float32()))
    on, off = Learner(make_config(reward_fn)), Learner(make_config(reward_fn, skip_uniform_groups=False))
    m_on, m_off = train(on, table), train(off, table)
    assert m_on["train/rows_computed_frac"] < 1.0 == m_off["train/rows_computed_frac"]
    for k, v in weights(on.model).items():
        assert torch.allclose(v, weights(off.model)[k], atol=1e-6), k
    assert m_on["train/loss"] == pytest.approx(m_off["train/loss"], abs=1e-6)


def test_psr_trains_only_the_rows_above_their_group_mean(reward_fn, scored):
    """algorithm.advantage=psr: rows at or below their group's mean have advantage 0, so the learner
    skips their forward pass; the update is not GRPO's."""
    adv = ADVANTAGES.get("grpo")(torch.from_numpy(scored.column("reward.varied").to_numpy().copy()),
                                 torch.from_numpy(B.group_index(scored)))
    psr, grpo = Learner(make_config(reward_fn, advantage="psr")), Learner(make_config(reward_fn))
    m_psr, m_grpo = train(psr, scored), train(grpo, scored)
    assert m_psr["train/rows_computed_frac"] == pytest.approx(float((adv > 0).float().mean()))
    assert 0 < m_psr["train/rows_computed_frac"] < m_grpo["train/rows_computed_frac"]
    assert any(not torch.allclose(v, weights(grpo.model)[k]) for k, v in weights(psr.model).items())


def test_train_step_published_returns_the_weights_of_the_new_version(reward_fn, scored):
    """The object-store channel sends what `train_step_published` returns without asking again: it
    must be the weights after the step, stamped with the step's version."""
    learner = Learner(make_config(reward_fn))
    payload, metrics = learner.train_step_published(credited(learner.config, scored)[0])
    assert payload["version"] == metrics["version"] == learner.version == 1
    for k, v in learner.model.state_dict().items():
        assert torch.equal(torch.from_numpy(payload["state"][k]), v), k


def test_dense_token_rewards_make_per_token_advantages(tmp_path, reward_fn, scored):
    """A `token_rewards` column (e.g. PRIME's implicit process rewards) adds per-token advantages."""
    lengths = pa.compute.list_value_length(scored.column("response_ids")).to_numpy()
    values = np.concatenate([np.linspace(-1, 1, n) for n in lengths]).astype(np.float32)
    table = scored.append_column("token_rewards", B.list_column(values, lengths, pa.float32()))
    learner = Learner(make_config(reward_fn))
    train(learner, table, dump_path=str(tmp_path / "d.parquet"))
    adv = pd.read_parquet(tmp_path / "d.parquet")["advantages"]
    assert any(len(set(np.round(a, 6))) > 1 for a in adv if len(a) > 1)  # varies within a response


def test_a_batch_mixing_reward_model_versions_is_refused(config, scored):
    mixed = scored.append_column("reward_model_version", pa.array([0] * 8 + [1] * 8, pa.int64()))
    with pytest.raises(B.BatchError, match="mixes reward-model versions"):
        train(Learner(config), mixed)


@pytest.mark.parametrize("correction", ["tis", "decoupled_ppo"])
def test_off_policy_corrections_train_and_are_exact_on_policy(reward_fn, scored, correction):
    learner = Learner(make_config(reward_fn, off_policy=correction))
    before = weights(learner.model)
    metrics = train(learner, scored)
    assert metrics["train/clip_frac"] == 0 and metrics["train/is_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert changed(before, weights(learner.model))


def test_steps_raise_the_probability_of_rewarded_responses(config, prompts):
    """Learning happens, in the right direction: a few GRPO steps on a batch where responses
    starting with '1' are rewarded raise their log-likelihood and lower the others'."""
    table, _ = Generator(config, None).generate(prompts, n=8, seq=1)
    r = np.array([float(s.startswith("1")) for s in table.column("response").to_pylist()], np.float32)
    if not 0 < r.mean() < 1:
        r = np.array([float(s.startswith(table.column("response")[0].as_py()[:1])) for s in
                      table.column("response").to_pylist()], np.float32)
    table = table.append_column("reward.varied", pa.array(r))
    learner = Learner(config.model_copy(update={"algorithm": config.algorithm.model_copy(update={"lr": 1e-3})}))
    ids, mask, positions, r_ids, r_mask, p_width = learner._sequences(table)

    def seq_logprob():
        with torch.no_grad():
            return (learner._token_logprobs(learner.model, ids, mask, positions, r_ids, p_width) * r_mask).sum(1)

    before = seq_logprob()
    for _ in range(5):
        train(learner, table)
    gain = (seq_logprob() - before).numpy()
    assert gain[r == 1].mean() > 0.2 and gain[r == 1].mean() > gain[r == 0].mean() + 0.2


def test_rpo_adds_the_chosen_responses_nll_to_the_preference_loss(config):
    """iterations.nll_weight (RPO): the step's loss is DPO's (log 2 when policy = reference) plus
    the weight times the token-mean NLL of the chosen responses."""
    pairs = pa.table({"prompt": ["1+2=", "13+96="], "chosen": ["3", "109"], "rejected": ["4", "19"]})
    plain, rpo = Learner(config), Learner(config)
    for learner in (plain, rpo):
        learner.snapshot_reference()
    base = plain.train_preference(pairs, loss="dpo", params={"beta": 0.1})
    out = rpo.train_preference(pairs, loss="dpo", params={"beta": 0.1}, nll_weight=0.5)
    assert base["pref/loss"] == pytest.approx(math.log(2), rel=1e-5)
    assert out["pref/chosen_nll"] > 0
    assert out["pref/loss"] == pytest.approx(base["pref/loss"] + 0.5 * out["pref/chosen_nll"], rel=1e-5)


def test_distinct_per_group_counts_different_responses_in_each_group():
    from actors.objectives.rl_metrics import distinct_per_group

    # group 0: [1,2] twice and [1,3] -> 2 distinct; group 1: [5], [5,0], [] -> 3 distinct
    responses = [[1, 2], [1, 2], [1, 3], [5], [5, 0], []]
    assert distinct_per_group(responses, [0, 0, 0, 1, 1, 1]) == 2.5
    assert distinct_per_group(responses, [0] * 6) == 5.0  # one group: 5 different sequences
    assert distinct_per_group([], []) == 0.0
