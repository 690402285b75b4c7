"""`python`: a Python interpreter as a tool, `<python>CODE</python>` in the default format, run in
the code sandbox (actors/envs/sandbox.py: the code verifier's confinement and limits). The
observation is what the program printed (the value of a last bare expression is printed too) and,
if it failed, why (`error: timed out after 2s`, `error: exited with status 1` with its traceback's
tail). Calls of a round of turns run side by side in the sandbox's workers. The answer is the
first turn without a call, scored by the verifiers (or, with `score: true`, by its first integer
against the row's `answer`)."""

from __future__ import annotations

from actors.envs import ENVIRONMENTS
from actors.envs.base import shared, text_tool
from actors.envs.calculator import ArithmeticTask
from actors.envs.sandbox import CodeSandbox


def python_tool(workers: int = 2, wall_s: float = 2.0, cpu_time_s: float = 1.0, memory_mb: float = 256,
                max_output_chars: int = 2000, allow_missing_layers=None):
    """The `python` tool over this process's sandbox with these limits (one sandbox per setting)."""
    settings = (workers, wall_s, cpu_time_s, memory_mb, max_output_chars, tuple(allow_missing_layers or ()))
    sandbox = shared(("sandbox", settings), lambda: CodeSandbox(workers, wall_s, cpu_time_s, memory_mb,
                                                                max_output_chars, allow_missing_layers))

    def run(calls: list[dict]) -> list[str]:
        out = []
        for r in sandbox.run([c["code"] for c in calls]):
            text = r.output.rstrip("\n")
            out.append(text if r.error is None else f"error: {r.error}" + (f"\n{text}" if text else ""))
        return out

    return text_tool("python", "Run a Python program (standard library only) and see what it prints.", "code",
                     batch=run, about="Python source; the value of a last bare expression is printed")


@ENVIRONMENTS.register("python")
class Python(ArithmeticTask):
    tool_name, argument = "python", "code"

    def __init__(self, row: dict, tool_format: str = "tags", max_calls: int = 2, available: bool = True,
                 score: bool = False, workers: int = 2, wall_s: float = 2.0, cpu_time_s: float = 1.0,
                 memory_mb: float = 256, max_output_chars: int = 2000, allow_missing_layers=None):
        tool = python_tool(workers, wall_s, cpu_time_s, memory_mb, max_output_chars, allow_missing_layers)
        super().__init__(row, [tool], tool_format, max_calls, available, score)
