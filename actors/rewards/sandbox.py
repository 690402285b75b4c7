"""Runs reward functions in a child process with a per-sample time limit.

A function that hangs past its limit gets the child killed; that sample is marked timed out, a new
child starts and the remaining samples go on. Nothing the user function does can stop the actor.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import subprocess
import sys
import time
from pathlib import Path

from actors.rewards.worker import write_frame

ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 60.0


class RewardSandbox:
    def __init__(self, functions: dict[str, str]):
        """`functions` maps a reward source name to a registry name or `module:function`."""
        self.functions = functions
        self.proc: subprocess.Popen | None = None
        self.restarts = 0

    def _start(self) -> subprocess.Popen:
        env = dict(os.environ)
        # The child must import coevo and the user's modules exactly as this process does.
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *sys.path])
        # Unbuffered stdout: `select` must see every byte that has not been consumed yet.
        proc = subprocess.Popen([sys.executable, "-m", "actors.rewards.worker"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env=env, cwd=os.getcwd(), bufsize=0)
        write_frame(proc.stdin, self.functions)
        self.proc = proc
        # Start-up (imports) does not count against the first sample's time limit.
        if self._read(time.monotonic() + STARTUP_TIMEOUT_S) != "ready":
            self.close()
            raise RuntimeError(f"reward process failed to start for {self.functions} "
                               "(see the traceback above in this actor's log)")
        return proc

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def _read(self, deadline: float):
        """One reply frame, "timeout" if none arrives by `deadline`, or "died"."""
        fd = self.proc.stdout.fileno()
        data = b""
        need = 4
        while len(data) < need:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return "timeout"
            chunk = os.read(fd, need - len(data))
            if not chunk:
                return "died"
            data += chunk
            if need == 4 and len(data) == 4:
                need = 4 + struct.unpack("<I", data)[0]
        return pickle.loads(data[4:])

    def score(self, items: list[tuple[str, dict]], timeouts: dict[str, float]
              ) -> list[tuple[float | None, str | None]]:
        """Score `(source, kwargs)` items in order; returns (value, error) per item."""
        results: list[tuple[float | None, str | None]] = []
        while len(results) < len(items):
            if self.proc is None or self.proc.poll() is not None:
                self.proc = self._start()
            pending = items[len(results):]
            write_frame(self.proc.stdin, pending)
            for source, _ in pending:
                limit = timeouts[source]
                reply = self._read(time.monotonic() + limit)
                if isinstance(reply, tuple):
                    results.append(reply)
                    continue
                why = (f"timed out after {limit:g}s" if reply == "timeout" else
                       f"reward process died (exit code {self.proc.poll()})")
                results.append((None, why))
                self.close()
                self.restarts += 1
                break
        return results
