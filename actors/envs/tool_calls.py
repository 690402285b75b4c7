"""How a policy writes a tool call, by name (`env.tool_format`): each format finds the calls in an
assistant turn, reports the malformed ones (they become error observations, never a crash) and
says which strings end a turn that holds a call (the generator stops there, so the policy never
writes the observation itself).

- `tags` (the default, for tokenizers without a chat template): `<NAME>ARGUMENT</NAME>`, e.g.
  `<calc>1234*5678</calc>`. A tool whose schema has one string parameter takes the text between
  the tags as that parameter; any other tool takes a JSON object of its arguments there.
- `hermes`: the tool-call syntax of the Hermes / Qwen2.5 / Qwen3 chat templates,
  `<tool_call>{"name": "calc", "arguments": {"expression": "1234*5678"}}</tool_call>`.

A format is a class with `stops(tools)`, `parse(text, tools)` and `render(name, arguments, tools)`;
register your own with `TOOL_FORMATS.register(name)`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from actors.registry import Registry

TOOL_FORMATS = Registry("tool-call format")


@dataclass
class Call:
    name: str
    arguments: dict


@dataclass
class Parsed:
    calls: list[Call] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one message per malformed call

    @property
    def any(self) -> bool:
        return bool(self.calls or self.errors)


def single_text_parameter(tool) -> str | None:
    """The name of a tool's one string parameter (it takes the tag's text), or None."""
    props = (tool.parameters or {}).get("properties") or {}
    if len(props) == 1:
        (name, spec), = props.items()
        if isinstance(spec, dict) and spec.get("type") == "string":
            return name
    return None


@TOOL_FORMATS.register("tags")
class Tags:
    """`<NAME>ARGUMENT</NAME>`; see the module docstring."""

    def stops(self, tools: dict) -> list[str]:
        return [f"</{name}>" for name in tools]

    def render(self, name: str, arguments: dict, tools: dict) -> str:
        param = single_text_parameter(tools[name])
        body = str(arguments[param]) if param is not None else json.dumps(arguments)
        return f"<{name}>{body}</{name}>"

    def parse(self, text: str, tools: dict) -> Parsed:
        out = Parsed()
        if not tools:
            return out
        names = "|".join(re.escape(n) for n in sorted(tools, key=len, reverse=True))
        pos = 0
        for m in re.finditer(rf"<(/?)({names})>", text):
            closing, name = m.group(1) == "/", m.group(2)
            if m.start() < pos:
                continue
            if closing:
                out.errors.append(f"</{name}> without <{name}> (a call is <{name}>ARGUMENT</{name}>)")
                pos = m.end()
                continue
            end = text.find(f"</{name}>", m.end())
            if end < 0:
                out.errors.append(f"<{name}> is not closed (a call is <{name}>ARGUMENT</{name}>)")
                break
            body = text[m.end():end]
            pos = end + len(name) + 3
            param = single_text_parameter(tools[name])
            if param is not None:
                out.calls.append(Call(name, {param: body}))
                continue
            try:
                arguments = json.loads(body)
            except ValueError as e:
                out.errors.append(f"{name}: the arguments are not JSON ({e.msg} at {e.pos})")
                continue
            if not isinstance(arguments, dict):
                out.errors.append(f"{name}: the arguments must be a JSON object, got {type(arguments).__name__}")
                continue
            out.calls.append(Call(name, arguments))
        return out


@TOOL_FORMATS.register("hermes")
class Hermes:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes / Qwen chat templates)."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def stops(self, tools: dict) -> list[str]:
        return [self.CLOSE] if tools else []

    def render(self, name: str, arguments: dict, tools: dict) -> str:
        return f"{self.OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{self.CLOSE}"

    def parse(self, text: str, tools: dict) -> Parsed:
        out = Parsed()
        pos = 0
        while True:
            start = text.find(self.OPEN, pos)
            stray = text.find(self.CLOSE, pos)
            if start < 0:
                if stray >= 0:
                    out.errors.append(f"{self.CLOSE} without {self.OPEN}")
                return out
            if 0 <= stray < start:
                out.errors.append(f"{self.CLOSE} without {self.OPEN}")
            end = text.find(self.CLOSE, start)
            if end < 0:
                out.errors.append(f"{self.OPEN} is not closed")
                return out
            pos = end + len(self.CLOSE)
            body = text[start + len(self.OPEN):end].strip()
            try:
                call = json.loads(body)
            except ValueError as e:
                out.errors.append(f"the tool call is not JSON ({e.msg} at {e.pos})")
                continue
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                out.errors.append('a tool call is a JSON object {"name": ..., "arguments": {...}}')
                continue
            arguments = call.get("arguments", {})
            if isinstance(arguments, str):  # some models write the arguments as a JSON string
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    pass
            if not isinstance(arguments, dict):
                out.errors.append(f"{call['name']}: the arguments must be a JSON object")
                continue
            out.calls.append(Call(call["name"], arguments))
