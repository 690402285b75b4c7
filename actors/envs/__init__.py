"""Environments by name (`env.name`): multi-turn episodes where each assistant turn is answered with
an observation, an optional reward and done (docs/environments.md). Built-ins: `calculator`,
`python` (a Python interpreter in the code sandbox) and `kv_store` (a stateful key-value store the
policy must query); any `module:Class` subclassing actors.envs.base.Environment works too."""

from actors.registry import Registry

ENVIRONMENTS = Registry("environment")

from actors.envs import calculator, kv_store, python_tool  # noqa: E402,F401  (register the built-ins)
