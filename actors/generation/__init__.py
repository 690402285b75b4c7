"""Generation backends by name: `hf` (transformers, CPU or GPU) and `vllm` (needs vLLM installed:
docs/vllm.md; imported only when a vllm backend is built)."""

from actors.registry import Registry

# "hf" and "vllm" register themselves (vllm.py imports vLLM itself only when a backend is built)
BACKENDS = Registry("generation backend", plugins=("actors.generation.hf", "actors.generation.vllm"))
