"""Building an episode's environment from the `env` settings and a dataset row."""

from __future__ import annotations

import inspect

from actors.envs import ENVIRONMENTS
from actors.envs.base import Environment

SET_BY_RUN = ("tool_format",)  # keyword arguments the run passes from its own settings (env.tool_format)


def environment_class(name: str) -> type[Environment]:
    cls = ENVIRONMENTS.get(name)
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise TypeError(f"env.name {name!r} is {cls!r}, not a subclass of actors.envs.base.Environment")
    return cls


def _parameters(cls: type) -> tuple[set[str], bool]:
    params = list(inspect.signature(cls.__init__).parameters.values())[2:]  # self, row
    return ({p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)},
            any(p.kind == p.VAR_KEYWORD for p in params))


def check_args(name: str, args: dict) -> None:
    """Refuse env.args the environment's constructor does not take, naming what it takes."""
    cls = environment_class(name)
    accepted, any_kwargs = _parameters(cls)
    for key in args:
        if key in SET_BY_RUN:
            raise ValueError(f"env.args.{key}: set env.{key} instead")
        if not any_kwargs and key not in accepted:
            raise ValueError(f"env.args: environment {name!r} takes no {key!r}; it takes "
                             f"{sorted(accepted - set(SET_BY_RUN)) or 'no arguments'}")


def make_environment(settings, row: dict) -> Environment:
    """The environment of one episode: `settings` is the config's `env` section."""
    cls = environment_class(settings.name)
    accepted, any_kwargs = _parameters(cls)
    args = dict(settings.args)
    if "tool_format" in accepted or any_kwargs:
        args["tool_format"] = settings.tool_format
    try:
        return cls(row, **args)
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"env {settings.name!r} refused the row with prompt_id {row.get('prompt_id')!r}: {e}") from e
