"""Reward functions by name (built-ins) or by `module:function` path (user code).

A reward function scores one sample: `fn(prompt: str, response: str, **columns) -> float`, where
`columns` are the dataset's pass-through columns (e.g. `answer`).
"""

from actors.registry import Registry

REWARD_FUNCTIONS = Registry("reward function")

from actors.rewards import builtins  # noqa: E402,F401  (registers the built-ins)
