"""Generation backends by name: `hf` (transformers, CPU or GPU) and `vllm` (needs vLLM installed:
docs/vllm.md; imported only when a vllm backend is built)."""

from actors.registry import Registry

BACKENDS = Registry("generation backend")

from actors.generation import hf  # noqa: E402,F401  (registers "hf")
from actors.generation import vllm  # noqa: E402,F401  (registers "vllm"; imports vLLM lazily)
