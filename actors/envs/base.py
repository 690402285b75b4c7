"""What an environment is: one episode with one dataset row, answering each assistant turn with an
observation, an optional reward and whether the episode is done (docs/environments.md).

- `Environment`: the base. `step(turn) -> Step`; `demonstrate(observations)` may give a scripted
  assistant turn (a warm-up's demonstrations, tests); `step_batch` steps many episodes at once.
- `Tool`: a function an environment offers the policy, with a JSON schema of its arguments.
- `ToolEnvironment`: an environment whose turns either call its tools (the format of
  `env.tool_format`: actors/envs/tool_calls.py) or answer. A call runs the tool and its output is
  the observation; a malformed call, an unknown tool, arguments the schema refuses, or a tool that
  raises give an error observation (`error: ...`), never a crash. A turn without a call is the
  answer: the episode is done and `score(answer)` is its reward (None: the verifiers judge it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from actors.envs.tool_calls import TOOL_FORMATS, Call, Parsed


@dataclass
class Step:
    observation: str | None = None  # text appended to the context before the next turn (None: none)
    reward: float | None = None  # this turn's reward, if the environment gives one
    done: bool = False
    calls: int = 0  # tool calls in the turn (well-formed or not)
    errors: int = 0  # of those, the malformed ones and those that failed


class ToolError(Exception):
    """Raised by a tool for a call it cannot answer; its message becomes the observation."""


@dataclass(frozen=True)
class Tool:
    """`fn(**arguments) -> str` answers one call; `batch(list of arguments) -> list of str` (optional)
    answers many at once (the Python tool runs them side by side). An answer starting with
    `error:` counts as a failed call."""
    name: str
    description: str
    parameters: dict  # JSON schema of the arguments object
    fn: Callable[..., str] | None = None
    batch: Callable[[list[dict]], list[str]] | None = None

    def schema(self) -> dict:
        """The function schema chat templates take (`tools=[...]`)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


def text_tool(name: str, description: str, parameter: str, fn=None, batch=None, about: str = "") -> Tool:
    """A tool of one string parameter (what the `tags` format passes between its tags)."""
    return Tool(name, description, {"type": "object", "properties": {parameter: {"type": "string", "description": about}},
                                    "required": [parameter], "additionalProperties": False}, fn, batch)


class Environment:
    """One episode with one dataset row (`row`: its columns, e.g. prompt, answer). Subclasses set
    `self.tools` if they have any and implement `step`. Register with
    `@ENVIRONMENTS.register("name")` (actors/envs/__init__.py), or name the class by
    `module:Class` in `env.name`; `env.args` are its keyword arguments."""

    tools: dict[str, Tool] = {}

    def __init__(self, row: dict, **args):
        self.row = row
        if args:
            raise TypeError(f"{type(self).__name__} takes no env.args, got {sorted(args)}")

    def step(self, turn: str) -> Step:
        raise NotImplementedError

    @classmethod
    def step_batch(cls, envs: list["Environment"], turns: list[str]) -> list[Step]:
        """Step many episodes of this class at once (the generator steps every running episode of
        a piece after each round of turns)."""
        return [env.step(turn) for env, turn in zip(envs, turns)]

    def stops(self) -> list[str]:
        """Strings that end an assistant turn early (a tool call's closing tag)."""
        return []

    def demonstrate(self, observations: list[str]) -> str | None:
        """A scripted next assistant turn, given the observations so far (None: no demonstration)."""
        return None

    def close(self) -> None:
        pass


class ToolEnvironment(Environment):
    """Turns call tools or answer (see the module docstring). `tool_format`: a TOOL_FORMATS name;
    `max_calls`: calls answered per turn (more are errors); `available`: False keeps the tools
    declared (calls are recognised) but answers each with an error: the same episode without tools."""

    def __init__(self, row: dict, tools: list[Tool], tool_format: str = "tags", max_calls: int = 4,
                 available: bool = True):
        self.row = row
        self.tools = {t.name: t for t in tools}
        self.format = TOOL_FORMATS.get(tool_format)()
        self.max_calls = max_calls
        self.available = available

    def stops(self) -> list[str]:
        return self.format.stops(self.tools)

    def score(self, answer: str) -> float | None:
        """The reward of a final answer (None: the verifiers judge the response)."""
        return None

    def step(self, turn: str) -> Step:
        return self.step_batch([self], [turn])[0]

    @classmethod
    def step_batch(cls, envs: list["ToolEnvironment"], turns: list[str]) -> list[Step]:
        """Each episode's calls run in their order; the calls of a tool with a `batch` function
        (stateless, like the Python tool) are gathered over all the episodes and run at once."""
        parsed = [env.format.parse(turn, env.tools) for env, turn in zip(envs, turns)]
        answers: dict[tuple[int, int], str] = {}
        batched: dict[int, list[tuple[tuple[int, int], Tool, dict]]] = {}
        for i, (env, p) in enumerate(zip(envs, parsed)):
            for j, call in enumerate(p.calls):
                problem = env._refuse(call, j)
                tool = env.tools.get(call.name)
                if problem is not None:
                    answers[(i, j)] = problem
                elif tool.batch is not None:
                    batched.setdefault(id(tool), []).append(((i, j), tool, call.arguments))
                else:
                    answers[(i, j)] = _run(tool, [call.arguments])[0]
        for calls in batched.values():
            for key, text in zip([c[0] for c in calls], _run(calls[0][1], [c[2] for c in calls])):
                answers[key] = text
        return [env._observe(turn, p, [answers[(i, j)] for j in range(len(p.calls))])
                for i, (env, turn, p) in enumerate(zip(envs, turns, parsed))]

    def _refuse(self, call: Call, index: int) -> str | None:
        """The error observation of a call that must not run, or None."""
        if call.name not in self.tools:
            return f"error: no tool named {call.name!r}; tools: {', '.join(sorted(self.tools)) or 'none'}"
        if index >= self.max_calls:
            return f"error: at most {self.max_calls} tool calls a turn"
        if not self.available:
            return f"error: {call.name} is not available in this episode"
        from jsonschema import Draft202012Validator

        errors = sorted(Draft202012Validator(self.tools[call.name].parameters).iter_errors(call.arguments),
                        key=lambda e: list(e.path))
        if errors:
            return f"error: {call.name}: {errors[0].message}"
        return None

    def _observe(self, turn: str, parsed: Parsed, answers: list[str]) -> Step:
        if not parsed.any:
            return Step(reward=self.score(turn), done=True)
        lines = [f"error: {e}" for e in parsed.errors] + answers
        failed = len(parsed.errors) + sum(a.startswith("error:") for a in answers)
        return Step(observation="\n".join(lines), calls=len(parsed.calls) + len(parsed.errors), errors=failed)


def _run(tool: Tool, arguments: list[dict]) -> list[str]:
    """A tool's answers to calls, through its batch function where it has one; a tool that raises
    gives an error answer (a ToolError's message, else its exception's class)."""
    if tool.batch is not None:
        try:
            return [str(a) for a in tool.batch(arguments)]
        except Exception as e:  # noqa: BLE001  (a failing tool is an observation, not a crash)
            return [_failure(tool, e)] * len(arguments)
    out = []
    for args in arguments:
        try:
            out.append(str(tool.fn(**args)))
        except Exception as e:  # noqa: BLE001
            out.append(_failure(tool, e))
    return out


def _failure(tool: Tool, e: Exception) -> str:
    if isinstance(e, ToolError):
        return f"error: {e}"
    return f"error: {tool.name} failed ({type(e).__name__})"


_SHARED: dict = {}


def shared(key: Any, make: Callable[[], Any]) -> Any:
    """One object per process and key (a sandbox the episodes of a generator share)."""
    if key not in _SHARED:
        _SHARED[key] = make()
    return _SHARED[key]


def close_shared() -> None:
    """Close the shared objects (their `close()`) and forget them."""
    while _SHARED:
        _, obj = _SHARED.popitem()
        if hasattr(obj, "close"):
            obj.close()
