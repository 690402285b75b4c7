"""Generation backends by name. `hf` (transformers, CPU or GPU) is built in."""

from actors.registry import Registry

BACKENDS = Registry("generation backend")

from actors.generation import hf  # noqa: E402,F401  (registers "hf")
