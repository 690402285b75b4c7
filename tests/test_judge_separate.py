"""A judge apart from the policy (`judge.separate`): the judging warm-up's change becomes a judge
vector that a judge pool adds to every policy version, and the policy starts RL where the warm-up
found it."""

from __future__ import annotations

import json

import pytest
import torch

from coevo_cli import coevo, read_metrics, small


def _seeded(seed: int, hidden_size: int = 32):
    from actors import modeling

    return modeling.tiny_model(modeling.char_tokenizer(), hidden_size=hidden_size, intermediate_size=64, seed=seed)


def test_the_vector_is_the_warm_ups_change_and_adds_onto_any_policy(tmp_path) -> None:
    from actors import judge_vector

    base, judged, later = _seeded(0), _seeded(1), _seeded(2)
    base.save_pretrained(tmp_path / "base")
    judged.save_pretrained(tmp_path / "judged")
    out = judge_vector.write(tmp_path / "base", tmp_path / "judged", tmp_path / "vec")
    assert (out / "config.json").is_file() and not list(tmp_path.glob(".vec*"))  # atomic: no leftovers
    vector = judge_vector.load(out)
    # the base plus the vector is the judged model
    judge_vector.add(base, vector)
    for (n, a), (_, b) in zip(base.named_parameters(), judged.named_parameters()):
        assert torch.allclose(a, b, atol=1e-6), n
    # a later policy version gets the same change; tied weights (one parameter) get it once
    before = {n: p.detach().clone() for n, p in later.named_parameters()}
    judge_vector.add(later, vector)
    for n, p in later.named_parameters():
        assert torch.allclose(p - before[n], vector[n], atol=1e-6), n
    # a written vector is not rewritten (another run wrote it first)
    stamp = (out / judge_vector.FILE).stat().st_mtime_ns
    judge_vector.write(tmp_path / "base", tmp_path / "judged", tmp_path / "vec")
    assert (out / judge_vector.FILE).stat().st_mtime_ns == stamp


def test_a_judge_pool_replica_holds_each_version_plus_the_vector(tmp_path) -> None:
    """What the judge pool's generator judges with: every version it loads, plus the vector (and a
    plain replica the version alone)."""
    from actors import judge_vector, modeling
    from actors.generator import Generator
    from actors.weights import export_state
    from orchestrator.config import validate_config

    cfg = validate_config({"seed": 0, "rollout": {"max_new_tokens": 4}, "rewards": [{"name": "integer_match"}],
                           "train": {"threads": 1}})
    base, judged, later = (modeling.build(cfg.model, seed)[0] for seed in (0, 1, 2))
    base.save_pretrained(tmp_path / "base")
    judged.save_pretrained(tmp_path / "judged")
    vec = judge_vector.write(tmp_path / "base", tmp_path / "judged", tmp_path / "vec")
    apart, plain = Generator(cfg, str(tmp_path / "base"), judge_vector=str(vec)), Generator(cfg, str(tmp_path / "base"))
    for p, q in zip(apart.backend.model.parameters(), judged.parameters()):  # at start: the judged model
        assert torch.allclose(p, q, atol=1e-5)
    vector = judge_vector.load(vec)
    for version, model in ((1, later), (2, base)):
        apart.update_weights(version, export_state(model, version))
        plain.update_weights(version, export_state(model, version))
        for (n, p), (_, q) in zip(apart.backend.model.named_parameters(), plain.backend.model.named_parameters()):
            assert torch.allclose(p - q, vector[n], atol=1e-5), (version, n)  # added once, to this version


def test_a_vector_of_another_architecture_is_refused(tmp_path) -> None:
    from actors import judge_vector

    small_model = _seeded(0)
    small_model.save_pretrained(tmp_path / "a")
    other = _seeded(0, hidden_size=64)
    other.save_pretrained(tmp_path / "b")
    with pytest.raises(ValueError, match="not the same architecture"):
        judge_vector.write(tmp_path / "a", tmp_path / "b", tmp_path / "vec")
    judge_vector.write(tmp_path / "a", tmp_path / "a", tmp_path / "vec")
    with pytest.raises(ValueError, match="do not match the judge's model"):
        judge_vector.add(other, judge_vector.load(tmp_path / "vec"))
    with pytest.raises(FileNotFoundError, match="judge vector is missing"):
        judge_vector.load(tmp_path / "nowhere")


def test_separate_needs_a_warm_up_and_a_recipe_that_judges_apart() -> None:
    from orchestrator.config import ConfigError, load_config

    judged = "rewards=[{name: judge, judge: true}, {name: correct, fn: integer_match, weight: 0}]"
    with pytest.raises(ConfigError, match=r"judge.separate: true needs a judging warm-up"):
        load_config(None, [judged, "judge.separate=true"])
    with pytest.raises(ConfigError, match=r"judge.separate: true with rollout.backend='vllm'"):
        load_config(None, [judged, "judge.separate=true", "judge.warmup_steps=5", "rollout.backend=vllm"])
    from orchestrator.recipes import RECIPES

    with pytest.raises(ConfigError, match="judge.separate: recipe 'spark' trains or reads its judge inside"):
        load_config("spark", [judged, "judge.separate=true", "judge.warmup_steps=5"])
    for recipe in ("grpo", "spc", "self_rewarding"):
        assert RECIPES.get(recipe).separate_judge
    # a policy with no directory to measure the vector from (no model.path, no SFT warm-up)
    from orchestrator.recipes import Sources
    from pipelines.stages.judge import JudgeWarmup

    bare = load_config(None, [judged, "judge.separate=true", "judge.warmup_steps=5", "warmup.enabled=false"])
    with pytest.raises(ValueError, match="the policy has no model directory to measure the judge vector from"):
        JudgeWarmup().apply(bare, Sources(), "/nowhere", {})
    # where the judge is apart, the recipe builds a judge pool holding the vector
    config = load_config("self_rewarding", [judged, "judge.separate=true", "judge.warmup_steps=5"])
    roles = RECIPES.get("self_rewarding").roles(config, Sources(policy="p", judge_vector="v"))
    assert roles["judge"].kwargs["judge_vector"] == "v"
    shared = load_config("self_rewarding", [judged, "judge.warmup_steps=5"])
    assert "judge" not in RECIPES.get("self_rewarding").roles(shared, Sources(policy="p"))


def test_a_judge_apart_that_learns_needs_separate_and_a_recipe_that_trains_it() -> None:
    from orchestrator.config import ConfigError, load_config
    from orchestrator.recipes import RECIPES, Sources
    from pipelines.stages.judge import JudgeWarmup

    judged = "rewards=[{name: judge, judge: true}, {name: correct, fn: integer_match, weight: 0}]"
    apart = [judged, "judge.separate=true", "judge.warmup_steps=5"]
    with pytest.raises(ConfigError, match=r"judge.online_items=8 trains a judge apart from the policy; set "
                                          r"judge.separate: true"):
        load_config(None, [judged, "judge.warmup_steps=5", "judge.online_items=8"])
    with pytest.raises(ConfigError, match=r"judge.online_replay=2 replays .* judge.online_items is 0"):
        load_config(None, [*apart, "judge.online_replay=2"])
    for recipe in ("spc", "self_rewarding"):
        with pytest.raises(ConfigError, match=f"judge.online_items: recipe '{recipe}' does not train a judge apart"):
            load_config(recipe, [*apart, "judge.online_items=8"])
    # the roles: a judge learner and its pool, both from the judge-warmed model (a resume: the
    # learner's checkpoint); no judge vector
    config = load_config(None, [*apart, "judge.online_items=8", "judge.online_lr=2e-4", "judge.online_replay=2"])
    roles = RECIPES.get("grpo").roles(config, Sources(policy="p", judge="j"))
    assert roles["judge"].args == ("j",) and "judge_vector" not in roles["judge"].kwargs
    assert roles["judge_learner"].args == ("j",) and roles["judge_learner"].kind == "learner"
    assert roles["judge_learner"].kwargs == {"judging": roles["judge"].kwargs["judging"], "lr": 2e-4, "replay": 2}
    assert roles["judge_learner"].kwargs["judging"].template == config.judge.template
    resumed = RECIPES.get("grpo").roles(config, Sources(policy="p", judge="j", learners={"judge_learner": "ck"}))
    assert resumed["judge"].args == resumed["judge_learner"].args == ("ck",)
    # the warm-up hands the judge-warmed model on, and writes no vector (a bare policy is fine)
    sources = Sources()
    bare = load_config(None, [*apart, "judge.online_items=8", "warmup.enabled=false"])
    info = JudgeWarmup().apply(bare, sources, "/judged", {})
    assert sources.judge == "/judged" and sources.judge_vector is None and info["judge_warmup/separate"] is True
    # the judging warm-up's cache key does not change: a fixed judge apart's warm-up is reused
    from pipelines.stages.judge import cache_path

    assert cache_path(bare, "s") == cache_path(load_config(None, [*apart, "warmup.enabled=false"]), "s")


def test_a_judge_from_scratch_is_a_learning_judge_apart_with_random_weights() -> None:
    """judge.init: scratch: refused without a judge apart that learns or with LoRA; before its warm-up
    the judge learner is the policy's architecture with fresh weights (after it, and on resume, the
    trained judge); its warm-up trains the judge pools and hands them on; its cache key ignores the
    task share and a `policy` judge's key is what it was before the field existed."""
    from orchestrator.config import ConfigError, load_config
    from orchestrator.recipes import RECIPES, Sources
    from pipelines.stages.judge import SCRATCH_ROLES, JudgeWarmup, cache_path

    judged = "rewards=[{name: judge, judge: true}, {name: correct, fn: integer_match, weight: 0}]"
    apart = [judged, "judge.separate=true", "judge.warmup_steps=5", "warmup.enabled=false"]
    with pytest.raises(ConfigError, match=r"judge.init: scratch trains a judge of its own .* set judge.separate: "
                                          r"true and judge.online_items"):
        load_config(None, [*apart, "judge.init=scratch"])
    with pytest.raises(ConfigError, match=r"judge.init: scratch with learner.lora: adapters on randomly initialised"):
        load_config(None, [*apart, "judge.init=scratch", "judge.online_items=8", "learner.lora={r: 4, alpha: 8}"])
    with pytest.raises(ConfigError, match=r"judge.init"):
        load_config(None, [*apart, "judge.online_items=8", "judge.init=random"])
    with pytest.raises(ConfigError, match=r"judge.init: scratch trains a one-token verdict .* use judge.mode: yes_prob"):
        load_config(None, [*apart, "judge.online_items=8", "judge.init=scratch", "judge.mode=sampled"])
    scratch = load_config(None, [*apart, "judge.online_items=8", "judge.init=scratch"])
    grpo = RECIPES.get("grpo")
    roles = grpo.roles(scratch, Sources(policy="p"))  # before the warm-up: the policy's architecture, fresh
    assert roles["judge_learner"].args == roles["judge"].args == ("p",) and roles["judge_learner"].kwargs["fresh"]
    for sources in (Sources(policy="p", judge="j"), Sources(policy="p", learners={"judge_learner": "ck"})):
        assert "fresh" not in grpo.roles(scratch, sources)["judge_learner"].kwargs  # the trained judge
    stage = JudgeWarmup()
    assert stage.borrowed(scratch) == SCRATCH_ROLES and stage.hands_on(scratch)
    policy = load_config(None, [*apart, "judge.online_items=8"])
    assert stage.borrowed(policy) == stage.borrows and not stage.hands_on(policy)
    sources = Sources()
    assert stage.apply(scratch, sources, "/judged", {})["judge_warmup/separate"] and sources.judge == "/judged"
    assert stage.policy_accuracy({"judge_warmup/separate": True}) is None  # RL starts from the policy
    assert cache_path(scratch, "s") != cache_path(policy, "s")
    assert cache_path(scratch, "s") == cache_path(load_config(None, [*apart, "judge.online_items=8", "judge.init=scratch",
                                                                     "judge.warmup_task_fraction=0.25"]), "s")
    assert cache_path(policy, "s") != cache_path(load_config(None, [*apart, "judge.online_items=8",
                                                                    "judge.warmup_task_fraction=0.25"]), "s")
    # a `policy` judge's key is the one made before `init` existed (its cached warm-ups still hit)
    from orchestrator.stage_cache import stage_path

    before = policy.judge.model_dump(exclude={"separate", "online_items", "online_lr", "online_replay", "init",
                                              "warmup_task_samples", "warmup_samples", "near_misses"})
    assert cache_path(policy, "s") == stage_path(policy, "judges", "s", policy.accuracy_source(), {"judge": before})


def test_a_judge_learner_from_scratch_learns_verdicts_from_fresh_weights(tmp_path) -> None:
    """`fresh`: the same architecture with other (seeded) weights; `verdict_steps` is the two-way
    cross-entropy of the verifier's verdict, and a few steps of it separate right from wrong."""
    import pyarrow as pa

    from actors import modeling
    from actors.judge_learner import JudgeLearner
    from actors.judging import render, yes_probability
    from orchestrator.config import load_config

    config = load_config(None, ["rewards=[{name: judge, judge: true}, {name: correct, fn: integer_match, weight: 0}]",
                                "judge.separate=true", "judge.warmup_steps=5", "judge.online_items=8",
                                "judge.init=scratch", "warmup.enabled=false", "train.threads=1"])
    _seeded(3).save_pretrained(tmp_path / "policy")
    judging = config.judge.generator_args(config, {})["judging"]
    loaded = JudgeLearner(config, str(tmp_path / "policy"), judging=judging)
    fresh, again = (JudgeLearner(config, str(tmp_path / "policy"), judging=judging, fresh=True) for _ in range(2))
    for (name, a), (_, b), (_, c) in zip(loaded.model.named_parameters(), fresh.model.named_parameters(),
                                         again.model.named_parameters()):
        assert a.shape == b.shape and torch.equal(b, c), name  # same architecture; seeded
    assert any(not torch.equal(a, b) for a, b in zip(loaded.model.parameters(), fresh.model.parameters()))
    items = pa.table({"prompt": ["2+3=", "2+3=", "4+4=", "4+4="], "response": ["5", "6", "8", "9"],
                      "step_correct": [True, False, True, False]})
    texts = [render(config.judge.template, q, r) for q, r in zip(items["prompt"].to_pylist(), items["response"].to_pylist())]
    first = fresh.verdict_steps([items], 3e-3)
    last = fresh.verdict_steps([items] * 30, 3e-3)
    assert last < first
    p = yes_probability(fresh.model, fresh.tokenizer, texts, fresh.yes, fresh.no, fresh.device)
    assert p[0] > 0.5 > p[1] and p[2] > 0.5 > p[3]


@pytest.mark.slow
def test_self_judged_grpo_with_a_judge_apart_starts_from_the_policy_and_resumes(ray_env, warm_cache, tmp_path) -> None:
    """The policy starts RL at the SFT warm-up's accuracy (the judging warm-up trained a copy); the
    judge pool judges with policy + vector; the vector is in every checkpoint and a resume uses it."""
    run_dir = tmp_path / "run"
    args = small(warm_cache, "rewards=[{name: judge, judge: true}, {name: correct, fn: integer_match, weight: 0}]",
                 "verifier.accuracy_source=correct", "algorithm.advantage=dr_grpo", "train.max_steps=2",
                 "judge.warmup_steps=4", "judge.warmup_batch_size=8", "judge.separate=true",
                 "train.eval_every=2", "train.checkpoint_every=1", "train.dump_rollouts=true",
                 "--output-dir", str(run_dir))
    out = coevo(args, ray_env, tmp_path)
    assert "held-out task accuracy" in out and "judge.separate: that was the judge's copy" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["judge_warmup/separate"] is True
    # where RL began: the SFT warm-up's model, not the judge-warmed one
    assert summary["warm_start/stage"] == "warm-up" and summary["warm_start/accuracy"] == summary["warmup/accuracy"]
    assert (run_dir / "frozen" / "judge_vector" / "judge_vector.safetensors").is_file()
    assert (run_dir / "checkpoints" / "step_2" / "frozen" / "judge_vector" / "judge_vector.safetensors").is_file()
    import pandas as pd

    dump = pd.read_parquet(run_dir / "rollouts" / "step_2.parquet")
    assert dump["reward.judge"].notna().all() and (dump["judge_version"] == dump["policy_version"]).all()
    # a new run from the cached warm-up says where its policy starts too
    out = coevo([*args[:-1], str(tmp_path / "again"), "train.max_steps=1"], ray_env, tmp_path)
    assert "judging warm-up: using cached model" in out and "judge.separate: that was the judge's copy" in out
    # resume: the run directory's own vector (the cache it came from may be gone)
    import shutil

    shutil.rmtree(warm_cache / ".." / "judges", ignore_errors=True)
    coevo(["--resume", "--output-dir", str(run_dir), "train.max_steps=3"], ray_env, tmp_path)

    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3]


@pytest.mark.slow
@pytest.mark.long  # ~70 s: the main suite stays near 15 minutes; CI's long stage runs it
def test_a_judge_apart_that_learns_trains_on_labelled_rollouts_judges_with_them_and_resumes(
        ray_env, warm_cache, tmp_path) -> None:
    """judge.online_items: each step the judge learner trains on the labelled rollouts (and, with
    judge.near_misses, edits of the right ones the verifier marks wrong) and publishes to the judge
    pool, which judges the next step with that version; its optimizer and replay are in the
    checkpoint and a resume goes on from them."""
    run_dir = tmp_path / "run"
    args = small(warm_cache, "rewards=[{name: judge, judge: true}, {name: correct, fn: integer_match, weight: 0}]",
                 "verifier.accuracy_source=correct", "algorithm.advantage=dr_grpo", "train.max_steps=2",
                 "judge.warmup_steps=4", "judge.warmup_batch_size=8", "judge.separate=true",
                 "judge.online_items=16", "judge.online_replay=1", "judge.near_misses=1", "rollout.temperature=2.0",
                 "train.eval_every=2", "train.checkpoint_every=1", "train.dump_rollouts=true",
                 "--output-dir", str(run_dir))
    out = coevo(args, ray_env, tmp_path)
    assert "learning from each step's labelled rollouts" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["warm_start/stage"] == "warm-up" and not (run_dir / "frozen" / "judge_vector").exists()
    rows = read_metrics(run_dir)
    assert [r["judge_learner/version"] for r in rows] == [1, 2] and [r["channel/judge/version"] for r in rows] == [1, 2]
    assert sum(r["judge_learner/steps_judged"] for r in rows) > 0  # right and wrong rollouts, balanced
    # near misses of the right answers, scored by the verifier: in the warm-up and each step's items
    assert "near misses of the right ones (judge.near_misses)" in out and summary["judge_warmup/near_misses"] > 0
    assert sum(r["judge_learner/near_misses"] for r in rows) > 0
    assert (run_dir / "checkpoints" / "step_2" / "judge_learner" / "config.json").is_file()
    import pandas as pd

    # step 2's samples were judged by the judge learner's first version, not by the policy's
    dump = pd.read_parquet(run_dir / "rollouts" / "step_2.parquet")
    assert dump["reward.judge"].notna().all() and (dump["judge_version"] == 1).all()
    coevo(["--resume", "--output-dir", str(run_dir), "train.max_steps=3"], ray_env, tmp_path)
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["judge_learner/version"] == 3
    second = rows[1]["judge_learner/steps_judged"] - rows[1]["judge_learner/replayed"]  # step 2's own items
    assert rows[-1]["judge_learner/replayed"] == second  # replayed after the resume (online_replay=1)


@pytest.mark.slow
@pytest.mark.long  # ~1 min: the main suite stays near 15 minutes; CI's long stage runs it
def test_a_judge_from_scratch_warms_up_apart_and_learns_in_the_run(ray_env, warm_cache, tmp_path) -> None:
    """judge.init: scratch: the judging warm-up trains a randomly initialised judge learner on the
    policy's labelled samples (the policy untouched: RL starts at the SFT warm-up's accuracy), the
    judge pool judges with it, and it goes on learning; a second run reuses the cached judge."""
    run_dir = tmp_path / "run"
    args = small(warm_cache, "rewards=[{name: judge, judge: true}, {name: correct, fn: integer_match, weight: 0}]",
                 "verifier.accuracy_source=correct", "algorithm.advantage=dr_grpo", "train.max_steps=2",
                 "judge.warmup_steps=4", "judge.warmup_batch_size=8", "judge.separate=true", "judge.init=scratch",
                 "judge.warmup_resample=2", "judge.online_items=16", "rollout.temperature=2.0", "train.eval_every=2", "train.checkpoint_every=2",
                 "--output-dir", str(run_dir))
    out = coevo(args, ray_env, tmp_path)
    assert "judging warm-up (judge.init: scratch)" in out and "a judge of its own from random weights" in out
    assert "re-drawn from the policy every 2 steps" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["judge_warmup/init"] == "scratch" and summary["judge_warmup/steps"] == 4
    assert summary["warm_start/stage"] == "warm-up" and summary["warm_start/accuracy"] == summary["warmup/accuracy"]
    rows = read_metrics(run_dir)
    assert [r["judge_learner/version"] for r in rows] == [1, 2] and [r["channel/judge/version"] for r in rows] == [1, 2]
    from actors import modeling

    judge = modeling.load_model(run_dir / "checkpoints" / "step_2" / "judge_learner")
    policy = modeling.load_model(run_dir / "checkpoints" / "step_2" / "policy_learner")
    # the judge is not the policy plus a few steps: its weights are far from the policy's
    assert all(p.shape == q.shape for p, q in zip(judge.parameters(), policy.parameters()))
    gap = sum(float((p - q).abs().mean()) for p, q in zip(judge.parameters(), policy.parameters()))
    assert gap > 0.01 * len(list(policy.parameters()))
    # it is the warm-up's judge two online steps on, not another random init
    warmed = [m.parent for m in (warm_cache / ".." / "judges").glob("*/judge_warmup.json")
              if json.loads(m.read_text()).get("judge_warmup/init") == "scratch"]
    assert len(warmed) == 1
    near = sum(float((p - q).abs().mean()) for p, q in zip(judge.parameters(), modeling.load_model(warmed[0]).parameters()))
    assert near < gap / 10
    out = coevo([*args[:-1], str(tmp_path / "again"), "train.max_steps=1"], ray_env, tmp_path)
    assert "judging warm-up: using cached model" in out and "judge.init: scratch: a judge of its own" in out


@pytest.mark.slow
@pytest.mark.long  # ~1 min: the main suite stays near 15 minutes; CI's long stage runs it
def test_self_rewarding_judges_its_pairs_in_the_pool_apart(ray_env, warm_cache, tmp_path) -> None:
    """self_rewarding with judge.separate: the policy starts from the SFT warm-up's model and each
    iteration's pairs are judged by the judge pool (policy + vector), which also takes the snapshots."""
    run_dir = tmp_path / "sr"
    out = coevo(small(warm_cache, "recipe=self_rewarding", "rewards=[{name: judge, judge: true}, "
                      "{name: correct, fn: integer_match, weight: 0}]", "verifier.accuracy_source=correct",
                      "verifier.fraction=0.5", "iterations.labels=true", "iterations.iterations=2",
                      "iterations.prompts=16", "iterations.batch_pairs=4", "iterations.cream=weight",
                      "judge.warmup_steps=4", "judge.warmup_batch_size=8", "judge.separate=true",
                      "rollout.samples_per_prompt=8", "rollout.temperature=2.0", "train.max_steps=200",
                      "train.eval_every=100", "--output-dir", str(run_dir)), ray_env, tmp_path, timeout=400)
    assert "iteration 1:" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["judge_warmup/separate"] is True and summary["warm_start/stage"] == "warm-up"
    rows = read_metrics(run_dir)
    assert rows[-1]["iter/index"] == 1 and any(r.get("iter/judge_auroc") is not None for r in rows)


@pytest.mark.slow
@pytest.mark.long  # ~40 s: the main suite stays near 15 minutes; CI's long stage runs it
def test_resuming_a_shared_judge_run_with_a_judge_apart_is_refused(ray_env, warm_cache, tmp_path) -> None:
    """A checkpoint of a run that judged with the policy itself has no judge vector and no judge
    learner: a resume that asks for judge.separate (or a judge apart that learns) stops with a clear
    error, not a judge pool that judges without them."""
    run_dir = tmp_path / "run"
    coevo(small(warm_cache, "rewards=[{name: judge, judge: true}, {name: correct, fn: integer_match, weight: 0}]",
                "verifier.accuracy_source=correct", "train.max_steps=1", "judge.warmup_steps=4",
                "judge.warmup_batch_size=8", "train.checkpoint_every=1", "--output-dir", str(run_dir)), ray_env, tmp_path)
    out = coevo(["--resume", "--output-dir", str(run_dir), "train.max_steps=2", "judge.separate=true"], ray_env,
                tmp_path, expect=1)
    assert "--resume with judge.separate: true, but the checkpoint" in out and "has no judge vector" in out
    # nor a judge learner: a resume that asks for a judge apart that learns stops too
    out = coevo(["--resume", "--output-dir", str(run_dir), "train.max_steps=2", "judge.separate=true",
                 "judge.online_items=8"], ray_env, tmp_path, expect=1)
    assert "--resume with judge.online_items=8, but the checkpoint" in out and "has no judge learner" in out
