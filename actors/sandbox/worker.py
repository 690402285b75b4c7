"""Zygote and worker processes of the reward pool (started by actors.sandbox.pool).

`python -m actors.sandbox.worker FD` is the zygote: a fresh single-threaded process that reads its
settings (one pickle) from the SOCK_SEQPACKET control socket FD, imports the reward functions once,
answers {"ready": ...}, then forks a worker for each {"spawn": id} request, which carries the
worker's two pipe ends as SCM_RIGHTS. Forking a process that already imported everything costs a
few milliseconds and shares its memory copy-on-write. The zygote reports each worker's pid and
exit status, removes its directory and kills any process a dead worker left behind. Everything it
sends back is a JSON object; it exits, killing its workers, when the pool closes the socket.

A worker isolates itself (actors.sandbox.limits), then reads tasks on fd 3: length-prefixed
pickles ("items", [(seq, source, kwargs), ...]) or ("drop", seq) (forget queued items after seq:
the pool gave them to another worker; answered {"dropped": 1}, so the pool knows the worker is
not busy with any of them). For each item, in order, it writes one JSON line on fd 4: {"s": seq,
"v": value} or {"s": seq, "e": "why"} ({"s": seq, "v": value, "x": {"reason": ..., "details": ...}}
for a sample function that returns a Scored float or {"value", "reason", "details"}: a reward with
what it says about the sample). Its stdin, stdout and stderr are /dev/null, so whatever user code
prints (from Python or straight to fd 1 or 2) cannot reach the channel, fill memory or block. The
pool only parses and validates these lines; it never unpickles them.
"""

from __future__ import annotations

import fcntl
import gc
import json
import math
import numbers
import os
import pickle
import resource
import select
import shutil
import signal
import socket
import struct
import sys
import tempfile
import traceback
from collections import deque

from actors.sandbox import limits

TASK_FD, RESULT_FD = 3, 4
MAX_ERROR = 2000  # characters of an error message
FRAME = struct.Struct("<I")


def encode_frame(obj) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return FRAME.pack(len(data)) + data


# ---- running one user call -----------------------------------------------------------------------
def _short(value) -> str:
    try:
        text = repr(value)
    except Exception:  # user __repr__ can fail too
        text = f"<unprintable {type(value).__name__}>"
    return text if len(text) <= 200 else text[:200] + "..."


def _number(value) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, numbers.Real):  # numpy scalars are Real too
        return None
    try:
        value = float(value)
    except (OverflowError, ValueError):
        return None
    return value if math.isfinite(value) else None


class Scored(float):
    """A sample reward with a `reason` (text: why it is not full marks, say) and `details` (JSON
    data, e.g. the per-test passes the Verifier turns into VeRPO weights). It is the float it holds,
    so a function returning one can be called directly too. A function may also return the dict
    {"value", "reason", "details"}; the pool hands back a Scored either way."""

    def __new__(cls, value: float, reason: str | None = None, details=None):
        self = super().__new__(cls, value)
        self.reason, self.details = reason, details
        return self

    def __reduce__(self):
        return Scored, (float(self), self.reason, self.details)

    def __repr__(self):
        return f"Scored({float(self)!r}, reason={self.reason!r}, details={self.details!r})"


MAX_DETAILS = 1 << 16  # bytes of a detailed result's `details`, as JSON
DETAIL_HINT = ('a reward with details is {"value": finite number, "reason": text or None, '
               '"details": JSON-able data or None}')


def _detailed(value: dict) -> tuple[dict | None, str | None]:
    """A sample reward returned as a dict: ({"v": number, "x": {"reason", "details"}}, None) or
    (None, why it is refused). The pool rebuilds it as a `sandbox.Scored` float."""
    if "value" not in value or set(value) - {"value", "reason", "details"}:
        return None, f"returned {_short(value)}; {DETAIL_HINT}"
    number = _number(value["value"])
    if number is None:
        return None, f"returned value {_short(value['value'])}; {DETAIL_HINT}"
    extra = {}
    reason = value.get("reason")
    if reason is not None:
        if not isinstance(reason, str):
            return None, f"returned reason {_short(reason)}; {DETAIL_HINT}"
        extra["reason"] = reason[:MAX_ERROR].encode("utf-8", "replace").decode("utf-8")
    if value.get("details") is not None:
        try:
            size = len(json.dumps(value["details"], allow_nan=False))
        except (TypeError, ValueError, RecursionError) as e:
            return None, f"returned details that are not JSON ({type(e).__name__}: {e}); {DETAIL_HINT}"
        if size > MAX_DETAILS:
            return None, f"returned {size:,} bytes of details, over {MAX_DETAILS:,}; {DETAIL_HINT}"
        extra["details"] = value["details"]
    return {"v": number, "x": extra}, None


def _group_values(value, n: int, what: str = "group") -> tuple[list[float] | None, str | None]:
    hint = (f"a group reward must return a list of {n} finite numbers, one per response" if what == "group"
            else f"a process reward must return a list of {n} finite numbers, one per step")
    if isinstance(value, (str, bytes, dict)) or not (hasattr(value, "__len__") and hasattr(value, "__iter__")):
        return None, f"returned {_short(value)}; {hint}"
    values = list(value)
    if len(values) != n:
        return None, f"returned {len(values)} values for {n} {'responses' if what == 'group' else 'steps'}; {hint}"
    out = []
    for i, v in enumerate(values):
        number = _number(v)
        if number is None:
            return None, f"returned {_short(v)} at position {i}; {hint}"
        out.append(number)
    return out, None


class Limits:
    """What the worker needs to word errors and set per-sample limits."""

    def __init__(self, memory_mb: int | None, cpu_time_s: float | None):
        self.memory_mb = memory_mb
        self.cpu_time_s = cpu_time_s


def call(fn, scope: str, kwargs: dict, lim: Limits, me: int) -> tuple[object, str | None, bool]:
    """Run one user call: (value, error, recycle). `recycle` asks for a fresh process afterwards."""
    if lim.cpu_time_s is not None:
        used = resource.getrusage(resource.RUSAGE_SELF)
        soft = math.ceil(used.ru_utime + used.ru_stime + lim.cpu_time_s)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.RLIM_INFINITY))
    recycle = False
    try:
        value = fn(**kwargs)
        error = None
    except MemoryError:
        value, recycle = None, True  # the heap may be in a bad state: start clean
        error = (f"memory limit ({lim.memory_mb} MB) exceeded (MemoryError)" if lim.memory_mb
                 else "MemoryError")
    except SystemExit as e:
        value, error = None, f"called sys.exit({e.code!r}); a reward function must return a value"
    except BaseException as e:  # any user failure becomes that sample's error, KeyboardInterrupt too
        value, error = None, _describe(e)
    if os.getpid() != me:
        os._exit(0)  # a process the user code forked returned here: it must not touch the channel
    if error is None:
        if scope == "group":
            value, error = _group_values(value, len(kwargs.get("responses") or ()))
        elif scope == "process":
            value, error = _group_values(value, len(kwargs.get("steps") or ()), "process")
        elif isinstance(value, float) and hasattr(value, "details"):  # a Scored (of any copy of this
            # module: the zygote runs it as __main__): a value with a reason and details
            value, error = _detailed({"value": float(value), "reason": getattr(value, "reason", None),
                                      "details": value.details})
        elif isinstance(value, dict):
            value, error = _detailed(value)
        else:
            number = _number(value)
            value, error = number, (None if number is not None
                                    else f"returned {_short(value)}; a reward must be a finite number")
    if _kill_leftovers(me):
        recycle = True
    return value, error, recycle


def _describe(e: BaseException) -> str:
    try:
        tb = traceback.extract_tb(e.__traceback__)
        where = f" (at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno})" if tb else ""
        return f"{type(e).__name__}: {e}{where}"
    except Exception:  # an exception whose __str__ fails
        return f"{type(e).__name__} (unprintable)"


def _kill_leftovers(me: int) -> bool:
    """Kill processes the call started and left running (the worker is a subreaper, so even
    daemonized ones are its children). True when some could not be cleared."""
    try:
        os.waitpid(-1, os.WNOHANG)  # also reaps a child that exited without being waited for
    except ChildProcessError:
        return False  # the common case: no children at all, one syscall
    for _ in range(50):
        kids = limits.child_pids(me)
        if not kids:
            return False
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in kids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
    return True


def reply_line(seq: int, value, error: str | None, recycle: bool) -> bytes:
    bye = ',"bye":1' if recycle else ""
    if error is not None:
        return (json.dumps({"s": seq, "e": error[:MAX_ERROR]})[:-1] + bye + "}\n").encode()
    if isinstance(value, list):
        return f'{{"s":{seq},"v":[{",".join(map(repr, value))}]{bye}}}\n'.encode()
    if isinstance(value, dict):  # {"v": number, "x": {...}} from _detailed
        return (json.dumps({"s": seq, **value}, allow_nan=False)[:-1] + bye + "}\n").encode()
    return f'{{"s":{seq},"v":{value!r}{bye}}}\n'.encode()  # repr of a finite float is valid JSON


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


# ---- worker ----------------------------------------------------------------------------------------
def serve(fns: dict, scopes: dict, lim: Limits) -> None:
    """Answer tasks on TASK_FD until the pool closes it."""
    me = os.getpid()
    buf = bytearray()
    queue: deque = deque()
    poller = select.poll()
    poller.register(TASK_FD, select.POLLIN)

    def take_messages(block: bool) -> None:
        if not block and not poller.poll(0):
            return
        chunk = os.read(TASK_FD, 1 << 20)
        if not chunk:
            os._exit(0)  # the pool closed our pipe
        buf.extend(chunk)
        while len(buf) >= 4:
            (size,) = FRAME.unpack_from(buf)
            if len(buf) < 4 + size:
                break
            message = pickle.loads(bytes(buf[4:4 + size]))  # from the pool, which we trust
            del buf[:4 + size]
            if message[0] == "items":
                queue.extend(message[1])
            elif message[0] == "drop":  # keep the head the pool still counts on, if not started
                kept = [entry for entry in queue if entry[0] <= message[1]]
                queue.clear()
                queue.extend(kept)
                _write_all(RESULT_FD, b'{"dropped":1}\n')  # the pool may give us work again

    while True:
        take_messages(block=not queue)
        if not queue:
            continue
        seq, source, kwargs = queue.popleft()
        value, error, recycle = call(fns[source], scopes[source], kwargs, lim, me)
        _write_all(RESULT_FD, reply_line(seq, value, error, recycle))
        if recycle:
            os._exit(0)


def _setup_worker(task_fd: int, result_fd: int, st: dict, iso: dict, zygote: int, out: list) -> None:
    """Isolate this freshly forked process; see actors.sandbox.limits for what each step stops.
    `out[0]` is where to report a failure (the result fd moves to RESULT_FD on the way)."""
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    os.setsid()  # own process group: the pool kills it and all it started with one killpg
    limits.prctl(limits.PR_SET_CHILD_SUBREAPER, 1)  # orphans of user code stay ours to kill
    # Channel on fds 3 and 4, /dev/null on 0-2, nothing else open (dup first: the fds may collide).
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (task_fd, result_fd)]
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.dup2(high[0], TASK_FD)
    os.dup2(high[1], RESULT_FD)
    out[0] = RESULT_FD
    os.closerange(RESULT_FD + 1, os.sysconf("SC_OPEN_MAX"))
    os.set_blocking(TASK_FD, True)
    os.set_blocking(RESULT_FD, True)

    directory = os.path.join(st["base_dir"], f"w{os.getpid()}")
    os.mkdir(directory, 0o700)
    if iso.get("uid") is not None:
        os.chown(directory, iso["uid"], iso["gid"])
    os.chdir(directory)
    os.environ["HOME"] = os.environ["TMPDIR"] = directory
    tempfile.tempdir = None
    limits.set_rlimits(st["memory_mb"], st["file_mb"], st["max_files"],
                       st["max_processes"] if iso.get("uid") is not None else None)
    limits.no_new_privs()
    _apply_identity(iso)
    # After the uid change, which clears it: die with the zygote (and so with the pool).
    limits.prctl(limits.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != zygote:
        os._exit(0)
    if iso.get("landlock_abi"):
        limits.landlock_confine(iso["landlock_abi"], [directory], [os.devnull])


def _worker_main(task_fd, result_fd, fns, scopes, st, iso, zygote) -> None:
    out = [result_fd]
    try:
        _setup_worker(task_fd, result_fd, st, iso, zygote, out)
    except BaseException as e:
        line = json.dumps({"fatal": f"worker setup failed: {type(e).__name__}: {e}"[:MAX_ERROR]})
        try:
            _write_all(out[0], (line + "\n").encode())
        except OSError:
            pass
        os._exit(70)
    _write_all(RESULT_FD, b'{"ready":1}\n')
    serve(fns, scopes, Limits(st["memory_mb"], st["cpu_time_s"]))


# ---- zygote ----------------------------------------------------------------------------------------
def _apply_identity(iso: dict) -> None:
    mode = iso.get("mode")
    if mode == "nobody":
        limits.drop_to(iso["uid"], iso["gid"])
    elif mode == "no_caps":
        limits.drop_capabilities()


def _readable(path: str, search_only: bool = False) -> bool:
    """Really try (os.access ignores capabilities)."""
    try:
        if os.path.isdir(path):
            os.stat(os.path.join(path, "."))
            if not search_only:
                os.listdir(path)
        else:
            os.close(os.open(path, os.O_RDONLY))
        return True
    except OSError:
        return False


def _probe(iso: dict, base_dir: str) -> list[str]:
    """Apply `iso` in a throwaway child; the problems it meets, each prefixed "uid:" or "landlock:"."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        problems = []
        try:
            os.close(r)
            # Lazy imports in reward functions need all of sys.path readable by the worker.
            paths = [p for p in sys.path if p and p != base_dir and os.path.exists(p)]
            _apply_identity(iso)
            for path in paths:
                if not _readable(path):
                    problems.append(f"uid:{path} is not readable by uid {iso['uid']}")
            if not _readable(base_dir, search_only=True):  # it enters only its own subdirectory
                problems.append(f"uid:{base_dir} is not searchable by uid {iso['uid']}")
        except BaseException as e:
            problems.append(f"uid:{type(e).__name__}: {e}")
        if iso["landlock_abi"] and not problems:
            try:
                limits.no_new_privs()
                limits.landlock_confine(iso["landlock_abi"], [base_dir], [os.devnull])
            except BaseException as e:
                problems.append(f"landlock:{type(e).__name__}: {e}")
        os.write(w, json.dumps(problems).encode()[:60000])
        os._exit(0)
    return json.loads(_collect(pid, r, w) or b'["uid:probe died"]')


def _collect(pid: int, r: int, w: int) -> bytes:
    """What a throwaway child wrote to its pipe, once it exited."""
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return data


def _probe_isolation(st: dict) -> dict:
    """Pick the strongest identity and Landlock setting that work here, trying each in a
    throwaway child, so a missing layer is skipped (or reported, when asked for) instead of
    breaking every worker."""
    uid, gid = limits.nobody()
    root = os.geteuid() == 0
    abi = limits.landlock_abi() if st["landlock"] else 0
    modes = ["nobody"] if root and st["drop_privileges"] is not False else []
    modes += ["no_caps"] if root else [None]
    notes = []
    if modes[0] == "nobody":  # a Python under /root: show nobody the paths it needs, nothing more
        from actors.sandbox import mountns

        needed = [sys.executable, sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path]
        try:
            exposed = mountns.expose([p for p in needed if p != st["base_dir"]], uid, gid, st["base_dir"])
            if exposed:
                notes.append("exposed to nobody in a mount namespace: " + ", ".join(exposed[:4]))
        except OSError as e:
            notes.append(f"no mount namespace ({e}): nobody may not reach the interpreter")
    for mode in modes:
        iso = {"mode": mode, "uid": uid if mode and mode != "no_caps" else None,
               "gid": gid if mode and mode != "no_caps" else None, "landlock_abi": abi}
        problems = _probe(iso, st["base_dir"])
        if any(p.startswith("landlock:") for p in problems):
            notes.append("no landlock: " + "; ".join(p[9:] for p in problems[:2]))
            iso["landlock_abi"] = abi = 0
            problems = _probe(iso, st["base_dir"])
        if not problems:
            break
        notes.append(f"not {mode}: " + "; ".join(p[4:] for p in problems[:2]))
    else:
        raise RuntimeError("cannot isolate reward workers: " + " | ".join(notes))
    if st["drop_privileges"] and iso["uid"] is None:
        raise RuntimeError("cannot run reward workers as uid nobody: " + " | ".join(notes))
    iso["notes"] = notes
    return iso


def _check(hook, iso: dict, base_dir: str) -> dict:
    """A reward function's start-up check (`fn.reward_check(iso)`, e.g. code_tests' kernel
    layers), run in a throwaway child with the workers' identity, then handed back to the hook in
    the zygote (`fn.reward_check(iso, seen)`), which may refuse to start (raises) or keep it for
    the workers it forks."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.chdir(base_dir)
            _apply_identity(iso)
            limits.no_new_privs()
            out = {"ok": hook(iso)}
        except BaseException as e:
            out = {"error": f"{type(e).__name__}: {e}"}
        try:
            _write_all(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    out = json.loads(_collect(pid, r, w) or b'{"error": "the check died"}')
    if "error" in out:
        raise RuntimeError(f"start-up check failed: {out['error']}")
    return hook(iso, out["ok"])


def _send(ctl: socket.socket, obj) -> None:
    ctl.send(json.dumps(obj).encode())


def zygote_main(ctl_fd: int) -> None:
    ctl = socket.socket(fileno=ctl_fd)
    st = pickle.loads(ctl.recv(1 << 20))  # settings from the pool, which we trust
    os.dup2(2, 1)  # import-time prints go to the actor's log, never into a channel
    sys.stdout = sys.stderr
    try:
        from actors.rewards import REWARD_FUNCTIONS

        for module in st["preload"]:
            __import__(module)
        fns = {source: REWARD_FUNCTIONS.get(name) for source, name in st["functions"].items()}
        for fn in fns.values():
            for hook in getattr(fn, "reward_preload", ()) or ():
                hook() if callable(hook) else __import__(hook)
        scopes = {source: getattr(fn, "reward_scope", "sample") for source, fn in fns.items()}
        bad = {s: v for s, v in scopes.items() if v not in ("sample", "group", "process")}
        if bad:
            raise ValueError(f"reward_scope must be 'sample', 'group' or 'process', got {bad}")
        iso = _probe_isolation(st)
        checks = {source: _check(fn.reward_check, iso, st["base_dir"])
                  for source, fn in fns.items() if callable(getattr(fn, "reward_check", None))}
    except BaseException:
        traceback.print_exc()
        _send(ctl, {"error": traceback.format_exc(limit=-3)[-MAX_ERROR:]})
        return
    me = os.getpid()
    limits.prctl(limits.PR_SET_CHILD_SUBREAPER, 1)  # processes escaping a dead worker come here
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so SIGCHLD writes to wake_w
    gc.collect()
    gc.freeze()  # keep the collector from touching (and so copying) inherited pages
    _send(ctl, {"ready": 1, "scopes": scopes, "isolation": iso, "checks": checks,
                "threads": len(os.listdir("/proc/self/task"))})

    workers: dict[int, str] = {}  # pid -> working directory
    poller = select.poll()
    poller.register(ctl.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    try:
        while True:
            for fd, _ in poller.poll():
                if fd == wake_r:
                    os.read(wake_r, 4096)
                    _reap(ctl, workers, me)
                    continue
                message, fds, _, _ = socket.recv_fds(ctl, 4096, 2)
                if not message:
                    return  # the pool is gone
                request = json.loads(message)
                if len(fds) != 2:
                    for fd_ in fds:
                        os.close(fd_)
                    _send(ctl, {"spawn_failed": request.get("spawn"), "error": "expected 2 fds"})
                    continue
                try:
                    pid = os.fork()
                except OSError as e:
                    for fd_ in fds:
                        os.close(fd_)
                    _send(ctl, {"spawn_failed": request.get("spawn"), "error": str(e)})
                    continue
                if pid == 0:
                    try:
                        ctl.close()
                        _worker_main(fds[0], fds[1], fns, scopes, st, iso, me)
                    finally:
                        os._exit(70)
                for fd_ in fds:
                    os.close(fd_)  # later workers must not inherit this one's pipe ends
                workers[pid] = os.path.join(st["base_dir"], f"w{pid}")
                _send(ctl, {"spawned": request.get("spawn"), "pid": pid})
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:  # the pool is gone (maybe killed outright, as Ray kills actors): leave nothing behind
        for pid in list(workers):
            try:
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
        shutil.rmtree(st["base_dir"], ignore_errors=True)


def _reap(ctl: socket.socket, workers: dict[int, str], me: int) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        directory = workers.pop(pid, None)
        if directory is None:
            continue  # a leftover of user code, killed below
        shutil.rmtree(directory, ignore_errors=True)  # fd-based: safe against symlink tricks
        if os.WIFSIGNALED(status):
            _send(ctl, {"exited": pid, "signal": os.WTERMSIG(status)})
        else:
            _send(ctl, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})
    for pid in limits.child_pids(me):
        if pid not in workers:  # reparented here from a dead worker: nobody owns it any more
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


if __name__ == "__main__":
    zygote_main(int(sys.argv[1]))
