"""Show an unprivileged uid the interpreter a root user installed where that uid cannot reach it
(a Python under /root, mode 0700), without giving it any capability.

The zygote (root, single-threaded) enters a mount namespace of its own (the pool and the rest of
the machine see nothing), makes every mount private, and for each needed path below a directory
that `uid` cannot traverse: binds the path aside, mounts a small tmpfs (mode 0755) over the
top-most such directory, recreates the path's chain in it and binds the path back. Everything
else in that directory (root's other files, keys, caches) is hidden from the zygote and its
workers. Needs CAP_SYS_ADMIN (root, outside containers that forbid mount namespaces).
"""

from __future__ import annotations

import ctypes
import os
import stat

CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 4096, 16384, 1 << 18
MNT_DETACH = 2


def _libc():
    lib = ctypes.CDLL(None, use_errno=True)
    lib.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return lib


def _call(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def traversable(path: str, uid: int, gid: int) -> bool:
    """Whether `uid` (group `gid`, no supplementary groups) may search directory `path`."""
    st = os.stat(path)
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def hidden_root(path: str, uid: int, gid: int) -> str | None:
    """The top-most ancestor of `path` that `uid` cannot traverse, or None."""
    parts = os.path.realpath(path).split("/")[1:]
    for n in range(1, len(parts)):
        d = "/" + "/".join(parts[:n])
        if not traversable(d, uid, gid):
            return d
    return None


def expose(paths: list[str], uid: int, gid: int, stage: str) -> list[str]:
    """Make `paths` reachable by uid/gid in a new mount namespace of this process (see the module
    docstring); returns the paths exposed ([] and no namespace when none needed it). `stage`: an
    empty directory root may use for a moment."""
    wanted: dict[str, list[str]] = {}
    for p in dict.fromkeys(os.path.realpath(p) for p in paths if p and os.path.exists(p)):
        top = hidden_root(p, uid, gid)
        if top is not None:
            wanted.setdefault(top, []).append(p)
    if not wanted:
        return []
    lib = _libc()
    _call(lib.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _call(lib.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    done = []
    for top, found in wanted.items():
        # the outermost paths only: a bind of /a brings /a/b along
        keep = [p for p in sorted(found) if not any(p != q and p.startswith(q + "/") for q in found)]
        staged = []
        for k, p in enumerate(keep):
            aside = os.path.join(stage, f"m{len(done) + k}")
            os.mkdir(aside, 0o700) if os.path.isdir(p) else open(aside, "x").close()
            _call(lib.mount(p.encode(), aside.encode(), None, MS_BIND | MS_REC, None), f"bind {p}")
            staged.append((p, aside))
        _call(lib.mount(b"tmpfs", top.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755,size=64k"),
              f"tmpfs on {top}")
        for p, aside in staged:
            if os.path.isdir(aside):
                os.makedirs(p, 0o755, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(p), 0o755, exist_ok=True)
                open(p, "x").close()
            _call(lib.mount(aside.encode(), p.encode(), None, MS_BIND | MS_REC, None), f"bind back {p}")
            _call(lib.umount2(aside.encode(), MNT_DETACH), f"umount {aside}")
            os.rmdir(aside) if os.path.isdir(aside) else os.remove(aside)
            done.append(p)
    return done
