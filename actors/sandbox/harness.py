"""The harness that runs in each test process (`python -I -S -B -c HARNESS`), compiled before the
code it judges. It decides nothing: it runs the row's setup, the response's code and the test's
statements, and reports, for each assert, the plain values of the probes the parent sent (see
actors.sandbox.asserts); the parent evaluates the asserts.

Protocol on the private pipe (fd given in the payload): b"S" once the payload is read, b"C" once
the row's setup ran (the response's code starts), b"T" once the code ran (the test statements
start); then one JSON line per assert, a list with one entry per probe: ["v", tagged value] or
["e", exception class name]; b"F" + a JSON object {"e": class name, "line": n} when a statement
raised; b"E" when every statement ran. Nothing the response does can come before b"C". The
response runs in this process and could write to the pipe itself: it can then only claim values,
which the parent checks against expected values the child never sees.
"""

HARNESS = r'''
def _harness():
    import os, sys, json, builtins
    _read, _write, _exit, _close = os.read, os.write, os._exit, os.close
    _exec, _eval, _compile, _dumps = builtins.exec, builtins.eval, builtins.compile, json.dumps
    _type, _str, _repr, _len, _hex = type, str, repr, len, hex
    _list, _BaseException, _SystemExit, _MemoryError = list, BaseException, SystemExit, MemoryError
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
        for kind, a, line in payload["steps"]:
            if kind == 0:
                steps.append((0, _compile(a, "<test>", "exec"), line))
            else:
                steps.append((1, [_compile(p, "<test>", "eval") for p in a], line))
    except _BaseException as e:
        fail(f"the row's tests do not compile: {_type(e).__name__}: {e}", 2)
    source, entry, audit = payload["code"], payload["entry"], payload["audit"]
    del payload

    # ---- plain values, tagged (exact types only: a subclass or a custom object is not plain) ----
    SCALARS = {int: "i", float: "f", bool: "b", str: "s", bytes: "y", type(None): "n", complex: "c"}
    SEQS = {list: "l", tuple: "t", set: "S", frozenset: "F"}

    class NotPlain(Exception):
        pass

    def tag(v, depth, budget):
        t = _type(v)
        budget[0] -= 1
        if budget[0] < 0 or depth > 20:
            raise NotPlain
        if t is int:
            return ["i", _hex(v)]
        if t is float:
            return ["f", _repr(v)]
        if t is bool or t is str:
            return [SCALARS[t], v]
        if t is bytes:
            return ["y", v.hex()]
        if v is None:
            return ["n"]
        if t is complex:
            return ["c", _repr(v.real), _repr(v.imag)]
        if t in SEQS:
            return [SEQS[t], [tag(x, depth + 1, budget) for x in v]]
        if t is dict:
            return ["d", [[tag(k, depth + 1, budget), tag(x, depth + 1, budget)] for k, x in _dict_items(v)]]
        raise NotPlain

    import types
    _isinstance, _getattr, _Module = isinstance, getattr, types.ModuleType
    CONTAINERS = (list, tuple, set, frozenset, dict)
    # Functions and classes may be arguments (functools.reduce(operator.mul, ...), map(str, ...)):
    # these exact types compare by identity, whatever the response defines.
    CALLABLES = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type)

    def method(r, name, *args, **kw):
        """A probe's `r.name(*args, **kw)`. A builtin container's method or a module's function
        compares with `==`/hash in here, where a custom object decides: so the container's items
        and the arguments must be plain (a custom object's own methods are the response's code,
        like any function it defines)."""
        for base in CONTAINERS:
            if _isinstance(r, base):  # a subclass (Counter, say): its items as the base type
                tag(r if _type(r) is base else base(r), 0, [100000])
                break
        if _isinstance(r, CONTAINERS + (_Module,)):  # str/bytes methods use the raw data
            for a in (*args, *kw.values()):
                if _type(a) not in CALLABLES:
                    tag(a, 0, [100000])
        return _getattr(r, name)(*args, **kw)

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
        if event == "os.listdir" or event == "os.scandir":
            real = resolve(args[0] if args and args[0] is not None else ".")
            if real is None or not (within(real, (here,)) or within(real, roots)):
                raise _PermissionError("code sandbox: listing this directory is not allowed")
            return
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
    _write(rfd, b"C")  # from here on, the response's code runs: only class names go out
    line = 0
    try:
        _exec(_compile(source, "<solution>", "exec"), ns)
        tns = {k: v for k, v in _dict_items(ns) if k not in pristine or k == entry}
        tns["__builtins__"] = pristine
        tns["__coevo_method"] = method
        _write(rfd, b"T")  # the code ran: from here on, failures are the tests'
        for kind, a, line in steps:
            if kind == 0:
                _exec(a, tns)
                continue
            out = []
            for probe in a:
                try:
                    out.append(["v", tag(_eval(probe, tns), 0, [100000])])
                except NotPlain:
                    out.append(["e", "not a plain value"])
                except _MemoryError:
                    raise
                except _SystemExit:
                    raise
                except _BaseException as e:
                    out.append(["e", _type(e).__name__])
            _write(rfd, (_dumps(out) + "\n").encode())
    except _MemoryError:
        ns = tns = None
        fail('{"e": "MemoryError"}', 3)
    except _SystemExit:
        fail(_dumps({"e": "SystemExit", "line": line}))
    except _BaseException as e:
        fail(_dumps({"e": _type(e).__name__, "line": line}))
    _write(rfd, b"E")
    _exit(0)


_harness()
'''
