"""Runs reward functions in a pool of sandboxed worker processes.

The pool owner (a Ray actor: multi-threaded, so never forked itself) starts one fresh
single-threaded zygote (`python -m actors.sandbox.worker`) that imports the reward functions once
and forks workers on demand (a few ms each, memory shared copy-on-write). The owner then talks to
each worker directly over two pipes and hands out samples in chunks.

Protections, from the owner's side (the worker's own layers are listed in actors.sandbox.limits):

- Time: each sample has its source's limit; a worker past it is killed with its whole process
  group (killpg SIGKILL) and the sample marked "timed out after Ns". A worker stuck longer than
  STUCK_S gives its queued samples back; if it sleeps, or computes far longer than its source
  usually takes, new workers stand in (doubling each STUCK_S, up to max_workers), so hanging
  samples run side by side: about one time limit per batch, not one per hanging sample. The
  deadline is per source: a source with a sample stuck or timed out is "hanging", and its waiting
  samples go behind the other sources' (which then run first, whatever the order of the list). If
  no sample of a hanging source finishes for its whole time limit while its samples wait and every
  worker is stuck, those samples (of that source only) are skipped as timed out: the batch stays
  bounded when all hang, and one source's hang costs no other source its scores.
- Channel: the owner sends pickles (it trusts itself) and reads back only JSON lines, checked
  field by field with a size cap; it never unpickles what user code could write. Worker stdout and
  stderr go to /dev/null: prints, even raw bytes on fd 1, cannot corrupt the channel or fill memory.
- Failures: an exception, a non-number, sys.exit, os._exit, a crash, a memory or CPU limit give
  that sample a null value and a reason; the worker is replaced and the batch goes on.
- The owner: workers run in their own sessions, with the uid `nobody` when the owner is root, and
  under Landlock signal scoping where the kernel has it, so user code cannot signal the owner.
  At worst it kills the zygote, which is restarted on the next spawn; the samples of the workers
  that die with it are tried once more, and fail if that happens again.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import pickle
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections import deque
from pathlib import Path

from actors.sandbox import limits
from actors.sandbox.worker import MAX_ERROR, Scored, encode_frame  # noqa: F401 (Scored: re-exported)

ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 60.0  # zygote: Python start-up plus importing the reward functions
SPAWN_TIMEOUT_S = 10.0  # worker: fork plus set-up, normally a few milliseconds
STUCK_S = 0.02  # a sample running longer makes its worker "stuck" (its queue moves elsewhere)
DEATH_GRACE_S = 0.5  # how long a dead worker's sample waits for the zygote's exit report
MAX_CHUNK = 64  # samples sent to a worker at once
MAX_LINE = 1 << 18  # bytes of one reply line
MAX_SPAWN_FAILURES = 3  # workers dying before they are ready, in a row: a broken set-up


class _Worker:
    __slots__ = ("wid", "pid", "task_fd", "result_fd", "out", "rbuf", "queue", "head_start",
                 "ready", "bye", "spawned_at", "zygote", "state", "state_at", "unsynced")

    def __init__(self, wid: int, task_fd: int, result_fd: int, now: float, zygote: int):
        self.wid, self.task_fd, self.result_fd = wid, task_fd, result_fd
        self.pid: int | None = None
        self.out = bytearray()  # task bytes the pipe did not take yet
        self.rbuf = bytearray()  # an incomplete reply line
        self.queue: deque[int] = deque()  # seqs sent and not answered, in order
        self.head_start = now  # when queue[0] started (as seen from here)
        self.ready = self.bye = False
        self.spawned_at, self.zygote = now, zygote
        self.state, self.state_at = "?", 0.0
        # After a "drop", until its ack: the limit of the samples taken back, one of which it may
        # have started before reading the drop (its queue then looks empty but it is busy).
        self.unsynced: float | None = None

    def busy(self) -> bool:
        return bool(self.queue) or self.unsynced is not None


class _Batch:
    def __init__(self, items, timeouts, scopes):
        self.items = items
        self.sources = [source for source, _ in items]
        missing = set(self.sources) - set(scopes)
        if missing:
            raise KeyError(f"unknown reward source(s) {sorted(missing)}; this pool has {sorted(scopes)}")
        self.limits = [float(timeouts[source]) for source in self.sources]
        self.expect = [None] * len(items)  # group items: the number of responses
        self.results: list = [None] * len(items)
        self.remaining = len(items)
        self.pending: deque[int] = deque()
        self.seq_idx: dict[int, int] = {}
        self.retried: set[int] = set()  # items whose worker died with its zygote once already
        self.start = time.monotonic()
        self.limit = {source: float(timeouts[source]) for source in set(self.sources)}
        self.progress = dict.fromkeys(self.limit, self.start)  # by source: when one last finished
        self.hanging: set[str] = set()  # sources with a sample stuck or timed out in this batch
        for i, (source, kwargs) in enumerate(items):
            if scopes[source] in ("group", "process"):
                key = "responses" if scopes[source] == "group" else "steps"
                values = kwargs.get(key)
                if not isinstance(values, (list, tuple)):
                    self.results[i] = (None, f"a {scopes[source]} reward needs kwargs[{key!r}], a list")
                    self.remaining -= 1
                    continue
                self.expect[i] = len(values)
            self.pending.append(i)


def _reject_constant(name):
    raise ValueError(f"{name} is not a finite number")


_DECODE = json.JSONDecoder(parse_constant=_reject_constant).decode  # one decoder: json.loads with
# a keyword argument would build a new one per line


def _finite(v) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


def _cleanup(resources: dict) -> None:
    """Last resort at garbage collection or exit: workers die with their zygote (PDEATHSIG)."""
    for proc in resources["procs"]:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for d in resources["dirs"]:
        shutil.rmtree(d, ignore_errors=True)
    resources["procs"].clear()
    resources["dirs"].clear()


class RewardPool:
    def __init__(self, functions: dict[str, str], workers: int = 2, max_workers: int = 32,
                 memory_mb: int | None = 2048, cpu_time_s: float | None = None, *,
                 file_mb: int | None = 256, max_files: int | None = 1024, max_processes: int | None = 256,
                 drop_privileges: bool | None = None, landlock: bool = True,
                 env: dict[str, str] | None = None, preload: tuple[str, ...] = ()):
        """`functions` maps a reward source name to a registry name or `module:function`.

        workers: processes kept ready; up to max_workers run while others are stuck on hanging
        samples. memory_mb: address space a worker may add to what it inherits from the zygote.
        cpu_time_s: CPU seconds per sample (RLIMIT_CPU). file_mb, max_files: RLIMIT_FSIZE and
        RLIMIT_NOFILE. max_processes: RLIMIT_NPROC, applied with the uid drop (shared by all
        workers of that uid). drop_privileges: run workers as `nobody`, with no capabilities (None:
        when root and nobody can reach sys.path, if need be through a private mount namespace:
        actors.sandbox.mountns; else they stay uid 0 without capabilities). landlock: confine writes, TCP and signals when the
        kernel allows. env: extra environment variables for reward functions (nothing else is
        inherited but PATH, LANG and the like). preload: modules the zygote imports up front, so
        workers do not each import them on first use (a function may also list them in its
        `reward_preload` attribute)."""
        if workers < 1 or max_workers < workers:
            raise ValueError(f"need 1 <= workers <= max_workers, got {workers} and {max_workers}")
        self.functions = dict(functions)
        self.workers, self.max_workers = workers, max_workers
        self.env = dict(env or {})
        self._settings = {"functions": self.functions, "memory_mb": memory_mb, "cpu_time_s": cpu_time_s,
                          "file_mb": file_mb, "max_files": max_files, "max_processes": max_processes,
                          "drop_privileges": drop_privileges, "landlock": landlock,
                          "preload": tuple(preload)}
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._ctl: socket.socket | None = None
        self._zygote_gen = 0
        self._scopes: dict[str, str] = {}
        self.isolation: dict = {}
        self._pool: dict[int, _Worker] = {}
        self._fds: dict[int, tuple[_Worker, str]] = {}
        self._poller = select.poll()
        self._dying: dict[int, tuple[_Worker, float]] = {}  # pid -> worker, give-up time
        self._exits: dict[int, str] = {}  # pid -> why it ended, from the zygote
        self._next_wid = self._next_seq = 0
        self._spawn_failures = 0
        self._fatal: str | None = None
        self._ema: dict[str, float] = {}  # typical seconds per sample, by source
        self._counts = {"items": 0, "timeouts": 0, "deaths": 0, "deadline_skips": 0, "restarts": 0,
                        "spawned": 0, "zygote_starts": 0, "batches": 0}
        self._times = {"spawn_s": 0.0, "batch_s": 0.0, "zygote_start_s": 0.0}
        self._sources = {s: {"items": 0, "errors": 0, "timeouts": 0, "seconds": 0.0} for s in self.functions}
        self._resources = {"procs": [], "dirs": []}
        self._finalizer = weakref.finalize(self, _cleanup, self._resources)

    # ---- public -----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the zygote and the ready workers now instead of at the first score()."""
        with self._lock:
            self._ensure_zygote()
            now = time.monotonic()
            while sum(not w.bye for w in self._pool.values()) < self.workers:
                self._spawn(now)
            deadline = now + SPAWN_TIMEOUT_S
            while not all(w.ready and w.pid for w in self._pool.values()) and time.monotonic() < deadline:
                for fd, _ in self._poller.poll(50):
                    self._on_event(fd, None, time.monotonic())

    def scope(self, source: str) -> str:
        """"sample" (fn(prompt, response, **columns) -> float), "group" (fn(prompt, responses,
        **columns) -> list of floats, one per response) or "process" (fn(prompt, response, steps,
        **columns) -> list of floats, one per step)."""
        if source not in self.functions:
            raise KeyError(f"unknown reward source {source!r}; this pool has {sorted(self.functions)}")
        with self._lock:
            self._ensure_zygote()
        return self._scopes[source]

    def score(self, items: list[tuple[str, dict]], timeouts: dict[str, float]
              ) -> list[tuple[float | list[float] | None, str | None]]:
        """Score `(source, kwargs)` items; one (value, error) per item, in order. A group source's
        kwargs hold `responses` (a list) and its value is a list of floats, one per response.
        A value of None means the item failed, and `error` says why."""
        with self._lock:
            return self._score(items, timeouts)

    def stats(self) -> dict:
        live = [w for w in self._pool.values() if not w.bye]
        spawned = max(self._counts["spawned"], 1)
        return {**self._counts, "workers": len(live),
                "zygote_restarts": max(self._counts["zygote_starts"] - 1, 0),
                "spawn_ms_mean": 1000 * self._times["spawn_s"] / spawned,
                "zygote_start_s": self._times["zygote_start_s"], "batch_s": self._times["batch_s"],
                "sources": {s: dict(v) for s, v in self._sources.items()},
                "isolation": dict(self.isolation)}

    @property
    def restarts(self) -> int:
        return self._counts["restarts"]

    def close(self) -> None:
        with self._lock:
            for w in list(self._pool.values()):
                self._drop(w, kill=True)
            self._dying.clear()
            self._stop_zygote()
            _cleanup(self._resources)

    # ---- zygote ----------------------------------------------------------------------------------
    def _ensure_zygote(self) -> None:
        if self._ctl is None:
            self._start_zygote()

    def _start_zygote(self) -> None:
        started = time.monotonic()
        self._stop_zygote()
        base = tempfile.mkdtemp(prefix="coevo-rewards-")
        self._resources["dirs"].append(base)
        os.chmod(base, 0o711)  # a worker (maybe uid nobody) reaches its own directory, lists none
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = limits.clean_env(self.env)
        # The zygote imports coevo and the user's modules exactly as this process would.
        paths = [str(ROOT), *(os.path.abspath(p) if p else os.getcwd() for p in sys.path)]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env["HOME"] = env["TMPDIR"] = base
        # Popen, not fork: this process has threads. Own session: its group is not ours.
        proc = subprocess.Popen([sys.executable, "-m", "actors.sandbox.worker", str(theirs.fileno())],
                                pass_fds=[theirs.fileno()], env=env, cwd=base,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self._resources["procs"].append(proc)
        ours.send(pickle.dumps({**self._settings, "base_dir": base}))
        reply = None
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        wait = select.poll()  # not select(): an actor's fds may be numbered above 1024
        wait.register(ours.fileno(), select.POLLIN)
        while reply is None and time.monotonic() < deadline:
            if wait.poll(200):
                data = ours.recv(1 << 20)
                try:
                    reply = json.loads(data) if data else {"error": f"exit code {proc.wait()}"}
                except ValueError:
                    reply = {"error": f"unreadable reply {data[:100]!r}"}
            elif proc.poll() is not None:
                reply = {"error": f"exit code {proc.returncode}"}
        scopes = reply.get("scopes") if isinstance(reply, dict) else None
        if not isinstance(scopes, dict) or set(scopes) != set(self.functions):
            why = reply.get("error", reply) if isinstance(reply, dict) else "no answer in time"
            proc.kill()
            proc.wait()
            ours.close()
            raise RuntimeError(f"reward process failed to start for {self.functions} (see the "
                               f"traceback above in this actor's log): {str(why)[-MAX_ERROR:]}")
        self._scopes = {s: (v if v in ("group", "process") else "sample") for s, v in scopes.items()}
        iso = reply.get("isolation") if isinstance(reply.get("isolation"), dict) else {}
        abi = iso.get("landlock_abi") if type(iso.get("landlock_abi")) is int else 0
        self.isolation = {
            "identity": str(iso.get("mode")), "uid": iso.get("uid"), "landlock_abi": abi,
            "landlock": limits.landlock_layers(abi),
            "memory_mb": self._settings["memory_mb"], "cpu_time_s": self._settings["cpu_time_s"],
            "max_processes": self._settings["max_processes"] if iso.get("uid") is not None else None,
            "notes": [str(n) for n in iso.get("notes", [])][:5], "zygote_threads": reply.get("threads"),
            "checks": reply.get("checks") if isinstance(reply.get("checks"), dict) else {},
        }
        ours.setblocking(False)
        self._proc, self._ctl = proc, ours
        self._zygote_gen += 1
        self._poller.register(ours.fileno(), select.POLLIN)
        self._counts["zygote_starts"] += 1
        self._times["zygote_start_s"] += time.monotonic() - started

    def _stop_zygote(self) -> None:
        if self._ctl is not None:
            self._poller.unregister(self._ctl.fileno())
            self._ctl.close()
            self._ctl = None
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            self._resources["procs"].remove(self._proc)
            self._proc = None
        # Workers of an old zygote died with it (PDEATHSIG): their directories can go.
        for d in self._resources["dirs"]:
            shutil.rmtree(d, ignore_errors=True)
        self._resources["dirs"].clear()

    def _on_zygote(self, b: _Batch | None, now: float) -> None:
        while self._ctl is not None:
            try:
                data = self._ctl.recv(65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:  # the zygote died (killed by user code?): restart it when needed
                self._ctl_lost()
                return
            try:
                msg = json.loads(data)
            except ValueError:
                msg = None
            if not isinstance(msg, dict):
                continue
            pid = msg.get("pid") if type(msg.get("pid")) is int else msg.get("exited")
            if "spawned" in msg and type(pid) is int and pid > 1:
                w = self._pool.get(msg["spawned"]) if type(msg["spawned"]) is int else None
                if w is not None and w.pid is None:
                    w.pid = pid
                else:  # we gave up on that worker already
                    self._killpg(pid)
            elif "spawn_failed" in msg:
                w = self._pool.get(msg["spawn_failed"]) if type(msg["spawn_failed"]) is int else None
                if w is not None:
                    self._fatal = f"could not fork a worker: {str(msg.get('error'))[:200]}"
                    self._spawn_failures += 1
                    self._drop(w, kill=False)
            elif type(msg.get("exited")) is int:  # may come before we see the pipe close
                self._exits[msg["exited"]] = self._exit_reason(msg)

    def _ctl_lost(self) -> None:
        self._poller.unregister(self._ctl.fileno())
        self._ctl.close()
        self._ctl = None
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
        # Its workers die with it (PDEATHSIG), maybe a moment later: no new work for them.
        for w in self._pool.values():
            w.bye = True
            self._killpg(w.pid)

    def _exit_reason(self, msg: dict) -> str:
        sig, code = msg.get("signal"), msg.get("code")
        if type(sig) is int:
            if sig == signal.SIGXCPU:
                return f"CPU time limit ({self._settings['cpu_time_s']:g}s) exceeded (SIGXCPU)"
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = "?"
            return f"worker died (signal {sig}, {name})"
        return f"worker died (exit code {code if type(code) is int else '?'})"

    # ---- workers ---------------------------------------------------------------------------------
    def _spawn(self, now: float, b: _Batch | None = None) -> _Worker | None:
        if self._spawn_failures >= MAX_SPAWN_FAILURES:
            raise RuntimeError(f"reward workers keep failing to start: {self._fatal}")
        if self._ctl is None:
            started = time.monotonic()
            self._start_zygote()
            if b is not None:  # importing the functions again is not the samples' fault
                for source in b.progress:
                    b.progress[source] += time.monotonic() - started
        task_r, task_w = os.pipe()
        res_r, res_w = os.pipe()
        wid = self._next_wid
        self._next_wid += 1
        try:
            socket.send_fds(self._ctl, [json.dumps({"spawn": wid}).encode()], [task_r, res_w])
            sent = True
        except OSError:
            sent = False
        finally:
            os.close(task_r)
            os.close(res_w)
        if not sent:
            os.close(task_w)
            os.close(res_r)
            self._ctl_lost()
            return None
        try:
            fcntl.fcntl(task_w, fcntl.F_SETPIPE_SZ, 1 << 20)  # fewer partial writes of big chunks
        except OSError:
            pass
        os.set_blocking(task_w, False)
        os.set_blocking(res_r, False)
        w = _Worker(wid, task_w, res_r, now, self._zygote_gen)
        self._pool[wid] = w
        self._fds[res_r] = (w, "r")
        self._poller.register(res_r, select.POLLIN)
        self._counts["spawned"] += 1
        return w

    def _killpg(self, pid: int | None) -> None:
        if pid:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass  # gone already

    def _drop(self, w: _Worker, kill: bool) -> None:
        """Forget a worker: close its pipes (it exits on EOF if it still can) or kill it."""
        if kill:
            self._killpg(w.pid)
        for fd in (w.result_fd, w.task_fd):
            if fd in self._fds:
                self._poller.unregister(fd)
                del self._fds[fd]
            os.close(fd)
        self._pool.pop(w.wid, None)

    def _lost(self, w: _Worker, b: _Batch | None, now: float, why: str | None, kill: bool) -> None:
        """A worker is gone: killed here (`why` given) or died on its own (reason from the zygote).
        Its head sample gets the reason; the samples queued behind it go back to the batch."""
        self._drop(w, kill)
        if b is None or not w.queue:
            return
        self._counts["restarts"] += 1
        head, rest = w.queue[0], list(w.queue)[1:]
        self._give_back(b, rest)
        w.queue.clear()
        w.queue.append(head)
        if why is not None:
            self._resolve(b, b.seq_idx[head], None, why, now, progress=False)
        elif w.pid is not None and w.zygote == self._zygote_gen and self._ctl is not None:
            self._dying[w.pid] = (w, now + DEATH_GRACE_S)  # the exit status is on its way
        else:
            self._died_with_zygote(b, head, now)

    def _died_with_zygote(self, b: _Batch, seq: int, now: float) -> None:
        """Every worker dies with its zygote, so its sample is more likely a bystander than the
        culprit: it gets one more try, and an error if its worker dies that way again."""
        idx = b.seq_idx[seq]
        if idx not in b.retried:
            b.retried.add(idx)
            b.pending.appendleft(idx)
            return
        self._counts["deaths"] += 1
        self._resolve(b, idx, None, "worker died with its zygote, twice (does this reward function "
                                    "kill its parent process?)", now, progress=True)

    def _settle_dying(self, b: _Batch, now: float) -> None:
        for pid, (w, give_up) in list(self._dying.items()):
            why = self._exits.pop(pid, None)
            zygote_gone = self._ctl is None or w.zygote != self._zygote_gen
            if why is None and now < give_up and not zygote_gone:
                continue
            del self._dying[pid]
            if why is None and zygote_gone:
                self._died_with_zygote(b, w.queue[0], now)
                continue
            self._counts["deaths"] += 1
            self._resolve(b, b.seq_idx[w.queue[0]], None, why or "worker died (exit status unknown)",
                          now, progress=True)

    # ---- one batch -------------------------------------------------------------------------------
    def _score(self, items, timeouts):
        if not items:
            return []
        self._ensure_zygote()
        b = _Batch(items, timeouts, self._scopes)
        self._spawn_failures = 0
        try:
            for fd, _ in self._poller.poll(0):  # news since the last batch: deaths, exit reports
                self._on_event(fd, b, time.monotonic())
            while b.remaining:
                now = time.monotonic()
                self._check_timeouts(b, now)
                self._settle_dying(b, now)
                if b.pending and self._all_stuck(now):
                    self._skip_hung(b, now)
                if not b.remaining:
                    break
                self._rebalance(b, now)
                self._assign(b, now)
                wait = self._next_wakeup(b, now) - time.monotonic()
                for fd, _ in self._poller.poll(max(wait, 0.0) * 1000):
                    self._on_event(fd, b, time.monotonic())
        finally:
            self._counts["batches"] += 1
            self._times["batch_s"] += time.monotonic() - b.start
            self._after_batch(b)
        return b.results

    def _after_batch(self, b: _Batch) -> None:
        """Keep `workers` idle workers (starting new ones in the background if some were lost);
        the extras spawned for stuck samples go."""
        keep = 0
        for w in list(self._pool.values()):
            if w.ready and not w.busy() and not w.bye and not w.out and keep < self.workers:
                keep += 1
            elif not w.ready and not w.bye and keep < self.workers:
                keep += 1  # still starting: ready for the next batch
            else:
                self._drop(w, kill=True)
        self._dying.clear()
        self._exits.clear()
        if self._ctl is not None:  # replace the ones lost in this batch: ready for the next one
            now = time.monotonic()
            for _ in range(self.workers - keep):
                self._spawn(now)

    def _resolve(self, b: _Batch, idx: int, value, error: str | None, now: float, progress: bool,
                 latency: float | None = None) -> None:
        if b.results[idx] is not None:
            return  # a late duplicate: another worker answered first
        b.results[idx] = (value, error)
        b.remaining -= 1
        source = b.sources[idx]
        st = self._sources[source]
        st["items"] += 1
        self._counts["items"] += 1
        if error is not None:
            st["errors"] += 1
        if progress:
            b.progress[source] = now
        if latency is not None:
            st["seconds"] += latency
            old = self._ema.get(source)
            self._ema[source] = latency if old is None else 0.8 * old + 0.2 * latency

    def _check_timeouts(self, b: _Batch, now: float) -> None:
        for w in list(self._pool.values()):
            if not w.queue and w.unsynced is not None and now - w.head_start >= w.unsynced:
                self._counts["restarts"] += 1  # stuck on a sample another worker has by now
                self._lost(w, b, now, None, kill=True)
                continue
            if w.queue and w.ready:
                idx = b.seq_idx[w.queue[0]]
                limit = b.limits[idx]
                if now - w.head_start >= limit:
                    self._counts["timeouts"] += 1
                    self._sources[b.sources[idx]]["timeouts"] += 1
                    self._sources[b.sources[idx]]["seconds"] += now - w.head_start
                    self._hangs(b, b.sources[idx])
                    self._lost(w, b, now, f"timed out after {limit:g}s", kill=True)

    def _all_stuck(self, now: float) -> bool:
        """No worker could take a waiting sample: each one is on a sample past STUCK_S."""
        return all(w.ready and w.busy() and now - w.head_start >= STUCK_S
                   for w in self._pool.values() if not w.bye)

    def _hangs(self, b: _Batch, source: str) -> None:
        """`source` has a sample stuck or timed out: its waiting samples go behind the other
        sources', so a hanging function does not hold up the rest of the batch."""
        if source in b.hanging:
            return
        b.hanging.add(source)
        mine = [i for i in b.pending if b.sources[i] == source]
        if len(mine) < len(b.pending):
            b.pending = deque([i for i in b.pending if b.sources[i] != source] + mine)

    def _give_back(self, b: _Batch, seqs: list[int]) -> None:
        """Samples a worker will not run go back first in line, except a hanging source's: last."""
        idxs = [b.seq_idx[seq] for seq in seqs]
        b.pending.extendleft(reversed([i for i in idxs if b.sources[i] not in b.hanging]))
        b.pending.extend(i for i in idxs if b.sources[i] in b.hanging)

    def _skip_hung(self, b: _Batch, now: float) -> None:
        """Every worker is stuck: skip the waiting samples of each hanging source that finished no
        sample for its whole time limit. They count as timeouts (their reason starts with "timed
        out", which the reward metrics count too); other sources' samples keep waiting for a worker."""
        hung = {s for s in b.hanging if now - b.progress[s] >= b.limit[s]}
        if not hung:
            return
        keep = deque()
        for idx in b.pending:
            source = b.sources[idx]
            if b.results[idx] is not None:
                continue
            if source not in hung:
                keep.append(idx)
                continue
            self._counts["deadline_skips"] += 1
            self._counts["timeouts"] += 1
            self._sources[source]["timeouts"] += 1
            self._resolve(b, idx, None, f"timed out (skipped: no sample of {source!r} finished for "
                                        f"{b.limit[source]:g}s while every worker was stuck on its "
                                        f"samples)", now, progress=False)
        b.pending = keep

    def _rebalance(self, b: _Batch, now: float) -> None:
        """Take queued samples back from stuck workers; replace stuck workers that sleep (or spin
        far longer than their source usually takes) so the rest of the batch keeps moving."""
        active = live = stuck = 0
        for w in list(self._pool.values()):
            if w.bye:
                continue
            live += 1
            if not w.ready:
                if now - w.spawned_at > SPAWN_TIMEOUT_S:
                    self._spawn_failures += 1
                    self._fatal = f"a worker did not start within {SPAWN_TIMEOUT_S:g}s"
                    self._drop(w, kill=True)
                    live -= 1
                else:
                    active += 1
                continue
            running = now - w.head_start
            if not w.busy() or running < STUCK_S:
                active += 1
                continue
            stuck += 1
            if not w.queue:
                continue  # busy with a sample taken back from it; it times out above
            self._hangs(b, b.sources[b.seq_idx[w.queue[0]]])
            if len(w.queue) > 1:
                rest = list(w.queue)[1:]
                self._give_back(b, rest)
                w.queue = deque([w.queue[0]])
                w.unsynced = max([b.limits[b.seq_idx[seq]] for seq in rest] + [w.unsynced or 0.0])
                self._send(w, encode_frame(("drop", w.queue[0])))
            if now - w.state_at > STUCK_S:
                w.state, w.state_at = limits.proc_state(w.pid), now
            if w.state == "R":  # computing: maybe a slow sample, which a new worker would only slow
                typical = self._ema.get(b.sources[b.seq_idx[w.queue[0]]])
                if typical is None or running < 4 * typical:
                    active += 1
        if b.pending:  # the samples of a source past its deadline have been skipped above
            # As many workers moving as are stuck (at least `workers`): when every sample hangs,
            # the pool doubles each STUCK_S and reaches max_workers in a few rounds.
            want = max(self.workers, stuck) - active
            for _ in range(min(want, self.max_workers - live, len(b.pending))):
                self._spawn(now, b)

    def _assign(self, b: _Batch, now: float) -> None:
        if not b.pending:
            return
        ready = [w for w in self._pool.values() if w.ready and w.pid and not w.bye]
        for w in ready:
            if w.busy():
                continue
            k = max(1, min(MAX_CHUNK, math.ceil(len(b.pending) / (2 * len(ready)))))
            chunk = []
            while b.pending and len(chunk) < k:
                idx = b.pending.popleft()
                if b.results[idx] is not None:
                    continue
                seq = self._next_seq
                self._next_seq += 1
                b.seq_idx[seq] = idx
                chunk.append((seq, b.sources[idx], b.items[idx][1]))
                w.queue.append(seq)
            if not chunk:
                return
            w.head_start = now
            self._send(w, encode_frame(("items", chunk)))

    def _send(self, w: _Worker, data: bytes) -> None:
        if not w.out:
            try:
                n = os.write(w.task_fd, data)
            except BlockingIOError:
                n = 0
            except OSError:
                return  # the worker is gone; its result pipe will say so
            data = data[n:]
            if not data:
                return
            self._fds[w.task_fd] = (w, "w")
            self._poller.register(w.task_fd, select.POLLOUT)
        w.out += data

    def _flush(self, w: _Worker) -> None:
        try:
            n = os.write(w.task_fd, w.out)
        except BlockingIOError:
            return
        except OSError:
            n = len(w.out)
        del w.out[:n]
        if not w.out:
            self._poller.unregister(w.task_fd)
            del self._fds[w.task_fd]

    def _next_wakeup(self, b: _Batch, now: float) -> float:
        wake = now + 1.0
        stuck = False
        for w in self._pool.values():
            if not w.ready:
                wake = min(wake, w.spawned_at + SPAWN_TIMEOUT_S)
                continue
            if w.queue:
                wake = min(wake, w.head_start + b.limits[b.seq_idx[w.queue[0]]])
            elif w.unsynced is not None:
                wake = min(wake, w.head_start + w.unsynced)
            if w.busy():
                if now - w.head_start < STUCK_S:
                    wake = min(wake, w.head_start + STUCK_S)
                else:
                    stuck = True
        if b.pending:
            for source in b.hanging:  # past it, _all_stuck decides, at STUCK_S wake-ups
                if b.progress[source] + b.limit[source] > now:
                    wake = min(wake, b.progress[source] + b.limit[source])
            if stuck:
                wake = min(wake, now + STUCK_S)  # re-check: a stuck worker may need a stand-in
        for _, give_up in self._dying.values():
            wake = min(wake, give_up)
        return wake

    def _on_event(self, fd: int, b: _Batch, now: float) -> None:
        if self._ctl is not None and fd == self._ctl.fileno():
            self._on_zygote(b, now)
            return
        entry = self._fds.get(fd)
        if entry is None:
            return
        w, kind = entry
        if kind == "w":
            self._flush(w)
            return
        eof = False
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                eof = True
                break
            w.rbuf += chunk
            if len(chunk) < 1 << 16:
                break
        if w.rbuf:
            lines = w.rbuf.split(b"\n")
            w.rbuf = bytearray(lines.pop())
            for line in lines:
                why = self._on_line(w, line, b, now)
                if why is not None:
                    self._lost(w, b, now, why, kill=True)
                    return
            if len(w.rbuf) > MAX_LINE:
                self._lost(w, b, now, "invalid reply from the reward worker (line too long)", kill=True)
                return
        if eof:
            self._lost(w, b, now, None, kill=True)

    def _on_line(self, w: _Worker, line: bytes, b: _Batch, now: float) -> str | None:
        """Handle one reply; a string return means the worker broke the protocol."""
        bad = "invalid reply from the reward worker (did user code write to its channel?)"
        try:
            msg = _DECODE(line.decode())
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            return bad
        if not isinstance(msg, dict):
            return bad
        if "s" not in msg:
            if msg == {"ready": 1} and not w.ready:
                w.ready = True
                self._spawn_failures = 0
                self._times["spawn_s"] += now - w.spawned_at
                return None
            if msg == {"dropped": 1} and w.unsynced is not None:
                w.unsynced = None
                return None
            if isinstance(msg.get("fatal"), str) and len(msg) == 1:
                self._fatal = msg["fatal"][:MAX_ERROR]
                self._spawn_failures += 1
                return None
            return bad
        seq, keys = msg["s"], set(msg) - {"s", "bye"}
        if type(seq) is not int or keys not in ({"v"}, {"e"}, {"v", "x"}) or msg.get("bye", 1) != 1:
            return bad
        latency = None
        if w.queue and w.queue[0] == seq:
            w.queue.popleft()
            latency = now - w.head_start
            w.head_start = now
        elif seq in w.queue:
            return bad  # answers come in order
        if "bye" in msg:  # it exits after this reply: its queue goes back, no new work for it
            w.bye = True
            for queued in reversed(w.queue if b is not None else ()):
                b.pending.appendleft(b.seq_idx[queued])
            w.queue.clear()
        idx = b.seq_idx.get(seq) if b is not None else None
        if idx is None:
            return None  # from an earlier batch
        if "e" in msg:
            if not isinstance(msg["e"], str):
                return bad
            self._resolve(b, idx, None, msg["e"][:MAX_ERROR], now, True, latency)
            return None
        value, n = msg["v"], b.expect[idx]
        if n is None:
            if not _finite(value):
                return bad
            value = float(value)
            if "x" in msg:  # a reason and details (worker._detailed)
                x = msg["x"]
                if not isinstance(x, dict) or set(x) - {"reason", "details"} or \
                        not isinstance(x.get("reason", ""), str):
                    return bad
                value = Scored(value, x["reason"][:MAX_ERROR] if "reason" in x else None, x.get("details"))
        else:
            if "x" in msg or not isinstance(value, list) or len(value) != n or not all(map(_finite, value)):
                return bad
            value = [float(v) for v in value]
        self._resolve(b, idx, value, None, now, True, latency)
        return None


RewardSandbox = RewardPool  # the old name, still used by actors/verifier.py
