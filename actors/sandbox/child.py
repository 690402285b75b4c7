"""The kernel layers of code_tests' test process (`python -I -S -B -c HARNESS`), applied in the
forked child before exec, and the check that they hold here.

Layers (names as `missing` and `allow_missing_layers` spell them):
- `capabilities`: bounding, ambient, inheritable, permitted and effective sets emptied, securebits
  locked (SECBIT_NOROOT...), so even a uid-0 test process has and gains no capability;
- `landlock_fs`: reads, listings and exec only beneath the test's directory (which it may also
  write), the interpreter's own files (executable, standard library without site-packages, the
  shared libraries it maps, pyvenv.cfg), /etc/ld.so.cache, /usr/share/zoneinfo, and /dev/null,
  /dev/zero, /dev/urandom; writes only to its directory and /dev/null. The kernel resolves every
  path (symlinks, `..`, dir_fd), so no path trick reaches /proc, the dataset, site-packages or
  /root. Landlock ABI >= 1;
- `landlock_tcp` (ABI >= 4): no TCP bind or connect;
- `landlock_signals` (ABI >= 6): no signals to, and no abstract unix sockets of, processes
  outside the test (so not the worker that runs it);
- `seccomp`: no socket() at all (no IPv4/IPv6, packet or netlink sockets, and no unix socket
  that could connect() to a path outside: Landlock does not check that), no io_uring, no
  unshare() (user namespaces), no system calls of another ABI (x86_64, aarch64).
Always: no_new_privs, RLIMIT_AS/CPU/FSIZE/NOFILE/NPROC=0/CORE=0, PR_SET_PDEATHSIG.

`check(python)` starts one test process with every layer, verifies each from outside
(/proc/<pid>/status) and from inside (a read, a listing, a write and a signal it must be refused),
and returns the layers that hold; code_tests refuses to run without one unless allowed.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys

from actors.sandbox import limits

LAYERS = ("capabilities", "landlock_fs", "landlock_tcp", "landlock_signals", "seccomp")
ALLOW_ENV = "COEVO_CODE_TESTS_ALLOW_MISSING_LAYERS"  # comma-separated layer names, or "landlock"

# seccomp-BPF: no socket() of any family (UDP, raw and netlink, which Landlock does not cover; and
# AF_UNIX too: connect() to a pathname socket such as Ray's raylet under /tmp/ray is not a Landlock
# file access, so only refusing the socket stops it), no io_uring (it could open sockets around
# the filter), no unshare() (a new user namespace gives the test process every capability in it:
# kernel attack surface it has no use for), and no system calls of another ABI (x32, i386).
# struct seccomp_data: nr at 0, arch at 4. socketpair() stays: an unnamed pair reaches nothing.
_SECCOMP_ARCH = {"x86_64": (0xC000003E, 41, 425, 272), "aarch64": (0xC00000B7, 198, 425, 97)}
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2


def seccomp_program() -> list[tuple[int, int, int, int]] | None:
    arch = _SECCOMP_ARCH.get(os.uname().machine)
    if arch is None:
        return None
    audit_arch, nr_socket, nr_io_uring, nr_unshare = arch
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | 13  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EACCES
    return [(ld, 0, 0, 4), (jeq, 1, 0, audit_arch), (ret, 0, 0, deny),        # 0-2: arch
            (ld, 0, 0, 0), (jge, 4, 0, 0x40000000),                            # 3-4: x32 calls
            (jeq, 3, 0, nr_socket), (jeq, 2, 0, nr_io_uring),                  # 5-6
            (jeq, 1, 0, nr_unshare),                                           # 7
            (ret, 0, 0, allow), (ret, 0, 0, deny)]                             # 8-9


def _seccomp_no_inet() -> None:
    import ctypes

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                    ("k", ctypes.c_uint32)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Filter))]

    insns = seccomp_program()
    array = (Filter * len(insns))(*[Filter(*i) for i in insns])
    prog = Program(len(insns), array)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_SECCOMP, ctypes.c_ulong(_SECCOMP_MODE_FILTER), ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp filter refused")


# ---- what the interpreter needs to read ----------------------------------------------------------------
_INFO = r'''
import json, os, sys, sysconfig
for m in ("math", "_json", "zlib", "_hashlib", "_decimal", "_ctypes", "_random", "_bisect", "_heapq",
          "_datetime", "unicodedata", "array", "select", "_struct", "_pickle", "binascii"):
    try:
        __import__(m)
    except ImportError:
        pass
paths = sysconfig.get_paths()
with open("/proc/self/maps") as f:
    maps = sorted({l.split(None, 5)[5].strip() for l in f if len(l.split(None, 5)) == 6 and "/" in l})
print(json.dumps({"exe": sys.executable, "base": getattr(sys, "_base_executable", sys.executable),
                  "stdlib": [paths["stdlib"], paths["platstdlib"]], "prefix": [sys.prefix, sys.base_prefix],
                  "maps": [m for m in maps if m.startswith("/") and os.path.isfile(m)]}))
'''
_RULES: dict[str, list] = {}


def read_rules(python: str) -> list[tuple[str, int]]:
    """(path, access) pairs a test process may read (and exec, for the interpreter and ld.so),
    from one run of `python` (cached per interpreter)."""
    if python in _RULES:
        return _RULES[python]
    out = subprocess.run([python, "-I", "-S", "-B", "-c", _INFO], capture_output=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}, stdin=subprocess.DEVNULL)
    if out.returncode:
        raise RuntimeError(f"the interpreter {python!r} does not run (exit status {out.returncode}): "
                           f"{out.stderr.decode(errors='replace')[-300:]}")
    info = json.loads(out.stdout)
    real = os.path.realpath
    rules: list[tuple[str, int]] = []
    for exe in {real(python), real(info["exe"]), real(info["base"])}:
        rules.append((exe, limits.FS_READ_EXEC))
    for d in dict.fromkeys(real(p) for p in info["stdlib"]):
        if os.path.isdir(d):  # each entry but site-packages: installed packages stay out of reach
            rules.append((d, limits.FS_READ_DIR))  # import lists it (site-packages' names show)
            for name in os.listdir(d):
                if name not in ("site-packages", "dist-packages"):
                    path = os.path.join(d, name)
                    rules.append((path, limits.FS_READ if os.path.isdir(path) else limits.FS_READ_FILE_ONLY))
    for d in {os.path.dirname(os.path.abspath(python)), os.path.dirname(real(python)), *info["prefix"]}:
        for cfg in (os.path.join(d, "pyvenv.cfg"), os.path.join(os.path.dirname(d), "pyvenv.cfg")):
            if os.path.isfile(cfg):
                rules.append((real(cfg), limits.FS_READ_FILE_ONLY))
    prefixes = tuple(real(p).rstrip("/") + "/" for p in info["prefix"]) + ("/proc/", "/dev/", "/root/")
    for lib in info["maps"]:
        lib = real(lib)
        if os.path.basename(lib).startswith("ld-"):
            rules.append((lib, limits.FS_READ_EXEC))  # the ELF interpreter is opened for exec
        elif lib.startswith(prefixes) or "-packages/" in lib:
            rules.append((lib, limits.FS_READ_FILE_ONLY))  # that file only, not its neighbours
        else:  # a system library directory: its other libraries load lazily (libffi, libz, ...)
            rules.append((os.path.dirname(lib), limits.FS_READ))
    rules += [("/etc/ld.so.cache", limits.FS_READ_FILE_ONLY), ("/usr/share/zoneinfo", limits.FS_READ),
              ("/dev/zero", limits.FS_READ_FILE_ONLY), ("/dev/urandom", limits.FS_READ_FILE_ONLY)]
    _RULES[python] = list(dict.fromkeys(rules))
    return _RULES[python]


def remember_rules(python: str, rules: list) -> None:
    """Rules found by a check in another process (the pool's start-up check)."""
    _RULES[python] = [(str(path), int(access)) for path, access in rules]


# ---- in the forked child, before exec ------------------------------------------------------------------
def _set_limit(kind: int, value: int) -> None:
    soft, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(kind, (value, value))


def apply(parent: int, directory: str, memory_b: int, cpu_s: int, file_b: int, abi: int, seccomp: bool,
          rules: list | None, failed: list | None = None) -> None:
    """Every layer, in the forked test process (the worker is single-threaded). With `failed`, a
    layer the kernel refuses is recorded there and skipped (the check); without, it raises."""
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

    def layer(name, fn, *args):
        if failed is None:
            fn(*args)
            return
        try:
            fn(*args)
        except Exception as e:
            failed.append(f"{name}: {type(e).__name__}: {e}")

    layer("capabilities", limits.drop_capabilities)
    if abi:
        layer("landlock", limits.landlock_confine, abi, [directory], [os.devnull], rules)
    if seccomp:
        layer("seccomp", _seccomp_no_inet)


# ---- the check -------------------------------------------------------------------------------------------
_PROBE = r'''
import json, os, sys, socket
def refused(f):
    try:
        f()
    except PermissionError:
        return True
    except OSError:
        return False
    return False
print("R", flush=True)
sys.stdin.read()
print(json.dumps({"read": refused(lambda: os.listdir("/")) and refused(lambda: open("/proc/self/status").close()),
                  "write": refused(lambda: open("/dev/zero", "wb").close()),
                  "signals": refused(lambda: os.kill(os.getppid(), 0)),
                  "seccomp": refused(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close())
                             and refused(lambda: socket.socket(socket.AF_UNIX).close())}))
'''


def check(python: str, directory: str) -> dict:
    """Start one test process with every layer here; {"landlock_abi", "seccomp", "holds": [...],
    "missing": {layer: why}, "rules": the read rules}. `directory`: a scratch directory."""
    abi = limits.landlock_abi()
    seccomp = seccomp_program() is not None
    missing: dict[str, str] = {}
    if abi < 1:
        missing["landlock_fs"] = "the kernel has no Landlock (Linux >= 5.13 with Landlock enabled)"
    if abi < 4:
        missing["landlock_tcp"] = f"Landlock ABI {abi} < 4"
    if abi < 6:
        missing["landlock_signals"] = f"Landlock ABI {abi} < 6"
    if not seccomp:
        missing["seccomp"] = f"no seccomp filter for {os.uname().machine}"
    rules = read_rules(python) if abi else None
    r_fd, w_fd = os.pipe()
    failed: list[str] = []

    def setup():
        os.close(r_fd)
        apply(parent, directory, 1 << 31, 5, 1 << 20, abi, seccomp, rules, failed)
        os.write(w_fd, json.dumps(failed).encode())
        os.close(w_fd)

    parent = os.getpid()
    proc = subprocess.Popen([python, "-I", "-S", "-B", "-c", _PROBE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=directory,
                            env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}, preexec_fn=setup,
                            pass_fds=(w_fd,))
    os.close(w_fd)
    with os.fdopen(r_fd, "rb") as f:
        refused = json.loads(f.read() or b"[]")
    proc.stdout.readline()  # it runs: exec is done, so its capabilities are final
    status = {}
    try:
        with open(f"/proc/{proc.pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        pass
    out, err = proc.communicate(b"", timeout=60)
    for why in refused:
        name = why.split(":", 1)[0]
        for layer in (LAYERS if name == "landlock" else (name,)):
            if layer.startswith(name):
                missing.setdefault(layer, why)
    caps = {k: status.get(k, "?").strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
    uid = status.get("Uid", "0").split()[1:2] or ["0"]  # effective uid
    if uid != ["0"] and status.get("NoNewPrivs", "").strip() == "1":
        caps.pop("CapBnd")  # a non-root uid under no_new_privs cannot gain what its bounding set holds
    if any(v.strip("0") for v in caps.values()):
        missing.setdefault("capabilities", f"the test process still has capabilities: {caps}")
    try:
        seen = json.loads(out)
    except ValueError:
        raise RuntimeError(f"the test process did not start under the kernel layers (exit status "
                           f"{proc.returncode}): {err.decode(errors='replace')[-300:]}") from None
    for key, layer in (("read", "landlock_fs"), ("write", "landlock_fs"), ("signals", "landlock_signals"),
                       ("seccomp", "seccomp")):
        if not seen.get(key):
            missing.setdefault(layer, f"a test process could still {key.replace('read', 'read outside')}")
    return {"landlock_abi": abi, "seccomp": seccomp and "seccomp" not in missing,
            "holds": [layer for layer in LAYERS if layer not in missing], "missing": missing,
            "rules": rules}


def allowed_missing(value=None) -> set[str]:
    """The layers a user let code_tests run without (`allow_missing_layers`, or ALLOW_ENV)."""
    if value is None:
        value = os.environ.get(ALLOW_ENV, "")
    if isinstance(value, str):
        value = [v for v in value.replace(" ", "").split(",") if v]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"allow_missing_layers must be a list of layer names, got {value!r}")
    out = set()
    for v in value:
        if v == "landlock":
            out |= {layer for layer in LAYERS if layer.startswith("landlock")}
        elif v in LAYERS or v == "uid":
            out.add(v)
        else:
            raise ValueError(f"allow_missing_layers: unknown layer {v!r}; the layers are "
                             f"{', '.join(LAYERS)}, uid (or landlock for all landlock_*)")
    return out
