"""Recipe-owned config sections (orchestrator.settings): each recipe and stage brings its own
section, checked with the same typed validation and messages as the sections every run has."""

from __future__ import annotations

import pickle
import sys
import textwrap

import cloudpickle
import pytest

from orchestrator.config import Config, ConfigError, load_config, validate_config
from orchestrator.settings import config_model


def test_each_built_in_section_belongs_to_its_recipe_or_stage() -> None:
    assert "prime" in config_model("prime", Config).model_fields
    assert "iterations" in config_model("self_rewarding", Config).model_fields
    grpo = config_model("grpo", Config).model_fields  # every section a GRPO config can have
    assert "prime" not in grpo and "iterations" not in grpo
    for stage_section in ("judge", "laser", "reward_model"):  # the default stages own these
        assert stage_section in grpo
    assert "prime" not in Config.model_fields  # the common sections stay recipe-free


JUDGED = [{"name": "ok", "fn": "integer_match"}, {"name": "j", "judge": True}]


def test_a_config_holds_only_the_sections_of_the_stages_it_can_run() -> None:
    stage_sections = {"judge", "laser", "reward_model"}
    expected = {"grpo_addition": set(), "dapo": set(), "self_judged_grpo": {"judge"}, "spark": {"judge"},
                "spc": {"judge"}, "self_rewarding": {"judge"}, "laser": {"laser"}, "cooper": {"reward_model"},
                "mixed_rewards": {"reward_model"},
                # recipes that read reward_model without a `model:` source own it themselves
                "reward_model": {"reward_model"}, "prime": {"reward_model"}}
    for recipe, sections in expected.items():
        cfg = load_config(recipe)
        assert stage_sections & set(type(cfg).model_fields) == sections, recipe
        assert stage_sections & set(cfg.model_dump()) == sections, recipe  # and so its saved config.yaml
    # a judge reward source brings the judge section (and its settings) into a GRPO config
    cfg = load_config(None, [f"rewards={JUDGED}".replace("'", ""), "judge.warmup_steps=5"])
    assert cfg.judge.warmup_steps == 5 and "laser" not in type(cfg).model_fields


def test_a_stage_section_set_without_its_reward_source_is_named() -> None:
    for override, kind in (("judge.warmup_steps=5", "judge"), ("laser.beta=0.5", "laser"),
                           ("reward_model.lr=0.001", "model")):
        with pytest.raises(ConfigError) as err:
            load_config("grpo_addition", [override])
        key, _, value = override.partition("=")
        section = key.split(".")[0]
        assert (f"section {section!r} sets {key}={float(value) if '.' in value else int(value)!r} (on the command "
                f"line), but it is read only with a {kind} reward source") in str(err.value)
        assert "this config's rewards lack (their kinds: fn); add one, or drop the section" in str(err.value)
    with pytest.raises(ConfigError) as err:  # from a file, the value as read, no such key named
        validate_config({"recipe": "grpo", "laser": {"beta": 0.25, "bogus": 3, "mse_weight": "2"}})
    assert "sets laser.bogus=3 (no such key), laser.mse_weight=2.0, but" in str(err.value)  # beta=0.25: a default
    # a shipped recipe's section, dropped for a verifier-only baseline: `judge=null`, as the message says
    with pytest.raises(ConfigError, match=r"judge.warmup_steps=300, but .* or drop the section \(judge=null"):
        load_config("self_judged_grpo", ["rewards=[{name: correct, fn: integer_match}]"])
    cfg = load_config("self_judged_grpo", ["rewards=[{name: correct, fn: integer_match}]", "judge=null"])
    assert "judge" not in type(cfg).model_fields
    with pytest.raises(ConfigError, match="judge.warmup_steps=5 .on the command line"):  # validation's reading
        load_config(None, ['rewards=[{name: ok, fn: integer_match}, {name: j, fn: integer_match, judge: "false", weight: 0}]', "judge.warmup_steps=5"])
    with pytest.raises(ConfigError) as err:  # a recipe that owns the section names what it lacks itself
        load_config("cooper", ["rewards=[{name: correct, fn: integer_match}]", "aggregate={}"])
    assert "recipe cooper needs a reward model among rewards" in str(err.value)


def test_a_saved_config_with_unused_default_sections_still_loads() -> None:
    """A run's config.yaml from before sections depended on the rewards holds every stage's section at
    its defaults: it loads (so --resume works), without them."""
    from pipelines.stages.judge import JudgeConfig
    from pipelines.stages.laser import LaserConfig
    from pipelines.stages.reward_model import RewardModelConfig
    old = load_config("grpo_addition").model_dump(mode="json")
    old.update(judge=JudgeConfig().model_dump(mode="json"), laser=LaserConfig().model_dump(mode="json"),
               reward_model=RewardModelConfig().model_dump(mode="json"))
    cfg = validate_config(old)
    assert not {"judge", "laser", "reward_model"} & set(type(cfg).model_fields)
    assert cfg == load_config("grpo_addition")
    old["judge"]["warmup_steps"] = 7  # but a value someone set is not dropped quietly
    with pytest.raises(ConfigError, match="judge.warmup_steps=7"):
        validate_config(old)


def test_another_recipes_section_is_named_with_its_owner() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, ["prime.beta=0.1"])
    assert "section 'prime' belongs to recipe prime, not to recipe 'grpo'" in str(err.value)


def test_unknown_and_mistyped_keys_in_a_recipe_section() -> None:
    with pytest.raises(ConfigError) as err:
        load_config("self_rewarding", ["iterations.rounds=2"])
    assert "unknown key 'iterations.rounds'; accepted keys here: iterations, prompts, epochs" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config("prime", ["prime.beta=-1"])
    assert "prime.beta: Input should be greater than 0 (got -1)" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config("prime", ["prime.label_source=nope"])
    assert "prime.label_source 'nope' is not a verifier (fn) reward" in str(err.value)


def test_a_recipe_config_survives_pickling_with_its_class_and_values() -> None:
    cfg = load_config("prime", ["prime.beta=0.2"])
    for dumps in (pickle.dumps, cloudpickle.dumps):
        back = pickle.loads(dumps(cfg))
        assert type(back) is type(cfg) and back == cfg and back.prime.beta == 0.2


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A user recipe module on sys.path, as `recipe: my_recipe:Mine` would import it."""
    def write(body: str, name: str = "my_recipe") -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
        sys.modules.pop(name, None)
        return name
    monkeypatch.syspath_prepend(str(tmp_path))
    yield write
    config_model.cache_clear()


def test_a_user_recipe_brings_its_own_section(user_module) -> None:
    name = user_module("""
        from pydantic import Field
        from orchestrator.config import Section
        from pipelines.grpo import GRPO

        class MineConfig(Section):
            alpha: float = Field(0.5, gt=0)
            mode: str = "fast"

        class Mine(GRPO):
            settings = {"mine": MineConfig}
    """)
    cfg = validate_config({"recipe": f"{name}:Mine", "mine": {"alpha": 2}, "rewards": JUDGED})
    assert cfg.mine.alpha == 2.0 and cfg.mine.mode == "fast" and cfg.judge.yes == "Y"
    assert pickle.loads(cloudpickle.dumps(cfg)) == cfg
    with pytest.raises(ConfigError) as err:
        validate_config({"recipe": f"{name}:Mine", "mine": {"alpah": 2}})
    assert "unknown key 'mine.alpah'; accepted keys here: alpha, mode" in str(err.value)
    with pytest.raises(ConfigError) as err:
        validate_config({"recipe": f"{name}:Mine", "mine": {"alpha": "much"}})
    assert "mine.alpha: Input should be a valid number" in str(err.value)
    with pytest.raises(ConfigError) as err:  # GRPO itself has no such section
        validate_config({"recipe": "grpo", "mine": {"alpha": 2}})
    assert "unknown key 'mine'" in str(err.value)


def test_a_user_recipe_may_not_redefine_a_common_section(user_module) -> None:
    name = user_module("""
        from orchestrator.config import Section
        from pipelines.grpo import GRPO

        class Mine(GRPO):
            settings = {"train": Section}
    """, name="my_bad_recipe")
    with pytest.raises(ConfigError) as err:
        validate_config({"recipe": f"{name}:Mine"})
    assert f"recipe '{name}:Mine': {name}.Mine.settings: 'train' is a section every run has" in str(err.value)


def test_a_recipe_without_the_judge_stage_cannot_take_judge_rewards(user_module) -> None:
    name = user_module("""
        from pipelines.grpo import GRPO

        class NoJudge(GRPO):
            stage_names = ("sft",)
    """, name="my_nojudge_recipe")
    ok = validate_config({"recipe": f"{name}:NoJudge"})
    assert "judge" not in type(ok).model_fields and "laser" not in type(ok).model_fields
    with pytest.raises(ConfigError) as err:
        validate_config({"recipe": f"{name}:NoJudge",
                         "rewards": [{"name": "ok", "fn": "integer_match"}, {"name": "j", "judge": True}]})
    assert "rewards[j]: a judge reward needs the 'judge' settings" in str(err.value)


def test_a_user_recipe_that_cannot_import_is_named() -> None:
    with pytest.raises(ConfigError) as err:
        validate_config({"recipe": "no_such_module_xyz:Recipe"})
    assert "recipe 'no_such_module_xyz:Recipe'" in str(err.value) and "no_such_module_xyz" in str(err.value)
