"""`kv_store`: a stateful environment. Each row holds a key-value store the policy cannot see
(`store`: a JSON object, or a mapping) and a question answerable only by querying it. Tools:
`get` (a key's value, or an error naming the missing key), `keys` (the keys, comma-separated) and
`set` (`KEY=VALUE`: writes are seen by later calls of the same episode, and only there). The
first turn without a call is the answer; the environment rewards it 1.0 when it equals the row's
`answer` (after stripping spaces), else 0.0, so `{name: env, env: true}` can be the reward."""

from __future__ import annotations

import json

from actors.envs import ENVIRONMENTS
from actors.envs.base import ToolEnvironment, ToolError, text_tool

MAX_KEYS = 1000


def load_store(value) -> dict[str, str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ValueError(f"kv_store: the row's 'store' is not JSON ({e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"kv_store: the row's 'store' must be a JSON object of keys to values, got {value!r:.80}")
    return {str(k): str(v) for k, v in value.items()}


@ENVIRONMENTS.register("kv_store")
class KVStore(ToolEnvironment):
    def __init__(self, row: dict, tool_format: str = "tags", max_calls: int = 4, available: bool = True):
        if "store" not in row:
            raise ValueError("kv_store: each row needs a 'store' column (a JSON object of keys to values); "
                             f"the row has {sorted(row)}")
        self.store = load_store(row["store"])
        tools = [text_tool("get", "The value stored under a key.", "key", fn=self.get),
                 text_tool("keys", "The keys in the store (the argument is ignored).", "pattern", fn=self.keys),
                 text_tool("set", "Store a value: KEY=VALUE.", "assignment", fn=self.set)]
        super().__init__(row, tools, tool_format, max_calls, available)
        self.queries = 0

    def get(self, key: str) -> str:
        self.queries += 1
        key = key.strip()
        if key not in self.store:
            raise ToolError(f"no key {key!r}")
        return self.store[key]

    def keys(self, pattern: str = "") -> str:
        return ",".join(sorted(self.store))

    def set(self, assignment: str) -> str:
        key, eq, value = assignment.partition("=")
        if not eq or not key.strip():
            raise ToolError("set takes KEY=VALUE")
        if key.strip() not in self.store and len(self.store) >= MAX_KEYS:
            raise ToolError(f"the store is full ({MAX_KEYS} keys)")
        self.store[key.strip()] = value.strip()
        return "ok"

    def score(self, answer: str) -> float:
        return float(answer.strip() == str(self.row.get("answer", "")).strip())

    def demonstrate(self, observations: list[str]) -> str:
        """Look the row's `key` up, then answer with its value."""
        if not observations:
            return self.format.render("get", {"key": str(self.row.get("key", ""))}, self.tools)
        return observations[-1].strip()
