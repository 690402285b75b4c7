"""Limits and isolation layers for reward worker processes (Linux).

Everything here runs in a freshly forked worker (actors.sandbox.worker) before any user code, except
`clean_env`, which the pool uses to build the zygote's environment. Each layer, and what it stops:

- `clean_env`: an allowlist (PATH, LANG, LC_*, ...), so RAY_*, *_TOKEN, *KEY*, AWS_* and the like
  never reach user code; HOME and TMPDIR point at the worker's throwaway directory.
- `set_rlimits`: RLIMIT_AS (memory bombs raise MemoryError), RLIMIT_FSIZE (disk-filling writes
  fail), RLIMIT_NOFILE, RLIMIT_CORE=0 (no core dumps), RLIMIT_NPROC (fork bombs; only enforced
  for a non-root uid, so only set after a uid drop). RLIMIT_CPU is set per sample by the worker.
- `no_new_privs`: setuid binaries cannot give the worker back privileges; Landlock requires it.
- `drop_to` (when the pool runs as root): uid/gid `nobody`, no supplementary groups, no
  capabilities (bounding and ambient sets empty too). The worker can no longer signal or ptrace
  root processes (the verifier actor, the zygote, Ray), write files it does not own, or fork past
  RLIMIT_NPROC (root is exempt from it). Where `nobody` cannot reach the interpreter or sys.path
  (Python under /root), the zygote shows it those paths first (actors.sandbox.mountns).
- `drop_capabilities` (root that cannot become `nobody` at all): stays uid 0 with no capabilities
  for good: it cannot reboot, load modules, mount, change the clock or signal other users'
  processes; root's own processes (the pool) are then protected only by Landlock's scoping.
- `landlock_confine` (kernel >= 5.13 with Landlock enabled): writes only beneath the worker's
  directory (and /dev/null), whatever the uid; ABI >= 4: no TCP bind/connect (e.g. to Ray's GCS);
  ABI >= 6: no signals to, and no abstract unix sockets of, processes outside the worker. With
  `readable`, reads, listings and exec are confined too (code_tests' test processes).

The pool reports which layers are on (RewardPool.isolation).
"""

from __future__ import annotations

import ctypes
import os
import resource

# Variables a reward function may need; everything else (RAY_*, tokens, cloud keys) is dropped.
ENV_ALLOW = ("PATH", "LANG", "LANGUAGE", "TZ", "LD_LIBRARY_PATH", "PYTHONHASHSEED", "SSL_CERT_FILE",
             "SSL_CERT_DIR", "TERM")
# One thread per library: forking a zygote that already runs BLAS/tokenizer thread pools is unsafe,
# and reward functions run many processes side by side anyway.
ENV_DEFAULTS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                "TOKENIZERS_PARALLELISM": "false", "PYTHONDONTWRITEBYTECODE": "1"}

PR_SET_PDEATHSIG = 1
PR_CAPBSET_READ, PR_CAPBSET_DROP = 23, 24
PR_SET_SECUREBITS = 28
# SECBIT_NOROOT, NO_SETUID_FIXUP, KEEP_CAPS_LOCKED, NO_CAP_AMBIENT_RAISE, each with its lock: uid 0
# gains no capabilities on exec, and nothing can undo that.
SECURE_NO_CAPS = sum(1 << b for b in (0, 1, 2, 3, 5, 6, 7))
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CAP_VERSION_3 = 0x20080522

# Landlock (include/uapi/linux/landlock.h); syscall numbers are the same on every arch but alpha.
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_READ = _FS_READ_FILE | _FS_READ_DIR
FS_READ_EXEC = _FS_READ_FILE | _FS_EXECUTE
FS_READ_FILE_ONLY, FS_READ_DIR = _FS_READ_FILE, _FS_READ_DIR
_FS_WRITE_ABI1 = sum(1 << b for b in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12))  # write, remove, make_*
_FS_REFER = 1 << 13  # ABI 2: renames/links across directories
_FS_TRUNCATE = 1 << 14  # ABI 3
_NET_ALL = (1 << 0) | (1 << 1)  # ABI 4: bind and connect TCP
_SCOPE_ALL = (1 << 0) | (1 << 1)  # ABI 6: abstract unix sockets, signals

_libc = None


def _lib():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    return _libc


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def prctl(option: int, value: int) -> None:
    _check(_lib().prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl({option})")


def no_new_privs() -> None:
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ENV_ALLOW or k.startswith("LC_")}
    env.setdefault("PATH", os.defpath)
    env.update(ENV_DEFAULTS)
    env.update(extra or {})
    return env


def address_space_bytes() -> int:
    """Current virtual size of this process (what a forked worker starts with)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def set_rlimits(memory_mb: int | None, file_mb: int | None, max_files: int | None,
                max_processes: int | None) -> None:
    """Limits for this process and its children. `memory_mb` counts on top of the address space
    the worker inherits from the zygote (imports, preloaded models), so it means the same thing
    however much the zygote imported."""
    def cap(kind, value):
        soft, hard = resource.getrlimit(kind)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)  # cannot raise a hard limit; keep the tighter one
        resource.setrlimit(kind, (value, value))

    cap(resource.RLIMIT_CORE, 0)
    if memory_mb is not None:
        cap(resource.RLIMIT_AS, address_space_bytes() + memory_mb * 2**20)
    if file_mb is not None:
        cap(resource.RLIMIT_FSIZE, file_mb * 2**20)
    if max_files is not None:
        cap(resource.RLIMIT_NOFILE, max_files)
    if max_processes is not None:
        cap(resource.RLIMIT_NPROC, max_processes)


def nobody() -> tuple[int, int]:
    try:
        import pwd

        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except (ImportError, KeyError):
        return 65534, 65534


def drop_to(uid: int, gid: int) -> None:
    """Become uid/gid with no supplementary groups and no capabilities at all (bounding and
    ambient sets emptied first, while root may still do so)."""
    os.setgroups([])
    bounding = [c for c in range(_last_cap() + 1) if _lib().prctl(PR_CAPBSET_READ, ctypes.c_ulong(c), 0, 0, 0) == 1]
    for cap in bounding:
        prctl(PR_CAPBSET_DROP, cap)  # needs CAP_SETPCAP: before the uid change
    _check(_lib().prctl(PR_CAP_AMBIENT, ctypes.c_ulong(PR_CAP_AMBIENT_CLEAR_ALL), 0, 0, 0), "ambient caps")
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)  # clears permitted/effective (no PR_SET_KEEPCAPS)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except OSError:
        return 63


def _capset(effective: int, permitted: int, inheritable: int) -> None:
    """Set the low 32 capabilities (all those kept here are below 32); the high ones go."""
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    data[0].effective, data[0].permitted, data[0].inheritable = effective, permitted, inheritable
    _check(_lib().capset(ctypes.byref(header), data), "capset")


def drop_capabilities() -> None:
    """Empty the bounding, ambient, effective, permitted and inheritable sets of this process for
    good: with a non-empty bounding set (needs CAP_SETPCAP), lock securebits first, so that uid 0
    gains nothing on exec either. A non-root uid without CAP_SETPCAP keeps its bounding set (it
    cannot change it; under no_new_privs it cannot use it either)."""
    bounding = [c for c in range(_last_cap() + 1) if _lib().prctl(PR_CAPBSET_READ, ctypes.c_ulong(c), 0, 0, 0) == 1]
    if bounding:
        try:
            prctl(PR_SET_SECUREBITS, SECURE_NO_CAPS)
        except PermissionError:
            # Without CAP_SETPCAP: harmless for a non-root uid under no_new_privs, which gains no
            # capability on exec whatever its bounding set; never acceptable for uid 0.
            if os.geteuid() == 0:
                raise
            bounding = []
        for cap in bounding:
            prctl(PR_CAPBSET_DROP, cap)
    _check(_lib().prctl(PR_CAP_AMBIENT, ctypes.c_ulong(PR_CAP_AMBIENT_CLEAR_ALL), 0, 0, 0), "ambient caps")
    _capset(0, 0, 0)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when Landlock is missing or disabled."""
    try:
        version = _lib().syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0),
                                 ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(int(version), 0)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1  # the kernel struct is packed
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_confine(abi: int, writable_dirs: list[str], writable_files: list[str],
                     readable: list[tuple[str, int]] | None = None) -> list[str]:
    """Restrict this process (and its future children) for good; returns what is restricted.
    Needs no_new_privs() first. Without `readable`, reads and execution stay allowed everywhere;
    with it ((path, FS_READ or FS_READ_EXEC or _FS_READ_FILE) pairs; missing paths are skipped),
    only those paths and the writable ones can be read, listed or executed."""
    fs = _FS_WRITE_ABI1 | (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0)
    if readable is not None:
        fs |= _FS_EXECUTE | FS_READ
    attr = _RulesetAttr(fs, _NET_ALL if abi >= 4 else 0, _SCOPE_ALL if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24  # older kernels reject fields they lack
    lib = _lib()
    ruleset = _check(lib.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
                                 ctypes.c_uint32(0)), "landlock_create_ruleset")
    try:
        file_rights = fs & (_FS_WRITE_FILE | _FS_TRUNCATE | _FS_READ_FILE)
        rules = [*((d, fs & ~_FS_EXECUTE) for d in writable_dirs), *((f, file_rights) for f in writable_files)]
        for path, rights in [*rules, *(readable or ())]:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                if readable is None:
                    raise
                continue
            try:
                rule = _PathBeneath(rights, fd)
                _check(lib.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule),
                                   ctypes.c_uint32(0)), f"landlock_add_rule({path})")
            finally:
                os.close(fd)
        _check(lib.syscall(_SYS_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return landlock_layers(abi)


def landlock_layers(abi: int) -> list[str]:
    """What Landlock restricts at this ABI version."""
    if not abi:
        return []
    return ["fs_write"] + (["tcp"] if abi >= 4 else []) + (["signals", "abstract_sockets"] if abi >= 6 else [])


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid` (all its threads), from /proc."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def proc_state(pid: int) -> str:
    """One-letter scheduler state of `pid` ("R" running/runnable, "S" sleeping, ...), "?" if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split(None, 1)[0].decode()
    except (OSError, IndexError):
        return "?"
