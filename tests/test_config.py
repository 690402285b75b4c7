"""Typed config: the default recipe, overrides, and errors that name the key and accepted values."""

from __future__ import annotations

import pytest
import yaml

from orchestrator.config import (DEFAULT_RECIPE, PIPELINES_DIR, Config, ConfigError, dump_config,
                                 load_config, parse_override, validate_config)


def test_default_recipe_loads():
    cfg = load_config()
    assert isinstance(cfg, Config)
    raw = yaml.safe_load((PIPELINES_DIR / f"{DEFAULT_RECIPE}.yaml").read_text())
    assert cfg.recipe == raw["recipe"]
    assert cfg.rollout.prompts_per_step == raw["rollout"]["prompts_per_step"]
    assert cfg.algorithm.advantage == raw["algorithm"]["advantage"]
    assert cfg.model.tiny.hidden_size == raw["model"]["tiny"]["hidden_size"]
    assert [r.name for r in cfg.rewards] == [r["name"] for r in raw["rewards"]]
    # by name and by path give the same config
    assert load_config(DEFAULT_RECIPE) == cfg
    assert load_config(str(PIPELINES_DIR / f"{DEFAULT_RECIPE}.yaml")) == cfg


def test_overrides_apply_with_types():
    cfg = load_config(None, ["algorithm.lr=5e-5", "rollout.samples_per_prompt=3",
                             "train.dump_rollouts=true", "model.tiny.arch=llama",
                             "data.arithmetic.operators=['+', '-']", "output_dir=/tmp/x"])
    assert cfg.algorithm.lr == 5e-5 and isinstance(cfg.algorithm.lr, float)
    assert cfg.rollout.samples_per_prompt == 3 and isinstance(cfg.rollout.samples_per_prompt, int)
    assert cfg.train.dump_rollouts is True
    assert cfg.model.tiny.arch == "llama"
    assert cfg.data.arithmetic.operators == ["+", "-"]
    assert cfg.output_dir == "/tmp/x"
    # untouched fields keep the recipe's values
    assert cfg.rollout.prompts_per_step == load_config().rollout.prompts_per_step


def test_override_creates_missing_section():
    cfg = load_config(None, ["ray.num_cpus=2"])
    assert cfg.ray.num_cpus == 2


def test_override_syntax_errors():
    with pytest.raises(ConfigError, match="key.sub=value"):
        load_config(None, ["algorithm.lr"])
    with pytest.raises(ConfigError, match="not a section"):
        load_config(None, ["algorithm.lr.x=1"])
    assert parse_override("a.b= 3") == (["a", "b"], 3)


def test_unknown_key_lists_accepted():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algorithm.lrr=1"])
    msg = str(e.value)
    assert "'algorithm.lrr'" in msg
    assert "accepted keys" in msg
    for key in ("lr", "clip_eps", "advantage", "kl_coef"):
        assert key in msg


def test_unknown_nested_key_in_list_lists_accepted():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["rewards=[{name: integer_match, bogus: 1}]"])
    msg = str(e.value)
    assert "'rewards.0.bogus'" in msg
    for key in ("name", "fn", "weight", "timeout_s"):
        assert key in msg


def test_unknown_top_level_section():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["trainer.max_steps=3"])
    msg = str(e.value)
    assert "'trainer'" in msg
    for key in ("model", "data", "rollout", "verifier", "algorithm", "train"):
        assert key in msg


def test_bad_literal_names_accepted_values():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["model.tiny.arch=gpt"])
    msg = str(e.value)
    assert "model.tiny.arch" in msg and "'gpt'" in msg
    assert "qwen2" in msg and "llama" in msg


def test_weight_transport_names_accepted_values():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["weights.transport=nfs"])
    msg = str(e.value)
    assert "weights.transport" in msg and "'nfs'" in msg and "object_store" in msg and "collective" in msg


def test_unknown_reward_function_lists_builtins():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["rewards=[{name: nope}]"])
    msg = str(e.value)
    assert "'nope'" in msg and "rewards" in msg
    for name in ("exact_match", "integer_match", "math_verify", "normalized_match"):
        assert name in msg


def test_reward_import_path_accepted():
    cfg = load_config(None, ["rewards=[{name: mine, fn: 'my_pkg.rewards:score', weight: 0.5}]"])
    assert cfg.rewards[0].fn == "my_pkg.rewards:score"


def test_duplicate_reward_names():
    with pytest.raises(ConfigError, match="unique"):
        load_config(None, ["rewards=[{name: exact_match}, {name: exact_match}]"])


def test_unknown_advantage_lists_accepted():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algorithm.advantage=zzz"])
    msg = str(e.value)
    assert "algorithm.advantage" in msg and "'zzz'" in msg
    for name in ("grpo", "dr_grpo", "rloo"):
        assert name in msg


def test_unknown_policy_loss_lists_accepted():
    with pytest.raises(ConfigError, match="ppo_clip"):
        load_config(None, ["algorithm.policy_loss=zzz"])


def test_unknown_backend_lists_accepted():
    with pytest.raises(ConfigError, match="hf"):
        load_config(None, ["rollout.backend=nope"])


@pytest.mark.parametrize("override, key", [
    ("rollout.prompts_per_step=-1", "rollout.prompts_per_step"),
    ("rollout.prompts_per_step=0", "rollout.prompts_per_step"),
    ("rollout.top_p=1.5", "rollout.top_p"),
    ("algorithm.lr=0", "algorithm.lr"),
    ("weights.bucket_mb=0", "weights.bucket_mb"),
])
def test_out_of_range_values(override, key):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert key in str(e.value)


def test_cross_field_validation():
    with pytest.raises(ConfigError, match="divisible"):
        load_config(None, ["model.tiny.hidden_size=30"])
    with pytest.raises(ConfigError, match="data.task"):
        load_config(None, ["data.task=null"])
    with pytest.raises(ConfigError, match="prompt_template"):
        load_config(None, ["data.prompt_template=no placeholder"])


def test_missing_config_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as e:
        load_config(str(missing))
    assert str(missing) in str(e.value) and "not found" in str(e.value)


def test_unknown_recipe_lists_recipes():
    with pytest.raises(ConfigError) as e:
        load_config("no_such_recipe")
    msg = str(e.value)
    assert "'no_such_recipe'" in msg
    assert DEFAULT_RECIPE in msg


def test_user_yaml_file_and_bad_yaml(tmp_path):
    good = tmp_path / "run.yaml"
    good.write_text("seed: 7\nalgorithm: {lr: 3.0e-4}\n")
    cfg = load_config(str(good))
    assert cfg.seed == 7 and cfg.algorithm.lr == 3e-4
    assert cfg.rollout.prompts_per_step == Config().rollout.prompts_per_step  # defaults fill in
    bad = tmp_path / "bad.yaml"
    bad.write_text("seed: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(bad))
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(str(scalar))
    with pytest.raises(ConfigError) as e:
        load_config(str(good), ["algorithm.lrr=1"])
    assert str(good) in str(e.value)  # errors name the file


def test_dump_round_trip(tmp_path):
    cfg = load_config(None, ["algorithm.lr=5e-5", "seed=3"])
    dump_config(cfg, tmp_path / "config.yaml")
    assert load_config(str(tmp_path / "config.yaml")) == cfg
    assert validate_config(cfg.model_dump()) == cfg


def test_moved_keys_point_to_their_new_place():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["verifier.rewards=[{name: integer_match}]", "rollout.replicas=2"])
    msg = str(e.value)
    assert "'verifier.rewards' has moved: use rewards" in msg
    assert "'rollout.replicas' has moved: use roles.generator.replicas" in msg


def test_roles_are_the_recipes():
    cfg = load_config(None, ["roles.generator.replicas=2", "roles.verifier.num_cpus=0.5"])
    assert cfg.roles["generator"].replicas == 2 and cfg.roles["generator"].model_fields_set == {"replicas"}
    with pytest.raises(ConfigError) as e:
        load_config(None, ["roles.rm_learner.num_cpus=1"])
    msg = str(e.value)
    assert "has no role 'rm_learner'" in msg and "policy_learner" in msg and "generator" in msg
    load_config("cooper", ["roles.rm_learner.num_cpus=1"])  # cooper has one
    ranks = load_config(None, ["roles.policy_learner.replicas=2", "roles.policy_learner.placement=spread",
                               "learner.strategy=fsdp2"])  # a learner runs as N ranks (docs/learners.md)
    assert ranks.roles["policy_learner"].replicas == 2 and ranks.roles["policy_learner"].placement == "spread"
    assert ranks.learner.strategy == "fsdp2"
    for bad, named in (("learner.strategy=zero3", "learner.strategy: Input should be 'ddp' or 'fsdp2' (got 'zero3')"),
                       ("roles.policy_learner.placement=strict_pack",
                        "roles.policy_learner.placement: Input should be 'pack' or 'spread' (got 'strict_pack')")):
        with pytest.raises(ConfigError) as e:
            load_config(None, [bad])
        assert named in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(None, ["roles.generator.bogus=1"])
    assert "'roles.generator.bogus'" in str(e.value) and "replicas" in str(e.value)


def test_recipe_registry_names_and_import_paths():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["recipe=nope"])
    msg = str(e.value)
    for name in ("grpo", "cooper", "prime", "reward_model"):
        assert name in msg
    assert load_config(None, ["recipe=pipelines.grpo:GRPO"]).recipe == "pipelines.grpo:GRPO"


def test_async_needs_an_explicit_off_policy_correction():
    with pytest.raises(ConfigError, match="algorithm.off_policy=tis or decoupled_ppo"):
        load_config(None, ["train.max_staleness=1"])
    cfg = load_config(None, ["train.max_staleness=1", "algorithm.off_policy=decoupled_ppo"])
    assert cfg.algorithm.off_policy == "decoupled_ppo"
    with pytest.raises(ConfigError, match="off-policy correction 'zzz'"):
        load_config(None, ["algorithm.off_policy=zzz"])


def test_group_relative_advantage_needs_two_samples():
    with pytest.raises(ConfigError, match="samples_per_prompt must be >= 2"):
        load_config(None, ["rollout.samples_per_prompt=1"])
    with pytest.raises(ConfigError, match="samples_per_prompt must be >= 2"):
        load_config(None, ["rollout.samples_per_prompt=1", "algorithm.advantage=rloo"])


def test_laser_warm_up_needs_labelled_prompts():
    assert load_config("laser").laser.warmup_steps > 0
    with pytest.raises(ConfigError, match=r"laser.warmup_steps=1200 .* verifier.fraction=0 labels none") as e:
        load_config("laser", ["verifier.fraction=0"])
    assert "got {" not in str(e.value)  # the message names the values; the whole config is not dumped
    assert load_config("laser", ["verifier.fraction=0", "laser.warmup_steps=0"]).laser.warmup_steps == 0


def test_reward_sources_and_their_cross_checks():
    with pytest.raises(ConfigError, match="set one of fn .* model .* judge, laser or env"):
        load_config(None, ["rewards=[{name: x, fn: exact_match, model: /m}]"])
    with pytest.raises(ConfigError, match="args apply to fn rewards only"):
        load_config(None, ["rewards=[{name: x, model: auto, args: {a: 1}}]"])
    with pytest.raises(ConfigError, match="verifier.accuracy_source 'rm' is not a verifier"):
        load_config(None, ["rewards=[{name: rm, model: auto}, {name: integer_match}]", "verifier.accuracy_source=rm"])
    cfg = load_config("cooper")
    assert [r.kind for r in cfg.rewards] == ["fn", "model"] and cfg.accuracy_source() == "correct"


def test_aggregate_spec_is_checked_with_the_reward_names():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["aggregate={normalize: {nope: group}}"])
    assert "aggregate" in str(e.value) and "nope" in str(e.value) and "integer_match" in str(e.value)
    with pytest.raises(ConfigError, match="rewards\\[\\].weight"):
        load_config(None, ["aggregate={weights: {integer_match: 2}}"])


def test_chunks_divide_the_batch():
    with pytest.raises(ConfigError, match="chunk_prompts=5 must divide"):
        load_config(None, ["rollout.chunk_prompts=5"])


def test_the_auto_reward_model_warmup_keeps_verifiers_and_drops_aggregation_naming_the_model():
    """`model: auto` trains a nested reward_model run; the run's gates name the reward model, which
    that nested run does not have (it crashed before this was dropped)."""
    from pipelines.stages.reward_model import warmup_config

    cfg = load_config("mixed_rewards")
    sub = warmup_config(cfg)
    assert sub.recipe == "reward_model" and [r.name for r in sub.rewards] == ["correct", "format"]
    assert sub.aggregate == {} and sub.train.max_steps == cfg.reward_model.warmup_steps
    # held-out pair accuracy once, at the end: the only one the cache keeps (each cost a quarter of it)
    assert sub.train.eval_every == sub.train.max_steps


def test_ctrl_c_while_ray_stops_keeps_a_finished_run(monkeypatch, tmp_path) -> None:
    """A Ctrl-C that lands after the run finished, while the embedded cluster shuts down, must not
    turn the run's summary into an 'interrupted' exit."""
    from orchestrator import cluster, run as run_module

    summary = {"run_dir": str(tmp_path / "run"), "steps": 3}

    async def finished(self, nested: bool = False) -> dict:
        return summary

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(run_module.Run, "main", finished)
    monkeypatch.setattr(cluster, "shutdown", interrupted)
    config = load_config(None, [f"output_dir={tmp_path / 'run'}"])
    try:
        result = run_module.run(config)
    except KeyboardInterrupt:  # re-raised, it would stop the whole test session
        pytest.fail("a Ctrl-C during the cluster's shutdown discarded the finished run")
    assert result == summary
