"""model.path is checked before Ray starts: a directory that is not a loadable model, or a hub id,
stops with one message that says what is missing and what to do."""

from __future__ import annotations

import json

import pytest

from actors.modeling import char_tokenizer, tiny_model
from orchestrator.config import ConfigError
from orchestrator.model_check import check_model_dir


@pytest.fixture
def model_dir(tmp_path):
    tok = char_tokenizer()
    path = tmp_path / "model"
    model = tiny_model(tok, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_a_saved_model_passes(model_dir) -> None:
    assert check_model_dir(str(model_dir)) == model_dir


def test_hub_id_is_not_fetched(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        check_model_dir("Qwen/Qwen2.5-0.5B")
    msg = str(e.value)
    assert "hub id" in msg and "does not fetch" in msg and "hf download Qwen/Qwen2.5-0.5B --local-dir" in msg


def test_directory_without_config(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"has no config\.json"):
        check_model_dir(str(tmp_path))


def test_unreadable_config(model_dir) -> None:
    (model_dir / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"config\.json is not readable JSON"):
        check_model_dir(str(model_dir))


def test_missing_weights(model_dir) -> None:
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match="holds no model weights"):
        check_model_dir(str(model_dir))


def test_sharded_weights_with_a_missing_shard(model_dir) -> None:
    (model_dir / "model.safetensors").rename(model_dir / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigError, match=r"not there: \['model-00002-of-00002\.safetensors'\]"):
        check_model_dir(str(model_dir))


def test_missing_tokenizer(model_dir) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (model_dir / name).unlink(missing_ok=True)
    with pytest.raises(ConfigError, match="holds no tokenizer"):
        check_model_dir(str(model_dir))


def test_a_corrupt_tokenizer_file(model_dir) -> None:
    (model_dir / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError, match="no usable tokenizer there"):
        check_model_dir(str(model_dir))
