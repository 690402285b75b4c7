"""Code execution: a response's code against the row's unit tests, each test in a fresh sandboxed
interpreter; and VeRPO's difficulty-weighted partial credit.

`code_tests` (registered by name) extracts the code from the response, then runs every unit test
of the row in its own `python -I -S -B` subprocess (isolated mode, no site-packages: the standard
library only) and scores the passes. It runs inside the reward pool (actors.rewards.sandbox), so a
test process inherits the pool worker's isolation and adds its own layers.

The `tests` column
------------------
A list of test strings, or a JSON string holding such a list. Each test string is Python source,
usually one `assert`, and may hold several statements, all run in the namespace where the code
was defined::

    {"prompt": "def add(a, b): return ", "answer": "a + b",
     "tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]}

Optional columns (or args): `setup`, Python source run before the code in the same namespace
(imports the tests need, helper definitions; a setup or test that fails before the response's code
runs is the row's fault: ValueError, a null reward); `entry`, the name the code must define (checked
without running anything: a response that does not define it scores 0 at once).

Scoring (args.mode)
-------------------
- `pass_fraction` (default): passed tests / tests.
- `all_pass`: 1 when every test passes, else 0.
- `verpo`: VeRPO's difficulty-weighted pass sum, Wang et al. 2026, "VeRPO: Verifiable Dense Reward
  Policy Optimization for Code Generation" (arXiv:2601.03525): "a dense reward is derived from the
  sum of weights of the passed unit tests", with weights from "the difficulty weight of each unit
  test based on the execution statistics during training". The function returns the per-test pass
  vector; the Verifier actor keeps the statistics (`Verifier.state`, checkpointed) and writes the
  weighted sum as the reward (`verpo_rewards` below; our formula, documented there).

VeRPO's statistics: per reward source and prompt_id, the test list's key and, per test, attempts
and passes (decayed by `decay` each batch that sees the prompt). They live in the Verifier's
`state` (JSON, in every checkpoint: about 100 bytes per prompt with 3 tests) and are restored with
`--resume`. Each verifier replica counts the samples it scores; a checkpoint keeps one replica's
counts and a resume gives them to every replica. Held-out evaluation updates the counts of the
held-out prompts too (their own prompt_ids), so take `verifier.accuracy_source` from an
`all_pass` source. Weighted pass sums are in [0, 1], 1 exactly when every test passes.

Every mode returns a `Scored` float (actors.rewards.worker: the score, with `reason` and `details`
attributes the pool carries back to the Verifier): `reason` says why a sample lost marks ("1/3 tests
passed; test 2: AssertionError: 4 != 5; test 3: timed out after 2s"); the Verifier writes it to
`reward_reason.<name>`. `details.passed` is the pass vector.

Args (YAML `args:`; a column of the same name is overridden by them): `mode`; `extract` (`auto`:
the last ```python (or ```py / unlabelled) fence, else the whole response; `fence`: a fence is
required, 0 without one; `response`: the whole response; `completion`: the prompt followed by the
response, for prompts that are the start of the code, with no data.prompt_template around them); `test_timeout_s` (wall seconds per test,
2), `cpu_time_s` (CPU seconds per test, 1), `time_limit_s` (wall seconds for all the tests of one
response, 4: tests that do not fit fail with "not run"; keep the reward's `timeout_s` above it),
`memory_mb` (address space per test process, 256), `max_output_bytes` (stdout+stderr per test,
1 MiB: past it the test is killed and fails), `file_mb` (largest file a test may write, 16),
`max_chars` (longest response scored, 100,000: longer ones raise ValueError), `interpreter`
(default: this Python), and for `verpo`: `prior`, `decay`, `outcome_weight`. RLIMIT_CPU counts
whole seconds: `cpu_time_s` is rounded, at least 1. When the code fails before any test statement
runs (an exception, a timeout or a limit while defining it), the remaining tests are not started:
they would run the same code again.

YAML::

    - {name: tests, fn: code_tests, timeout_s: 10, args: {mode: pass_fraction}}
    - {name: solved, fn: code_tests, weight: 0, args: {mode: all_pass}}
    - {name: verpo, fn: code_tests, timeout_s: 10, args: {mode: verpo, extract: completion}}

Protections, from outside the test process in (each layer is also listed in `isolation()`):

- Judged from outside: a test passes only when its process exits with status 0 *and* has written
  a random per-test token (secrets.token_hex, sent on stdin, never in argv, the environment or a
  file) to a private pipe after the last statement of the test ran. `sys.exit(0)`, `os._exit(0)`,
  a crash or a kill before that is a failure. The harness is compiled from `-c` before the code
  runs (there is no harness file to rewrite), keeps its own references to every builtin it uses,
  and runs the test statements with a snapshot of the builtins taken before the code ran, in a
  namespace without names that shadow builtins but `entry` (so replacing `len` or
  `AssertionError` does not fool a test). `assert a == b` and `assert a != b` are compared
  strictly: where either side is a plain value (numbers, strings, bytes, None, and
  lists/tuples/sets/dicts of them), both must be, so an object whose `__eq__` always answers
  True, or a subclass of int, does not pass.
- Time: a wall limit per test (the parent kills the test's whole process group with SIGKILL),
  RLIMIT_CPU (SIGXCPU, then SIGKILL one second later), and a wall budget per response.
- Memory: RLIMIT_AS (a memory bomb gets MemoryError). Output: at most `max_output_bytes` read from
  the merged stdout/stderr pipe; past that the process group is killed. Disk: RLIMIT_FSIZE, a
  fresh throwaway working directory (HOME and TMPDIR too) removed after each test, umask 077.
- Processes: RLIMIT_NPROC 0 (no fork, no threads; enforced for any uid but root: in the pool the
  worker is `nobody` when the pool runs as root), its own session and process group (killed after
  every test, pass or fail), PR_SET_PDEATHSIG (dies with the worker when the pool kills it).
- Kernel confinement, nested inside the worker's own: no_new_privs, then a Landlock domain of its
  own (kernel >= 5.13): writes only beneath its directory and /dev/null; ABI >= 4: no TCP connect
  or bind; ABI >= 6: no signals to, and no abstract unix sockets of, processes outside the test
  (so not the worker that runs it, whatever the uid). Then a seccomp filter (x86_64, aarch64):
  socket() for AF_UNIX only (no IPv4/IPv6 of any kind: UDP too, which Landlock does not cover; no
  packet or netlink sockets), no io_uring, no system calls of another ABI.
- Environment: PATH, LANG/LC_ALL, HOME and TMPDIR only; `-I` ignores PYTHON* variables and the
  user site; stdin is /dev/null once the harness has read its payload.
- Last layer, in the test process (Python level only, so never relied on alone): an audit hook
  (sys.addaudithook, cannot be removed) that refuses sockets, fork/exec/spawn/subprocess, signals
  to other processes, ctypes and _posixsubprocess, frame and garbage-collector introspection (where
  the token would be found: sys._getframe, tb_frame, gi_frame, gc.get_objects ...), opening files
  for writing outside the directory or for reading outside the standard library and the
  directory (so not the dataset with its reference answers; str or bytes paths only), and
  file-system changes outside it. It runs no Python that the code could have patched.

What holds where a layer is missing (a kernel layer the kernel refuses is dropped on the first
test and `isolation()` says so): without Landlock (old kernels, containers that block it), signals
to the worker and writes outside the directory are stopped by the audit hook only, at the Python
level, and the pool's own layers (uid nobody, file permissions) still bound what native code could
do; a worker killed that way costs that sample a null reward with a reason, not the run. Without
seccomp (other architectures), the network is closed by Landlock's TCP rules (ABI >= 4) and the
audit hook. RLIMIT_NPROC does not bind uid 0 (a pool that could not drop to `nobody`, or a direct
call as root): fork is then refused by the audit hook only, and what escapes is killed with the
process group after each test (and by the pool's subreaper after the call).

Known limits: code running inside the test process can still, in principle, forge a pass by native
memory tricks (crafted bytecode through marshal, an unlisted native module); the harness makes the
token hard to reach, it cannot make it unreachable. Reading files is limited by the audit hook only
(in the pool the worker may read what root reads, see limits.drop_to). Tests that call library
functions (math.isclose, ...) trust them: builtins are restored for the tests, standard-library
modules patched by the code are not.

Bad input: undecodable bytes or lone surrogates, a missing or malformed `tests` column, a test
that does not parse, or a response over `max_chars` raise ValueError (the pool turns that into a
null reward and the message); an empty response, no code, or code that does not parse score 0
with a reason, without starting any process.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from actors.rewards import REWARD_FUNCTIONS, limits
from actors.rewards.text import MISSING, check_text, refuse_longer, require

MODES = ("pass_fraction", "all_pass", "verpo")
EXTRACTS = ("auto", "fence", "response", "completion")
FENCE_LANGS = ("python", "py", "python3", "")
MAX_REASON = 600  # characters of a sample's reason
MAX_RESULT = 4096  # bytes read from a test's private result pipe
EXIT_FAILED, EXIT_HARNESS, EXIT_MEMORY = 1, 2, 3

# ---- the harness: runs in the test process, compiled before the code it judges ---------------------
# Protocol on the private pipe (fd given in the payload): b"S" once the payload is read (the
# harness started), b"C" once the row's setup ran (the response's code starts), b"T" once the code
# ran (the test statements start), then either the token (every statement of the test ran) or
# b"F" + a message. Nothing the response does can come before b"C".
HARNESS = r'''
def _harness():
    import os, sys, json, builtins, types
    _read, _write, _exit, _close = os.read, os.write, os._exit, os.close
    _exec, _eval, _compile = builtins.exec, builtins.eval, builtins.compile
    _type, _str, _repr, _len, _bool, _isinstance = type, str, repr, len, bool, isinstance
    _BaseException, _SystemExit, _MemoryError = BaseException, SystemExit, MemoryError
    _dict_items, _realpath, _getcwd = dict.items, os.path.realpath, os.getcwd
    chunks = []
    while True:
        b = _read(0, 1 << 20)
        if not b:
            break
        chunks.append(b)
    payload = json.loads(b"".join(chunks))
    del chunks, b
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    _close(null)
    rfd = payload["fd"]
    token = payload.pop("token").encode()
    _write(rfd, b"S")

    def fail(message, code=1):
        try:
            _write(rfd, b"F" + _str(message).encode("utf-8", "replace")[:2000])
        except _BaseException:
            pass
        _exit(code)

    try:  # the row's own code first: a failure here is the dataset's, not the response's
        setup = _compile(payload["setup"], "<setup>", "exec") if payload["setup"] else None
        steps = []
        for kind, a, b, line in payload["steps"]:
            if kind == 0:
                steps.append((0, _compile(a, "<test>", "exec"), None, line))
            else:
                steps.append((kind, _compile(a, "<test>", "eval"), _compile(b, "<test>", "eval"), line))
    except _BaseException as e:
        fail(f"the row's tests do not compile: {_type(e).__name__}: {e}", 2)
    source, entry, audit = payload["code"], payload["entry"], payload["audit"]
    del payload

    # ---- strict comparison: plain values only compare with plain values ----
    PLAIN = frozenset((int, float, complex, bool, str, bytes, type(None)))
    SEQS = frozenset((list, tuple, set, frozenset))

    def plain(v, depth=0):
        t = _type(v)
        if t in PLAIN:
            return True
        if depth > 50:
            return False
        if t in SEQS:
            for x in v:
                if not plain(x, depth + 1):
                    return False
            return True
        if t is dict:
            for k, x in _dict_items(v):
                if not plain(k, depth + 1) or not plain(x, depth + 1):
                    return False
            return True
        return False

    def show(v):
        if plain(v):
            text = _repr(v)
            return text if _len(text) <= 120 else text[:120] + "..."
        return f"a {_type(v).__name__} object"

    # ---- last layer: an audit hook (cannot be removed once added) ----
    # It uses only references taken here (builtins, C functions, str/list methods): code that
    # patches builtins or os/posixpath cannot change how it decides. Paths are normalised
    # lexically (no symlinks can be made to point outside: making one is checked too).
    _PermissionError, _ValueError, _AttributeError, _ImportError = (
        PermissionError, ValueError, AttributeError, ImportError)
    _int, _bytes, _tuple = int, bytes, tuple
    here = _realpath(_getcwd())
    bases = [*sys.path, sys.prefix, sys.base_prefix, sys.exec_prefix, "/usr/share/zoneinfo"]
    roots = _tuple({p for b in bases if b for p in (b, _realpath(b))})
    devices = ("/dev/null", "/dev/zero", "/dev/urandom")
    pid, pgid = os.getpid(), os.getpgid(0)
    WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    DENY = frozenset((
        "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn", "os.system", "os.startfile",
        "subprocess.Popen", "pty.spawn", "sys._current_frames", "sys._current_exceptions",
        "sys.settrace", "sys.setprofile", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
        "code.__new__", "function.__new__", "os.setuid", "os.setgid"))
    FS_CHANGES = frozenset((
        "os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.symlink", "os.link", "os.chmod",
        "os.chown", "os.truncate", "os.utime", "os.setxattr", "os.removexattr", "os.chflags",
        "os.lchflags", "os.mkfifo", "os.mknod", "shutil.rmtree", "shutil.copyfile", "shutil.copymode",
        "shutil.copystat", "shutil.copytree", "shutil.move", "shutil.chown", "shutil.make_archive",
        "shutil.unpack_archive"))
    FRAMES = frozenset(("tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"))
    MODULES = frozenset(("ctypes", "_ctypes", "_posixsubprocess", "_testcapi", "_testinternalcapi",
                         "_testbuffer", "_testmultiphase", "_testsinglephase", "_xxsubinterpreters",
                         "_xxinterpchannels", "_xxtestfuzz"))

    def within(path, dirs):
        for d in dirs:
            if path == d or path.startswith(d.rstrip("/") + "/"):
                return True
        return False

    def resolve(path):
        """An absolute, lexically normalised str; None for anything but str/bytes (a PathLike
        could answer differently on a second call)."""
        if _type(path) is _bytes:
            path = path.decode("utf-8", "surrogateescape")
        if _type(path) is not _str:
            return None
        if not path.startswith("/"):
            path = _getcwd() + "/" + path
        parts = []
        for seg in path.split("/"):
            if seg == "" or seg == ".":
                continue
            if seg == "..":
                if parts:
                    parts.pop()
                continue
            parts.append(seg)
        return "/" + "/".join(parts)

    def hook(event, args):  # raises no audit event itself: no re-entry guard a thread could race
        if event == "open":
            path, mode, flags = (_tuple(args) + (None, None, None))[:3]
            if path is None or _type(path) is _int:
                return
            real = resolve(path)
            writing = _type(mode) is _str and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)
            writing = writing or (_type(flags) is _int and flags & WRITE_FLAGS)
            if real is not None and (within(real, (here,)) or real in devices
                                     or (not writing and within(real, roots))):
                return
            raise _PermissionError(f"code sandbox: {'writing' if writing else 'reading'} " + (
                f"{real!r} is not allowed" if real else "needs a str or bytes path here"))
        if event in DENY or event.startswith(("socket.", "ctypes.")):
            raise _PermissionError(f"code sandbox: {event} is not allowed")
        if event == "sys._getframe":
            raise _ValueError("code sandbox: frame introspection is not allowed")
        if event == "object.__getattr__" and _len(args) > 1 and args[1] in FRAMES:
            raise _AttributeError(f"code sandbox: {args[1]} is not available")
        if event == "import" and args and _type(args[0]) is _str and (
                args[0] in MODULES or args[0].startswith("ctypes.")):
            raise _ImportError(f"code sandbox: module {args[0]} is not available")
        if event == "os.kill" or event == "os.killpg":
            target = args[0] if args else None
            if target not in ((0, pid) if event == "os.kill" else (0, pgid)):
                raise _PermissionError(f"code sandbox: {event} of another process is not allowed")
            return
        if event in FS_CHANGES:
            for a in args:
                if _type(a) is _int or a is None:
                    continue
                real = resolve(a)
                if real is None or not within(real, (here,)):
                    raise _PermissionError(f"code sandbox: {event} outside the working directory "
                                           "is not allowed")

    if audit:
        sys.addaudithook(hook)
    pristine = dict(builtins.__dict__)  # the tests see these, whatever the code does to builtins
    ns = {"__name__": "__main__", "__builtins__": builtins}
    if setup is not None:
        try:
            _exec(setup, ns)
        except _BaseException as e:
            fail(f"the row's setup failed: {_type(e).__name__}: {e}", 2)
    _write(rfd, b"C")  # from here on, the response's code runs
    where = " (in the code)"
    try:
        try:
            code = _compile(source, "<solution>", "exec")
        except SyntaxError as e:
            fail(f"SyntaxError: {e.msg} (line {e.lineno})")
        _exec(code, ns)
        tns = {k: v for k, v in _dict_items(ns) if k not in pristine or k == entry}
        tns["__builtins__"] = pristine
        _write(rfd, b"T")  # the code ran: from here on, failures are the tests'
        for kind, a, b, line in steps:
            where = f" (line {line})" if line > 1 else ""
            if kind == 0:
                _exec(a, tns)
                continue
            left = _eval(a, tns)
            right = _eval(b, tns)
            pl, pr = plain(left), plain(right)
            if pl or pr:
                ok = pl and pr and ((left == right) if kind == 1 else (left != right))
            else:
                ok = _bool(left == right) if kind == 1 else _bool(left != right)
            if not ok:
                op = "!=" if kind == 1 else "=="
                fail(f"AssertionError: {show(left)} {op} {show(right)}{where}")
    except _MemoryError:
        ns = tns = None
        fail("MemoryError", 3)
    except _SystemExit as e:
        fail(f"called sys.exit({show(e.code)}){where} before the tests finished")
    except _BaseException as e:
        try:
            text = _str(e)
        except _BaseException:
            text = "(unprintable)"
        text = text if _len(text) <= 300 else text[:300] + "..."
        fail(f"{_type(e).__name__}: {text}{where}" if text else f"{_type(e).__name__}{where}")
    _write(rfd, token)
    _exit(0)


_harness()
'''


# ---- extraction and checks (in the worker) ----------------------------------------------------------
_FENCE = re.compile(r"```[ \t]*([\w+\-.]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)


def extract_code(text: str, how: str = "auto", prompt: str = "") -> str | None:
    """The code to run: the last ```python (or ```py, ```python3, unlabelled) fence for `auto` and
    `fence` (`auto` falls back to the whole text; `fence` gives None without one); the whole text
    for `response`; the prompt followed by the text for `completion`. A fence left open at the end
    of the text runs to the end."""
    if how not in EXTRACTS:
        raise ValueError(f"args.extract must be one of {EXTRACTS}, got {how!r}")
    if how == "response":
        return text
    if how == "completion":
        return prompt + text
    found = None
    for m in _FENCE.finditer(text):
        if m.group(1).lower() in FENCE_LANGS:
            found = m.group(2)
    if found is None and how == "auto":
        return text
    return found


def parse_tests(tests, columns: dict) -> list[str]:
    """The row's tests: a list of Python source strings, or a JSON string of one."""
    tests = require(tests, "tests", columns)
    if isinstance(tests, (bytes, bytearray)):
        tests = check_text(tests, "tests")
    if isinstance(tests, str):
        try:
            tests = json.loads(tests)
        except ValueError:
            raise ValueError("row's 'tests' is a string but not JSON; give a list of test strings "
                             "(e.g. [\"assert f(1) == 2\"]) or a JSON string of one") from None
    if not isinstance(tests, (list, tuple)):
        raise ValueError(f"row's 'tests' must be a list of test strings, got {type(tests).__name__}")
    if not tests:
        raise ValueError("row's 'tests' is empty: nothing to run")
    out = []
    for i, t in enumerate(tests):
        if not isinstance(t, str):
            raise ValueError(f"row's tests[{i}] must be a string of Python, got {type(t).__name__}")
        out.append(check_text(t, f"tests[{i}]"))
    return out


def test_steps(test: str, i: int) -> list[list]:
    """A test split into statements; `assert a == b` / `assert a != b` become their two sides
    (kind 1 / 2), compared strictly by the harness; anything else runs as is (kind 0)."""
    try:
        tree = ast.parse(test, f"<test {i}>")
    except SyntaxError as e:
        raise ValueError(f"tests[{i}] is not valid Python: {e.msg} (line {e.lineno})") from None
    except (ValueError, RecursionError, MemoryError) as e:
        raise ValueError(f"tests[{i}] cannot be parsed: {type(e).__name__}") from None
    if not tree.body:
        raise ValueError(f"tests[{i}] has no statements")
    steps = []
    for node in tree.body:
        t = node.test if isinstance(node, ast.Assert) else None
        if (isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.Eq, ast.NotEq))
                and node.msg is None):
            kind = 1 if isinstance(t.ops[0], ast.Eq) else 2
            steps.append([kind, ast.unparse(t.left), ast.unparse(t.comparators[0]), node.lineno])
        else:
            steps.append([0, ast.unparse(node), None, node.lineno])
    return steps


def defines(tree: ast.Module, name: str) -> bool:
    """Whether module-level code binds `name` (def, class, assignment, import, for/with targets)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store):
            return True
        if isinstance(node, ast.alias) and (node.asname or node.name.split(".")[0]) == name:
            return True
    return False


def _number(value, name: str, low: float = 0.0) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"args.{name} must be a number, got {value!r}") from None
    if not value > low or value != value:
        raise ValueError(f"args.{name} must be > {low:g}, got {value!r}")
    return value


# ---- running one test ------------------------------------------------------------------------------
# Optional kernel layers, probed in this process on first use: [landlock ABI, seccomp on]. A layer
# the kernel refuses in the forked child is dropped (and reported by isolation()).
_LAYERS: list = []

# seccomp-BPF: socket() only for AF_UNIX (no IPv4/IPv6/packet/netlink sockets: UDP too, which
# Landlock does not cover), no io_uring (it could open sockets around the filter), and no system
# calls of another ABI (x32, i386). struct seccomp_data: nr at 0, arch at 4, args[0] at 16.
_SECCOMP_ARCH = {"x86_64": (0xC000003E, 41, 425), "aarch64": (0xC00000B7, 198, 425)}
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2


def _seccomp_program() -> list[tuple[int, int, int, int]] | None:
    arch = _SECCOMP_ARCH.get(os.uname().machine)
    if arch is None:
        return None
    audit_arch, nr_socket, nr_io_uring = arch
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | 13  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EACCES
    return [(ld, 0, 0, 4), (jeq, 1, 0, audit_arch), (ret, 0, 0, deny),        # 0-2: arch
            (ld, 0, 0, 0), (jge, 5, 0, 0x40000000),                            # 3-4: x32 calls
            (jeq, 1, 0, nr_socket), (jeq, 3, 2, nr_io_uring),                  # 5-6
            (ld, 0, 0, 16), (jeq, 0, 1, 1),                                    # 7-8: AF_UNIX only
            (ret, 0, 0, allow), (ret, 0, 0, deny)]                             # 9-10


def _seccomp_no_inet() -> None:
    import ctypes

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                    ("k", ctypes.c_uint32)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Filter))]

    insns = _seccomp_program()
    array = (Filter * len(insns))(*[Filter(*i) for i in insns])
    prog = Program(len(insns), array)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_SECCOMP, ctypes.c_ulong(_SECCOMP_MODE_FILTER), ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp filter refused")


def _layers() -> tuple[int, bool]:
    if not _LAYERS:
        _LAYERS.extend([limits.landlock_abi(), _seccomp_program() is not None])
    return _LAYERS[0], _LAYERS[1]


def isolation() -> dict:
    """The layers a test process gets here (run from a pool worker, it adds to the worker's)."""
    abi, seccomp = _layers()
    return {"landlock": limits.landlock_layers(abi), "landlock_abi": abi,
            "seccomp": ["no_inet_sockets", "no_io_uring"] if seccomp else [],
            "nproc_enforced": os.geteuid() != 0, "uid": os.geteuid(),
            "rlimits": ["AS", "CPU", "FSIZE", "NOFILE", "NPROC", "CORE"],
            "in_child": (["audit_hook"] if audit_hook_on() else []) + ["strict_eq", "pristine_builtins"],
            "judge": "exit status 0 + per-test token on a private pipe"}


def _set_limit(kind: int, value: int) -> None:
    import resource

    soft, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(kind, (value, value))


def _child_setup(parent: int, directory: str, memory_b: int, cpu_s: int, file_b: int, abi: int,
                 seccomp: bool) -> None:
    """In the forked test process, before exec (the worker is single-threaded)."""
    import resource

    limits.prctl(limits.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(70)
    os.umask(0o077)
    _set_limit(resource.RLIMIT_CORE, 0)
    _set_limit(resource.RLIMIT_AS, memory_b)
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    cpu = (cpu_s, cpu_s + 1) if hard == resource.RLIM_INFINITY else (min(cpu_s, hard), hard)
    resource.setrlimit(resource.RLIMIT_CPU, cpu)
    _set_limit(resource.RLIMIT_FSIZE, file_b)
    _set_limit(resource.RLIMIT_NOFILE, 64)
    _set_limit(resource.RLIMIT_NPROC, 0)
    limits.no_new_privs()
    if abi:
        limits.landlock_confine(abi, [directory], [os.devnull])
    if seccomp:
        _seccomp_no_inet()


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
    text = raw.decode("utf-8", "replace").replace("\x00", "")
    text = "".join(c if c.isprintable() else " " for c in text).strip()
    return text if len(text) <= n else text[:n] + "..."


def audit_hook_on() -> bool:
    """The in-child audit hook is on unless COEVO_CODE_TESTS_NO_AUDIT_HOOK=1 is in the environment:
    only for tests that check the kernel layers alone (a pool passes it with RewardPool(env=...))."""
    return os.environ.get("COEVO_CODE_TESTS_NO_AUDIT_HOOK") != "1"


def run_test(python: str, payload: dict, wall_s: float, cpu_s: float, memory_mb: float,
             max_output: int, file_mb: float) -> tuple[bool, str | None, bool]:
    """Run one test in a fresh process: (passed, why not, whether the code ran and the test
    statements started)."""
    token = secrets.token_hex(16)
    directory = tempfile.mkdtemp(prefix="code-")
    r_fd, w_fd = os.pipe()
    data = json.dumps({**payload, "token": token, "fd": w_fd, "audit": audit_hook_on()}).encode()
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": directory,
           "TMPDIR": directory}
    args = (os.getpid(), directory, int(memory_mb * 2**20), max(1, round(cpu_s)), int(file_mb * 2**20))
    proc = None
    try:
        abi, seccomp = _layers()
        tries = list(dict.fromkeys([(abi, seccomp), (abi, False), (0, seccomp), (0, False)]))
        for n, (lab, sec) in enumerate(tries):
            try:
                proc = subprocess.Popen(
                    [python, "-I", "-S", "-B", "-c", HARNESS], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=directory, env=env,
                    pass_fds=(w_fd,), start_new_session=True, bufsize=0,
                    preexec_fn=lambda: _child_setup(*args, lab, sec))
                _LAYERS[:] = [lab, sec]  # what works here, from now on
                break
            except subprocess.SubprocessError:
                if n + 1 == len(tries):
                    raise
        os.close(w_fd)
        w_fd = -1
        return _watch(proc, data, r_fd, token, wall_s, cpu_s, memory_mb, max_output)
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


def _watch(proc, data: bytes, r_fd: int, token: str, wall_s: float, cpu_s: float, memory_mb: float,
           max_output: int) -> tuple[bool, str | None, bool]:
    """Feed the payload, read the output (capped) and the private result pipe, until the process
    exits, the wall limit passes or the output cap is crossed; then kill its group and judge."""
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
            tail = (tail + chunk)[-2000:]

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
    code = proc.wait()
    return _verdict(code, bytes(result), token, bytes(tail), timed_out, over or output > max_output,
                    wall_s, cpu_s, memory_mb, max_output)


def _verdict(code: int, result: bytes, token: str, tail: bytes, timed_out: bool, over: bool,
             wall_s: float, cpu_s: float, memory_mb: float, max_output: int
             ) -> tuple[bool, str | None, bool]:
    """(passed, why not, tests reached) from what the parent saw: only an exit status of 0 with
    the token after b"S" b"T" passes."""
    reached = result.startswith(b"SCT")
    passed, why = _judge(code, result, token, tail, timed_out, over, wall_s, cpu_s, memory_mb, max_output)
    return passed, why, reached


def _judge(code, result, token, tail, timed_out, over, wall_s, cpu_s, memory_mb, max_output):
    if result.startswith(b"S") and not result.startswith(b"SC"):  # the row's setup or tests failed
        why = (f"timed out after {wall_s:g}s" if timed_out else _clean(result[2:]) if result[1:2] == b"F"
               else f"exit status {code}")
        raise ValueError(f"the row's setup or tests failed before the response's code ran: {why}")
    if timed_out:
        return False, f"timed out after {wall_s:g}s"
    if over:
        return False, f"wrote more than {max_output:,} bytes of output"
    cpu = f"CPU time limit ({max(1, round(cpu_s))}s) exceeded"
    if not result.startswith(b"S"):  # the harness never ran: a set-up problem, not the code's fault
        if code == -signal.SIGXCPU:
            return False, cpu
        lines = tail.strip().splitlines()
        raise RuntimeError(f"the test process did not start (exit status {code}): "
                           f"{_clean(lines[-1]) if lines else 'no output'}")
    body = result[3:] if result.startswith(b"SCT") else result[2:]
    if code == 0 and result.startswith(b"SCT") and body == token.encode():
        return True, None
    if code in (-signal.SIGXCPU, -signal.SIGKILL):
        return False, cpu if code == -signal.SIGXCPU else "killed (SIGKILL: CPU or memory limit?)"
    if code == EXIT_MEMORY:
        return False, f"memory limit ({memory_mb:g} MB) exceeded (MemoryError)"
    if code in (EXIT_FAILED, EXIT_HARNESS) and body.startswith(b"F"):
        return False, _clean(body[1:])
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "?"
        return False, f"crashed (signal {-code}, {name})"
    return False, f"exited with status {code} before the tests finished"


# ---- the reward function ------------------------------------------------------------------------------
@REWARD_FUNCTIONS.register("code_tests")
def code_tests(prompt: str, response: str, tests=MISSING, setup=None, entry=None, mode: str = "pass_fraction",
               extract: str = "auto", test_timeout_s: float = 2.0, cpu_time_s: float = 1.0,
               time_limit_s: float = 4.0, memory_mb: float = 256, max_output_bytes: int = 1 << 20,
               file_mb: float = 16, max_chars: int | None = 100_000, interpreter: str | None = None,
               prior: float = 1.0, decay: float = 1.0, outcome_weight: float = 0.0, **columns) -> float:
    """Run the response's code against the row's unit tests (see the module docstring for the
    `tests` format, the modes, the arguments and the protections).

    YAML: `{name: tests, fn: code_tests, timeout_s: 10, args: {mode: pass_fraction}}`
    """
    from actors.rewards.worker import Scored  # here: the zygote runs that module as __main__

    if mode not in MODES:
        raise ValueError(f"args.mode must be one of {MODES}, got {mode!r}")
    test_timeout_s = _number(test_timeout_s, "test_timeout_s")
    cpu_time_s = _number(cpu_time_s, "cpu_time_s")
    time_limit_s = _number(time_limit_s, "time_limit_s")
    memory_mb = _number(memory_mb, "memory_mb", 16)
    max_output_bytes = int(_number(max_output_bytes, "max_output_bytes"))
    file_mb = _number(file_mb, "file_mb")
    cases = parse_tests(tests, columns)
    steps = [test_steps(t, i) for i, t in enumerate(cases)]
    text = refuse_longer(check_text(response), max_chars)
    setup = check_text(setup, "setup") if setup else ""
    if setup:
        try:
            ast.parse(setup, "<setup>")
        except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
            raise ValueError(f"'setup' is not valid Python: {type(e).__name__}: {e}") from None
    if entry is not None and not (isinstance(entry, str) and entry.isidentifier()):
        raise ValueError(f"'entry' must be a Python name, got {entry!r}")
    verpo = None
    if mode == "verpo":
        try:
            verpo = {"key": tests_key(cases), "prior": float(prior), "decay": float(decay),
                     "outcome_weight": float(outcome_weight)}
        except (TypeError, ValueError):
            raise TypeError("args.prior, args.decay and args.outcome_weight must be numbers") from None
        if not (verpo["prior"] >= 0 and 0 < verpo["decay"] <= 1 and 0 <= verpo["outcome_weight"] <= 1):
            raise ValueError(f"VeRPO needs args.prior >= 0, 0 < args.decay <= 1 and 0 <= "
                             f"args.outcome_weight <= 1; got {prior!r}, {decay!r}, {outcome_weight!r}")
    code = extract_code(text, extract, check_text(prompt, "prompt") if extract == "completion" else "")
    n = len(cases)

    def scored(passed: list[int], reason: str | None) -> float:
        k = sum(passed)
        value = k / n if mode != "all_pass" else float(k == n)
        details = {"passed": passed}
        if verpo is not None:
            details["verpo"] = verpo
        if reason is not None and len(reason) > MAX_REASON:
            reason = reason[:MAX_REASON] + "..."
        return Scored(value, reason, details)

    if code is None:
        return scored([0] * n, "no ```python code block in the response")
    if not code.strip():
        return scored([0] * n, "empty response: no code to run")
    try:
        tree = ast.parse(code, "<solution>")
    except SyntaxError as e:
        return scored([0] * n, f"the code does not parse: SyntaxError: {e.msg} (line {e.lineno})")
    except (ValueError, RecursionError, MemoryError) as e:
        return scored([0] * n, f"the code does not parse: {type(e).__name__}")
    if entry and not defines(tree, entry):
        return scored([0] * n, f"the code does not define {entry!r}")
    del tree
    python = interpreter or sys.executable
    passed, failures = [], []
    start = time.monotonic()
    for i, test in enumerate(steps):
        left = time_limit_s - (time.monotonic() - start)
        if left < 0.05:
            passed.extend([0] * (n - i))
            failures.append(f"tests {i + 1}-{n}: not run (time_limit_s={time_limit_s:g} used up)"
                            if i + 1 < n else f"test {n}: not run (time_limit_s={time_limit_s:g} used up)")
            break
        ok, why, reached = run_test(python, {"code": code, "setup": setup, "steps": test, "entry": entry},
                                    min(test_timeout_s, left), cpu_time_s, memory_mb, max_output_bytes,
                                    file_mb)
        passed.append(int(ok))
        if not ok:
            failures.append(f"test {i + 1}: {why}")
        if not ok and not reached and i + 1 < n:
            # The code itself failed before any test statement ran: every test would run it again.
            passed.extend([0] * (n - i - 1))
            failures.append(f"test{'s' if i + 2 < n else ''} {i + 2}{f'-{n}' if i + 2 < n else ''}: "
                            "not run (the code failed before reaching the tests)")
            break
    k = sum(passed)
    return scored(passed, None if k == n else f"{k}/{n} tests passed; " + "; ".join(failures))


code_tests.reward_preload = ("subprocess", "secrets", "actors.rewards.worker")


# ---- VeRPO: difficulty weights from pass statistics (the Verifier calls this) ----------------------------
def tests_key(tests: list[str]) -> str:
    """Identifies a row's test list: statistics restart when a prompt's tests change."""
    return hashlib.sha1(json.dumps(tests).encode()).hexdigest()[:16]


def verpo_weights(attempts: list[float], passes: list[float], prior: float = 1.0) -> list[float]:
    """Each test's weight: its difficulty, normalised to sum to 1 over the prompt's tests.

    pass rate  p_j = (passes_j + prior) / (attempts_j + 2 * prior)   (Beta(prior, prior) smoothing)
    difficulty d_j = 1 - p_j
    weight     w_j = d_j / sum_k d_k                                  (uniform when every d_j is 0)

    A test that few responses pass weighs more; an unseen test has p = 1/2. Ours, in the spirit
    of VeRPO (arXiv:2601.03525), which estimates each test's difficulty from its empirical pass
    rate among the sampled responses; we pool the counts across the run (with `decay`) instead of
    within one group only, and smooth them.
    """
    d = [1.0 - (p + prior) / (n + 2 * prior) if n + 2 * prior > 0 else 0.5 for n, p in zip(attempts, passes)]
    total = sum(d)
    if total <= 0:
        return [1.0 / len(d)] * len(d)
    return [x / total for x in d]


def verpo_reward(passed: list[int], weights: list[float], outcome_weight: float = 0.0) -> float:
    """(1 - outcome_weight) * sum of the weights of the passed tests + outcome_weight * all-pass:
    the dense signal, optionally tied to the global outcome as VeRPO does. In [0, 1]; 1 when all pass."""
    dense = sum(w for w, ok in zip(weights, passed) if ok)
    return (1.0 - outcome_weight) * min(dense, 1.0) + outcome_weight * float(all(passed))


def _verpo_row(details) -> tuple[list[int], dict] | None:
    """(passed, settings) from one sample's details, None when they are not what code_tests gives
    (the hook runs in the Verifier actor: malformed data must not break it)."""
    try:
        passed, conf = details["passed"], details["verpo"]
        if not (isinstance(passed, list) and passed and all(p in (0, 1) for p in passed)
                and isinstance(conf["key"], str)):
            return None
        prior, decay, weight = (float(conf[k]) for k in ("prior", "decay", "outcome_weight"))
    except (KeyError, TypeError, ValueError):
        return None
    if not (0 <= prior < float("inf") and 0 < decay <= 1 and 0 <= weight <= 1):
        return None
    return [int(p) for p in passed], {"key": conf["key"], "prior": prior, "decay": decay,
                                       "outcome_weight": weight}


def verpo_rewards(stats: dict, rows: list[tuple[str, dict]]) -> tuple[dict, list[float | None]]:
    """Update the statistics with this batch's rows, then score them.

    stats: {prompt_id: [key, attempts, passes]} (JSON-able: the Verifier checkpoints it); rows:
    (prompt_id, details) per scored sample, details as code_tests returns them (`passed` and
    `verpo`: key, prior, decay, outcome_weight). The counts of a prompt's tests first decay
    (multiplied by `decay`; 1 keeps them all), then take this batch's samples of that prompt, so a
    prompt seen for the first time is weighted by its own group alone. Returns (new stats, one
    reward per row, None for a row whose details are malformed); `stats` itself is not modified
    (a state_dict saved earlier stays as it was)."""
    stats = dict(stats)
    groups: dict[str, list[int]] = {}
    parsed = [_verpo_row(d) for _, d in rows]
    for r, (pid, _) in enumerate(rows):
        if parsed[r] is not None:
            groups.setdefault(str(pid), []).append(r)
    rewards: list[float | None] = [None] * len(rows)
    for pid, members in groups.items():
        first, conf = parsed[members[0]]
        n = len(first)
        members = [r for r in members if len(parsed[r][0]) == n and parsed[r][1]["key"] == conf["key"]]
        entry = stats.get(pid)
        try:  # a prompt whose tests changed (or a malformed entry) starts again
            if entry[0] != conf["key"] or len(entry[1]) != n or len(entry[2]) != n:
                raise ValueError
            attempts = [float(a) * conf["decay"] for a in entry[1]]
            passes = [float(p) * conf["decay"] for p in entry[2]]
        except (TypeError, IndexError, KeyError, ValueError):
            attempts, passes = [0.0] * n, [0.0] * n
        for r in members:
            for j, ok in enumerate(parsed[r][0]):
                attempts[j] += 1.0
                passes[j] += ok
        stats[pid] = [conf["key"], attempts, passes]
        weights = verpo_weights(attempts, passes, conf["prior"])
        for r in members:
            rewards[r] = verpo_reward(parsed[r][0], weights, conf["outcome_weight"])
    return stats, rewards
