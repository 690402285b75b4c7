"""Running a piece of Python and reporting its output: the environments' Python tool, inside the
code sandbox (actors/envs/sandbox.py calls it through a RewardPool, like code_tests).

It runs where code_tests runs its tests: in a reward-pool worker (its own session, `nobody` when
the pool starts as root, no capabilities, Landlock, rlimits), which starts one fresh
`python -I -S -B` process per call under every kernel layer of a test process
(actors.sandbox.child: capabilities emptied, Landlock reads/writes/TCP/signals, seccomp,
rlimits) through the same runner (actors.sandbox.run_confined), watched from outside (wall time, output
cap, its process group killed after). A missing kernel layer refuses to run, as for code_tests.

What comes back is the program's output (stdout and stderr, the last `max_output_chars`
characters, made printable) and a status the parent words from what it saw (exit status, time,
limits). The output goes into the policy's context as an observation; nothing trusts it: a reward
is never computed from it.
"""

from __future__ import annotations

import sys

from actors.rewards.code import _number, kernel_layers, reward_check
from actors.sandbox import limit_reason, run_confined

# The process's program: the code arrives on stdin; the value of a last bare expression is printed
# (as a Python prompt would), so `2**10` answers 1024 without print().
HARNESS = r'''
import ast, sys
src = sys.stdin.read()
sys.stdin.close()
tree = ast.parse(src, "<tool>")
last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
ns = {"__name__": "__main__"}
exec(compile(tree, "<tool>", "exec"), ns)
if last is not None:
    value = eval(compile(ast.Expression(last.value), "<tool>", "eval"), ns)
    if value is not None:
        print(repr(value))
'''


def printable(raw: bytes, limit: int) -> str:
    """The last `limit` characters of `raw` as text a tokenizer takes: undecodable bytes replaced,
    control characters other than newline and tab dropped."""
    text = raw.decode("utf-8", "replace")
    text = "".join(c for c in text if c.isprintable() or c in "\n\t")
    return text if len(text) <= limit else "..." + text[-limit:]


def run_code(prompt: str, response: str, wall_s: float = 2.0, cpu_time_s: float = 1.0, memory_mb: float = 256,
             max_output_bytes: int = 1 << 16, file_mb: float = 16, max_output_chars: int = 2000,
             max_chars: int = 20_000, allow_missing_layers=None, **columns) -> dict:
    """Run `response` (Python source) in a fresh confined process: {"value": 1.0 if it exited
    cleanly else 0.0, "reason": None or why not, "details": {"output": its output}}. `prompt` is
    unused (the pool's sample signature)."""
    if not isinstance(response, str):
        raise TypeError(f"the code must be text, got {type(response).__name__}")
    if len(response) > max_chars:
        return {"value": 0.0, "reason": f"the code is longer than {max_chars:,} characters",
                "details": {"output": ""}}
    wall_s, cpu_time_s = _number(wall_s, "wall_s"), _number(cpu_time_s, "cpu_time_s")
    memory_mb, file_mb = _number(memory_mb, "memory_mb", 16), _number(file_mb, "file_mb")
    python = sys.executable
    layers = kernel_layers(python, allow_missing_layers)
    seen = run_confined(python, ["-c", HARNESS], lambda fd: response.encode("utf-8", "surrogatepass"), layers,
                        wall_s, cpu_time_s, memory_mb, int(max_output_bytes), file_mb, keep=4 * int(max_output_chars))
    output = printable(seen["tail"], int(max_output_chars))
    code = seen["code"]
    if seen["timed_out"]:
        reason = f"timed out after {wall_s:g}s"
    elif seen["over"]:
        reason = f"wrote more than {int(max_output_bytes):,} bytes of output"
    elif code < 0:
        reason = limit_reason(code, cpu_time_s, memory_mb)
    elif code:
        reason = f"exited with status {code}"
    else:
        reason = None
    return {"value": float(reason is None), "reason": reason, "details": {"output": output}}


run_code.reward_preload = ("subprocess", "ast", "actors.sandbox.worker", "actors.sandbox.run")
run_code.reward_check = reward_check
