"""Running one test of code_tests: a fresh `python -I -S -B -c HARNESS` process under every kernel
layer (actors.sandbox.child), watched from outside (wall time, output cap, its whole process
group killed after), and the parent's verdict from the plain values it reported
(actors.sandbox.asserts). The child's output and messages never reach the reason: only
built-in exception class names, line numbers and limits the parent knows.
"""

from __future__ import annotations

import ast
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time

from actors.sandbox import child
from actors.sandbox.asserts import NotPlain, ProbeFailed, decode, evaluate, exception_name
from actors.sandbox.harness import HARNESS

MAX_RESULT = 1 << 20  # bytes read from a test's private result pipe (the reported values)
EXIT_FAILED, EXIT_HARNESS, EXIT_MEMORY = 1, 2, 3
NOT_PLAIN = "not a plain value"


def audit_hook_on() -> bool:
    """The in-child audit hook is on unless COEVO_CODE_TESTS_NO_AUDIT_HOOK=1 is in the environment:
    only for tests that check the kernel layers alone (a pool passes it with RewardPool(env=...))."""
    return os.environ.get("COEVO_CODE_TESTS_NO_AUDIT_HOOK") != "1"


def run_test(python: str, payload: dict, checks: list, layers: dict, wall_s: float, cpu_s: float,
             memory_mb: float, max_output: int, file_mb: float) -> tuple[bool, str | None, bool]:
    """Run one test in a fresh process: (passed, why not, whether the code ran and the test
    statements started). `layers`: child.check's result (the layers to apply)."""
    seen = run_confined(python, ["-c", HARNESS],
                        lambda fd: json.dumps({**payload, "fd": fd, "audit": audit_hook_on()}).encode(),
                        layers, wall_s, cpu_s, memory_mb, max_output, file_mb)
    return verdict(seen, checks, wall_s, cpu_s, memory_mb, max_output)


def run_confined(python: str, args: list[str], stdin, layers: dict, wall_s: float, cpu_s: float,
                 memory_mb: float, max_output: int, file_mb: float, keep: int = 2000) -> dict:
    """Run `python -I -S -B *args` in a fresh directory under every kernel layer of `layers`
    (child.check's result), feed it `stdin(fd)` (bytes; `fd` is the number of a private pipe
    the process may report on), and watch it from outside: wall time, output cap, its whole process
    group killed after. Returns what was seen: exit status `code`, the private pipe's bytes
    `result`, the last `keep` bytes of stdout+stderr `tail`, `timed_out`, `over` (the output cap).
    The one runner of untrusted code: code_tests' test processes and the environments' Python tool
    (actors/rewards/code_exec.py)."""
    directory = tempfile.mkdtemp(prefix="code-")
    r_fd, w_fd = os.pipe()
    data = stdin(w_fd)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": directory,
           "TMPDIR": directory}
    abi = layers["landlock_abi"] if "landlock_fs" in layers["holds"] else 0
    rules = child.read_rules(python) if abi else None
    limits = (os.getpid(), directory, int(memory_mb * 2**20), max(1, round(cpu_s)), int(file_mb * 2**20),
              abi, layers["seccomp"], rules)
    proc = None
    try:
        proc = subprocess.Popen(
            [python, "-I", "-S", "-B", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, cwd=directory, env=env, pass_fds=(w_fd,), start_new_session=True,
            bufsize=0, preexec_fn=lambda: child.apply(*limits))
        os.close(w_fd)
        w_fd = -1
        return _watch(proc, data, r_fd, wall_s, max_output, keep)
    finally:
        if proc is not None:
            if proc.returncode is None:  # not reaped yet (an error on the way): its group goes
                _killpg(proc.pid)
            for f in (proc.stdin, proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass
            proc.wait()
        for fd in (r_fd, w_fd):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(directory, ignore_errors=True)


def _exited(pid: int) -> bool:
    """Whether `pid` has exited, without reaping it (a zombie keeps its process group id taken, so
    killpg cannot hit a stranger)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _clean(raw: bytes, n: int = 300) -> str:
    """Printable text of the row's own messages (setup failures: before the response runs)."""
    text = raw.decode("utf-8", "replace").replace("\x00", "")
    text = "".join(c if c.isprintable() else " " for c in text).strip()
    return text if len(text) <= n else text[:n] + "..."


def _watch(proc, data: bytes, r_fd: int, wall_s: float, max_output: int, keep: int = 2000) -> dict:
    """Feed the payload, read the output (capped) and the private result pipe, until the process
    exits, the wall limit passes or the output cap is crossed; then kill its group. What the parent
    saw: exit status, the result pipe's bytes, timed out, over the output cap."""
    deadline = time.monotonic() + wall_s
    stdin, stdout = proc.stdin.fileno(), proc.stdout.fileno()
    for fd in (stdin, stdout, r_fd):
        os.set_blocking(fd, False)
    poller = select.poll()
    poller.register(stdin, select.POLLOUT)
    poller.register(stdout, select.POLLIN)
    poller.register(r_fd, select.POLLIN)
    try:
        pidfd = os.pidfd_open(proc.pid)  # readable once the process exits (Linux >= 5.3)
        poller.register(pidfd, select.POLLIN)
    except (AttributeError, OSError):
        pidfd = -1
    view = memoryview(data)
    result, tail = bytearray(), bytearray()
    output = 0
    reading = {stdout, r_fd}
    over = timed_out = False

    def take(fd: int, chunk: bytes) -> None:
        nonlocal result, tail, output
        if fd == r_fd:
            result += chunk[:max(0, MAX_RESULT - len(result))]
        else:
            output += len(chunk)
            tail = (tail + chunk)[-keep:]

    try:
        while not _exited(proc.pid):
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            wait_ms = left * 1000 if pidfd >= 0 else min(left * 1000, 20)
            for fd, _ in poller.poll(max(wait_ms, 1)):
                if fd == stdin:
                    try:
                        view = view[os.write(stdin, view[:1 << 16]):]
                    except BlockingIOError:
                        continue
                    except OSError:  # it closed its stdin: it will not read the rest
                        view = view[:0]
                    if not view:
                        poller.unregister(stdin)
                        proc.stdin.close()
                elif fd in reading:
                    try:
                        chunk = os.read(fd, 1 << 16)
                    except BlockingIOError:
                        continue
                    if chunk:
                        take(fd, chunk)
                    else:
                        poller.unregister(fd)
                        reading.discard(fd)
                elif fd == pidfd:
                    poller.unregister(pidfd)
            if output > max_output:
                over = True
                break
        _killpg(proc.pid)  # the whole group, before reaping: a running test and stragglers alike
        for fd in reading:  # what it left in its pipes before exiting
            try:
                while output <= max_output and (chunk := os.read(fd, 1 << 16)):
                    take(fd, chunk)
            except OSError:
                pass
    finally:
        if pidfd >= 0:
            os.close(pidfd)
    return {"code": proc.wait(), "result": bytes(result), "tail": bytes(tail), "timed_out": timed_out,
            "over": over or output > max_output}



# ---- the verdict ---------------------------------------------------------------------------------------
def verdict(seen: dict, checks: list, wall_s: float, cpu_s: float, memory_mb: float, max_output: int
            ) -> tuple[bool, str | None, bool]:
    """(passed, why not, tests reached). A test passes only when the process exited with status 0
    after b"E", and every assert holds on the values it reported."""
    code, result, timed_out = seen["code"], seen["result"], seen["timed_out"]
    if result.startswith(b"S") and not result.startswith(b"SC"):  # the row's setup or tests failed
        why = (f"timed out after {wall_s:g}s" if timed_out else _clean(result[2:]) if result[1:2] == b"F"
               else f"exit status {code}")
        raise ValueError(f"the row's setup or tests failed before the response's code ran: {why}")
    if not result.startswith(b"S"):  # the harness never ran: a set-up problem, not the code's fault
        if code == -signal.SIGXCPU:
            return False, _limit(code, cpu_s, memory_mb), False
        if timed_out:
            return False, f"timed out after {wall_s:g}s", False
        lines = seen["tail"].strip().splitlines()
        raise RuntimeError(f"the test process did not start (exit status {code}): "
                           f"{_clean(lines[-1]) if lines else 'no output'}")
    reached = result.startswith(b"SCT")
    state, why = _asserts(result[3:], checks) if reached else ("incomplete", None)
    if state == "fail":
        return False, why, reached
    if not reached and result[2:3] == b"F":  # the code itself raised
        failure = _failure(result[3:])
        if failure is not None and code != EXIT_MEMORY:
            return False, failure + ("" if failure.startswith("called sys.exit") else " in the code"), False
    if timed_out:
        return False, f"timed out after {wall_s:g}s", reached
    if seen["over"]:
        return False, f"wrote more than {max_output:,} bytes of output", reached
    if state == "pass" and code == 0:
        return True, None, True
    if code == EXIT_MEMORY:
        return False, f"memory limit ({memory_mb:g} MB) exceeded (MemoryError)", reached
    if code < 0:
        return False, _limit(code, cpu_s, memory_mb), reached
    if len(result) >= MAX_RESULT:
        return False, f"reported more than {MAX_RESULT:,} bytes of values", reached
    return False, f"exited with status {code} before the tests finished", reached


def _limit(code: int, cpu_s: float, memory_mb: float) -> str:
    if code == -signal.SIGXCPU:
        return f"CPU time limit ({max(1, round(cpu_s))}s) exceeded"
    if code == -signal.SIGKILL:
        return "killed (SIGKILL: CPU or memory limit?)"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = "?"
    return f"crashed (signal {-code}, {name})"


def _failure(raw: bytes) -> str | None:
    """The sanitised text of a b"F" record the response's process wrote: a built-in exception's
    class name and a line, nothing else (None if malformed)."""
    try:
        record = json.loads(raw[:200])
        name, line = record["e"], record.get("line", 0)
    except (ValueError, TypeError, KeyError, RecursionError):
        return None
    if name == "SystemExit":
        return "called sys.exit() before the tests finished"
    where = f" at line {line}" if type(line) is int and 0 < line < 1_000_000 else ""
    return exception_name(name) + where


def _asserts(body: bytes, checks: list) -> tuple[str, str | None]:
    """Evaluate the asserts on the reported values in order: ("pass", None) when every statement
    ran (b"E" after the last assert), ("fail", why) at the first failure, ("incomplete", None)
    when the record stops early (the process state then says why)."""
    pos = k = 0
    while True:
        head = body[pos:pos + 1]
        if head == b"E":
            return ("pass", None) if k == len(checks) and pos + 1 == len(body) else ("fail", "malformed report")
        if head == b"F":
            why = _failure(body[pos + 1:])
            return ("fail", why) if why is not None else ("fail", "malformed report")
        end = body.find(b"\n", pos)
        if end < 0:
            return "incomplete", None
        if k >= len(checks):
            return "fail", "malformed report"
        expr, line, fns = checks[k]
        why = _check(body[pos:end], expr, fns)
        if why is not None:
            return "fail", f"{why} at line {line}"
        k += 1
        pos = end + 1


def _check(raw: bytes, expr, fns: dict) -> str | None:
    """Why one assert fails on its reported probe values, None when it holds."""
    try:
        record = json.loads(raw)
    except (ValueError, RecursionError):
        return "malformed report"
    if type(record) is not list or len(record) != sum(
            isinstance(n, ast.Name) and n.id.startswith("<p") for n in ast.walk(expr)):
        return "malformed report"  # one entry per probe, no more: a forger gets no slack
    env = dict(fns)
    for i, entry in enumerate(record):
        if type(entry) is not list or len(entry) != 2 or entry[0] not in ("v", "e"):
            return "malformed report"
        if entry[0] == "e":
            env[f"<p{i}>"] = ProbeFailed(NOT_PLAIN if entry[1] == NOT_PLAIN else exception_name(entry[1]))
            continue
        try:
            env[f"<p{i}>"] = decode(entry[1])
        except NotPlain:
            return "malformed report"
    try:
        ok = evaluate(expr, env)
        return None if type(ok) in (bool, int, float, str, bytes, list, tuple, dict, set, frozenset,
                                    complex, type(None)) and ok else "AssertionError"
    except ProbeFailed as e:
        return "a value is not a plain value" if e.args[0] == NOT_PLAIN else e.args[0]
    except Exception as e:  # the parent's own evaluation: comparing a str with an int, say
        return exception_name(type(e).__name__)
