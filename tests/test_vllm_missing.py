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
                                          r".*pip install coevo\[vllm\]"):
        BACKENDS.get("vllm")(model, tok)
