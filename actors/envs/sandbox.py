"""The one door from the environments to the code sandbox: `CodeSandbox.run(codes)`.

Environments never touch the sandbox's parts; they hand source code here and get back what it
printed and why it failed. Behind this door is the code verifier's own machinery, the sandbox
package's interface (actors/sandbox/__init__.py): a `RewardPool` (zygote-forked workers, `nobody`,
no capabilities, Landlock, rlimits, process groups killed on timeout, JSON-only replies) running
`actors.rewards.code_exec:run_code`, which starts one process per call under every kernel layer
of code_tests' test processes through the same runner (actors.sandbox.run_confined). So the
Python tool has the same confinement and the same limits as code_tests.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

SOURCE = "python_tool"
FUNCTION = "actors.rewards.code_exec:run_code"


@dataclass
class CodeRun:
    output: str  # what the program printed (stdout and stderr), possibly cut to its tail
    error: str | None  # None: it exited cleanly; else why not (timed out, a limit, exit status N, ...)


class CodeSandbox:
    """Runs Python source in the code sandbox, several programs side by side. The pool (a zygote
    process) starts at the first run; `close()` ends it."""

    def __init__(self, workers: int = 2, wall_s: float = 2.0, cpu_time_s: float = 1.0, memory_mb: float = 256,
                 max_output_chars: int = 2000, allow_missing_layers=None, env: dict | None = None):
        self.workers = workers
        self.limits = {"wall_s": wall_s, "cpu_time_s": cpu_time_s, "memory_mb": memory_mb,
                       "max_output_chars": max_output_chars}
        if allow_missing_layers:
            self.limits["allow_missing_layers"] = list(allow_missing_layers)
        self.env = dict(env or {})
        self._pool = None
        self._lock = threading.Lock()

    def _started(self):
        from actors.sandbox import RewardPool

        with self._lock:
            if self._pool is None:
                self._pool = RewardPool({SOURCE: FUNCTION}, workers=self.workers, env=self.env)
                self._pool.start()
            return self._pool

    def run(self, codes: list[str]) -> list[CodeRun]:
        """One CodeRun per program, in order. A program the pool could not run at all (its worker
        died, the pool's own time limit) comes back with that reason as its error."""
        if not codes:
            return []
        pool = self._started()
        limit = self.limits["wall_s"] + 5.0  # the pool's per-sample limit: the worker's own start-up on top
        results = pool.score([(SOURCE, {"prompt": "", "response": code, **self.limits}) for code in codes],
                             {SOURCE: limit})
        out = []
        for value, error in results:
            if value is None:
                out.append(CodeRun("", error or "the sandbox gave no result"))
            else:
                details = getattr(value, "details", None) or {}
                out.append(CodeRun(str(details.get("output", "")), getattr(value, "reason", None)))
        return out

    @property
    def isolation(self) -> dict:
        """The layers the sandbox's workers and processes hold (after the first run)."""
        return dict(self._pool.isolation) if self._pool is not None else {}

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None
