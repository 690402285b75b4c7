"""Environments by name (`env.name`): multi-turn episodes where each assistant turn is answered with
an observation, an optional reward and done (docs/environments.md). Built-ins: `calculator`,
`python` (a Python interpreter in the code sandbox) and `kv_store` (a stateful key-value store the
policy must query); any `module:Class` subclassing actors.envs.base.Environment works too."""

from actors.registry import Registry

# the built-ins register themselves; their modules are imported on the first lookup
ENVIRONMENTS = Registry("environment", plugins=("actors.envs.calculator", "actors.envs.kv_store",
                                                "actors.envs.python_tool"))
