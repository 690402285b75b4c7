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
    grpo = config_model("grpo", Config).model_fields
    assert "prime" not in grpo and "iterations" not in grpo
    for stage_section in ("judge", "laser", "reward_model"):  # the default stages own these
        assert stage_section in grpo
    assert "prime" not in Config.model_fields  # the common sections stay recipe-free


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
    cfg = validate_config({"recipe": f"{name}:Mine", "mine": {"alpha": 2}})
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
