"""`model.path` checked before Ray starts: a local directory holding what the actors' loader
(actors.modeling: AutoModelForCausalLM + AutoTokenizer, local files only) needs, so that a wrong
path costs one message and exit 2 rather than a cluster start and a traceback from every actor."""

from __future__ import annotations

import json
import re
from pathlib import Path

from orchestrator.config import ConfigError

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
# A tokenizer's vocabulary lives in one of these; without any, transformers 5 builds an empty
# tokenizer (vocabulary size 1) instead of failing, and the run would train on nonsense.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def check_model_dir(value: str) -> Path:
    path = Path(value).expanduser()
    if not path.is_dir():
        if not path.exists() and HUB_ID.match(value):
            raise ConfigError(f"model.path {value!r} is not a local directory; it looks like a model hub id, and "
                              f"coevo does not fetch from a hub: download the model to a directory first "
                              f"(e.g. `hf download {value} --local-dir models/{value.split('/')[1]}`) and set "
                              "model.path to that directory")
        raise ConfigError(f"model.path {value!r} is not a directory")
    what = f"model.path {str(path)!r}"
    config = path / "config.json"
    try:
        model_type = json.loads(config.read_text()).get("model_type")
    except FileNotFoundError:
        raise ConfigError(f"{what} has no config.json: it is not a Hugging Face model directory "
                          "(one written by save_pretrained)") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"{what}: config.json is not readable JSON ({e})") from None
    if not model_type:
        raise ConfigError(f"{what}: config.json has no 'model_type', so transformers cannot tell the architecture")
    _check_weights(path, what)
    _check_tokenizer(path, what)
    return path


def _check_weights(path: Path, what: str) -> None:
    if any((path / name).is_file() for name in WEIGHT_FILES):
        return
    for index in WEIGHT_INDEXES:
        if (path / index).is_file():
            try:
                shards = set(json.loads((path / index).read_text())["weight_map"].values())
            except (OSError, ValueError, KeyError, AttributeError) as e:
                raise ConfigError(f"{what}: {index} is not a valid weight index ({e!r})") from None
            missing = sorted(s for s in shards if not (path / s).is_file())
            if missing:
                raise ConfigError(f"{what}: {index} lists weight files that are not there: {missing[:3]}"
                                  + (f" and {len(missing) - 3} more" if len(missing) > 3 else ""))
            return
    raise ConfigError(f"{what} holds no model weights (expected one of {', '.join(WEIGHT_FILES + WEIGHT_INDEXES)})")


def _check_tokenizer(path: Path, what: str) -> None:
    from transformers import AutoTokenizer

    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(f"{what} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); save the model's "
                          "tokenizer into the same directory (tokenizer.save_pretrained)")
    try:
        AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # noqa: BLE001  (transformers raises many kinds; one message names them)
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{what}: no usable tokenizer there ({reason}); save the model's tokenizer into the same "
                          "directory (tokenizer.save_pretrained)") from None
