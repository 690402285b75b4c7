"""Configs by difference: a YAML's `base:` (a recipe name or a path beside it) with only what differs."""

from __future__ import annotations

import pytest

from orchestrator.config import ConfigError, load_config


def _write(path, text):
    path.write_text(text)
    return str(path)


def test_dapo_is_the_default_task_with_dapos_four_settings():
    """`coevo run dapo`: the same config as grpo_addition with DAPO's settings given as overrides."""
    dapo = load_config("dapo")
    by_hand = load_config("grpo_addition", [
        "algorithm.advantage=grpo", "algorithm.clip_eps_high=0.28", "algorithm.loss_agg=token_mean",
        "rollout.dynamic_sampling=true",
        "rewards=[{name: integer_match, timeout_s: 5}, {name: overlong, fn: overlong_penalty, "
        "args: {max_length: 5, cache_length: 1}}]", "verifier.accuracy_source=integer_match"])
    assert dapo.model_dump() == by_hand.model_dump()


def test_a_base_merges_mappings_and_replaces_lists_and_values(tmp_path):
    _write(tmp_path / "parent.yaml", "seed: 3\nrollout: {max_new_tokens: 6, temperature: 0.7}\n"
                                     "rewards:\n  - {name: integer_match}\n  - {name: exact_match}\n")
    child = _write(tmp_path / "child.yaml", "base: parent.yaml\nrollout: {temperature: 0.9}\n"
                                            "rewards:\n  - {name: exact_match}\n")
    config = load_config(child, ["seed=5"])
    assert (config.seed, config.rollout.max_new_tokens, config.rollout.temperature) == (5, 6, 0.9)
    assert [r.name for r in config.rewards] == ["exact_match"]


def test_a_base_by_recipe_name_and_a_chain(tmp_path):
    middle = _write(tmp_path / "middle.yaml", "base: grpo_addition\ntrain: {max_steps: 7}\n")
    child = _write(tmp_path / "child.yaml", f"base: {middle}\nalgorithm: {{lr: 3.0e-4}}\n")
    config, default = load_config(child), load_config("grpo_addition")
    assert (config.train.max_steps, config.algorithm.lr) == (7, 3e-4)
    assert config.algorithm.advantage == default.algorithm.advantage and config.model == default.model


@pytest.mark.parametrize("text, match", [
    ("base: nowhere\n", r"child.yaml: base 'nowhere': no config file or recipe named 'nowhere'"),
    ("base: [grpo_addition]\n", r"child.yaml: base must be a recipe name or a YAML path, got \['grpo_addition'\]"),
    ("base: child.yaml\n", r"child.yaml: base 'child.yaml' leads back to itself"),
])
def test_bad_bases_are_named(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match):
        load_config(_write(tmp_path / "child.yaml", text))


def test_a_circle_of_bases_is_named(tmp_path):
    _write(tmp_path / "a.yaml", "base: b.yaml\n")
    _write(tmp_path / "b.yaml", "base: a.yaml\n")
    with pytest.raises(ConfigError, match=r"base 'a.yaml' leads back to itself \(.*a.yaml -> .*b.yaml -> .*a.yaml\)"):
        load_config(str(tmp_path / "a.yaml"))
