"""docs/configuration.md is generated from the pydantic models (scripts/config_reference.py); this
fails when a model changed and the reference was not regenerated."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_script():
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "scripts" / "config_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_configuration_reference_is_current() -> None:
    text = load_script().render()
    assert (ROOT / "docs" / "configuration.md").read_text() == text, (
        "docs/configuration.md is stale: run `python scripts/config_reference.py`")


def test_the_reference_names_every_section_and_key() -> None:
    text = load_script().render()
    for key in ("`train.max_staleness`", "`rewards[].timeout_s`", "`roles.<name>.timeout_s`",
                "`prime.beta`", "`iterations.cream`", "`judge.mode`", "`laser.token`", "`reward_model.margin`"):
        assert key in text, key
    assert "## `prime` (declared by recipe `prime`)" in text
    assert "## `judge` (declared by stage `judge`, recipe `self_rewarding`" in text
