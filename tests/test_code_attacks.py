"""Adversarial corpus for code_tests, through the path training uses (RewardPool -> worker ->
code_tests): each case is a wrong solution (`add` subtracts) that would turn right only if its
attack worked, so reward 0 shows the attack failed. Every case runs twice: with the in-child audit
hook, and without it (COEVO_CODE_TESTS_NO_AUDIT_HOOK=1) to show the kernel layers stop it alone.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import textwrap
from pathlib import Path

import pytest

from actors.sandbox import RewardPool

ROOT = Path(__file__).resolve().parents[1]
DATASET = ROOT / "pipelines" / "examples" / "code_tasks.jsonl"
TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]
SECRET = "s3cr3t-value-9f2"
TIMEOUTS = {"code": 20.0}


def attack(body: str) -> str:
    """The attack runs first; when it raises, the reason names the exception class (and only
    that); when it works, `add` is right and the sample would score."""
    return textwrap.dedent(body) + "\nOK = True\ndef add(a, b):\n    return a + b if OK else a - b\n"


@pytest.fixture(scope="module")
def secrets_dir():
    """Files outside the sandbox: one world-readable in a world-traversable directory (only
    Landlock keeps a test process from it), one root-only."""
    d = tempfile.mkdtemp(prefix="coevo-attack-")
    os.chmod(d, 0o755)
    for name, mode in (("open.txt", 0o644), ("root_only.txt", 0o600)):
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write(SECRET)
        os.chmod(path, mode)
    # A listening unix socket outside the sandbox, as Ray's raylet has under /tmp/ray (connect()
    # to a path is no file access Landlock checks: only seccomp's refusal of socket() stops it).
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(os.path.join(d, "raylet"))
    os.chmod(os.path.join(d, "raylet"), 0o777)
    listener.listen(8)
    yield d
    listener.close()
    shutil.rmtree(d)


# Loads a blocked extension module under a name the block list does not know.
LOAD_AS = """
import importlib.util, os, sys
def load_as(module, alias):
    so = [p for p in sys.path if p.endswith("lib-dynload")][0]
    path = [os.path.join(so, n) for n in os.listdir(so) if n.startswith(module + ".")][0]
    spec = importlib.util.spec_from_file_location(alias, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
"""


def corpus(d: str) -> list[tuple[str, str, list[str], tuple[str, ...]]]:
    """(name, code, tests, accepted reason fragments)."""
    public, private = f"{d}/open.txt", f"{d}/root_only.txt"
    up = "../" * 30
    denied = ("PermissionError",)
    return [
        ("relative symlink", attack(f"""
            import os
            os.symlink({up + public.lstrip('/')!r}, "link")
            assert {SECRET!r} in open("link").read()"""), TESTS, denied),
        ("absolute symlink", attack(f"""
            import os
            os.symlink({public!r}, "link")
            assert {SECRET!r} in open("link").read()"""), TESTS, denied),
        ("symlink to /proc/self/mem", attack(f"""
            import os
            os.symlink({up + 'proc/self/mem'!r}, "mem")
            open("mem", "rb").close()"""), TESTS, denied),
        ("/proc/self/mem", attack("open('/proc/self/mem', 'rb').close()"), TESTS, denied),
        ("/proc/self/environ", attack("open('/proc/self/environ', 'rb').read()"), TESTS, denied),
        ("the parent's /proc", attack("""
            import os
            open(f"/proc/{os.getppid()}/environ", "rb").read()
            open(f"/proc/{os.getppid()}/mem", "rb").close()"""), TESTS, denied),
        ("read a world-readable file outside", attack(f"open({public!r}).read()"), TESTS, denied),
        ("read a root-only file", attack(f"open({private!r}).read()"), TESTS, denied),
        ("read /etc", attack("open('/etc/passwd').read()"), TESTS, denied),
        ("read the dataset", attack(f"open({str(DATASET)!r}).read()"), TESTS, denied),
        ("list /", attack("import os\nos.listdir('/')"), TESTS, denied),
        ("list the dataset dir", attack(f"import os\nlist(os.scandir({str(DATASET.parent)!r}))"), TESTS, denied),
        ("list the secrets dir", attack(f"import os\nos.listdir({d!r})"), TESTS, denied),
        ("dir_fd from an O_PATH fd on /", attack("""
            import os
            root = os.open("/", os.O_PATH)
            os.read(os.open("etc/passwd", os.O_RDONLY, dir_fd=root), 100)"""), TESTS, denied),
        ("openat on the secrets dir", attack(f"""
            import os
            fd = os.open({d!r}, os.O_PATH)
            os.read(os.open("open.txt", os.O_RDONLY, dir_fd=fd), 100)"""), TESTS, denied),
        ("capability: chown", attack("""
            import os
            open("f", "w").close()
            os.chown("f", 0, 0)
            os.chown("f", 1, 1)"""), TESTS, denied),
        ("capability: setuid", attack("import os\nos.setuid(0)\nos.setuid(1)"), TESTS, denied),
        ("capability: capget says none", attack("""
            import importlib.machinery, importlib.util, sys, _imp, os
            import ctypes
            class H(ctypes.Structure):
                _fields_ = [("v", ctypes.c_uint32), ("pid", ctypes.c_int)]
            data = (ctypes.c_uint32 * 6)()
            libc = ctypes.CDLL(None, use_errno=True)
            assert libc.capget(ctypes.byref(H(0x20080522, 0)), data) == 0
            if not any(data):
                raise PermissionError("no capabilities")"""), TESTS, ("PermissionError", "ImportError")),
        ("ctypes under another name", attack(LOAD_AS + textwrap.dedent("""
            import importlib.util, sys, os
            sys.modules["_ctypes"] = load_as("_ctypes", "evil._ctypes")
            pkg = [os.path.join(p, "ctypes", "__init__.py") for p in sys.path if os.path.isdir(os.path.join(p, "ctypes"))][0]
            spec = importlib.util.spec_from_file_location("evil_ctypes", pkg, submodule_search_locations=[])
            ct = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(ct)
            libc = ct.CDLL(None, use_errno=True)
            fd = libc.open(b"/etc/passwd", 0)
            if fd < 0:
                raise OSError(ct.get_errno(), "open")""")), TESTS, ("PermissionError", "ImportError")),
        ("_posixsubprocess under another name", attack(LOAD_AS + textwrap.dedent("""
            import os
            load_as("_posixsubprocess", "x._posixsubprocess")
            os.fork()""")), TESTS, ("PermissionError", "BlockingIOError", "ImportError")),
        ("connect to a unix socket outside", attack(f"""
            import socket
            s = socket.socket(socket.AF_UNIX)
            s.connect({d + '/raylet'!r})"""), TESTS, denied),
        ("unshare a user namespace", attack("""
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER: every capability inside it
                raise OSError(ctypes.get_errno(), "unshare")"""), TESTS, ("PermissionError", "ImportError")),
        ("signal the worker", attack("import os\nos.kill(os.getppid(), 9)"), TESTS, denied),
    ]


ALWAYS = textwrap.dedent("""
    class E(int):
        def __eq__(self, o): return True
        def __ne__(self, o): return False
        def __lt__(self, o): return True
        def __le__(self, o): return True
        def __gt__(self, o): return True
        def __ge__(self, o): return True
        def __bool__(self): return True
        def __contains__(self, o): return True
        def __abs__(self): return self
        def __sub__(self, o): return self
        def __rsub__(self, o): return self
        def __float__(self): return 0.3
        def __index__(self): return 3
        def __hash__(self): return 3
        def __len__(self): return 1
        def __iter__(self): return iter([3])
    def add(a, b):
        return E(a - b)
    """)
EVERY_FORM = [
    "assert add(1, 2) == 3",
    'assert add(1, 2) == 3, "message"',
    "assert add(2, 2) in (4,)",
    "assert abs(add(0.1, 0.2) - 0.3) < 1e-9",
    "assert add(1, 2)",
    "assert not add(1, 2) != 3",
    "assert add(1, 2) >= 3 and add(1, 2) <= 3",
    "import math\nassert math.isclose(add(0.1, 0.2), 0.3)",
    "assert isinstance(add(1, 2), int) and add(1, 2) == 3",
    "assert sorted(add(1, 2)) == [3]",
    "assert type(add(1, 2)) is int",
    "assert len(add(1, 2)) == 1 and add(1, 2) == 3",
    "def test_add():\n    assert add(1, 2) == 3",
    "for x in [1, 2, 3]:\n    assert add(x, 0) == x",
    "y = add(1, 2)\nassert y == 3",
]


@pytest.fixture(scope="module", params=["audit hook on", "audit hook off"])
def pool(request):
    env = {"COEVO_CODE_TESTS_NO_AUDIT_HOOK": "1"} if request.param.endswith("off") else {}
    p = RewardPool({"code": "code_tests"}, workers=2, env=env)
    p.start()
    yield p
    p.close()


def item(code, tests):
    return ("code", {"prompt": "Write add(a, b).", "response": code, "tests": tests, "test_timeout_s": 3.0,
                     "time_limit_s": 8.0})


def test_every_attack_scores_zero_with_a_reason(pool, secrets_dir):
    assert not pool.isolation["checks"]["code"]["missing"]  # every kernel layer holds on this machine
    cases = corpus(secrets_dir)
    out = pool.score([item(code, tests) for _, code, tests, _ in cases], TIMEOUTS)
    for (name, _, _, reasons), (value, error) in zip(cases, out):
        assert error is None, (name, error)
        assert value == 0.0, (name, value.reason)
        assert any(f"test 1: {r} in the code" in value.reason for r in reasons), (name, value.reason)
        assert SECRET not in value.reason and "root:" not in value.reason
    # the same attacks, attack lines removed, score: the corpus would see an escape
    assert pool.score([item(attack("OK = True"), TESTS)], TIMEOUTS)[0][0] == 1.0


def test_always_equal_objects_fail_every_assert_form(pool):
    value, error = pool.score([item(ALWAYS, EVERY_FORM)], TIMEOUTS)[0]
    assert error is None and value == 0.0, value.reason
    assert value.details["passed"] == [0] * len(EVERY_FORM)
    assert "a value is not a plain value at line" in value.reason
    good = "def add(a, b):\n    return a + b\n"
    plain_forms = [f for i, f in enumerate(EVERY_FORM) if "sorted" not in f and "len" not in f]
    assert pool.score([item(good, plain_forms)], TIMEOUTS)[0][0] == 1.0


# Comparisons made inside a builtin method or a module function in the test process, where an
# always-equal element or argument decides: each scored 1.0.
EQUAL_INSIDE = textwrap.dedent("""
    class E:
        def __eq__(self, o): return True
        def __hash__(self): return hash(3)
    def add(a, b):
        return E()
    def adds(a, b):
        return [E()]
    """)
METHOD_FORMS = [
    "assert adds(1, 2).count(3) == 1",
    "assert adds(1, 2).index(3) == 0",
    "assert {3: 'x'}.get(add(1, 2)) == 'x'",
    "assert [3, 4].index(add(1, 2)) == 0",
    "import operator\nassert operator.eq(add(1, 2), 3)",
    "n = adds(1, 2).count(3)\nassert n == 1",
]


def test_comparisons_inside_methods_see_plain_values_only(pool):
    value, error = pool.score([item(EQUAL_INSIDE, METHOD_FORMS)], TIMEOUTS)[0]
    assert error is None and value.details["passed"] == [0] * len(METHOD_FORMS), value.reason
    assert value.reason.count("a value is not a plain value") == len(METHOD_FORMS) - 1
    assert "test 6: an exception of its own class at line 1" in value.reason  # in a statement
    good = "from collections import Counter\ndef add(a, b):\n    return a + b\n" \
           "def adds(a, b):\n    return Counter([a + b])\n"
    forms = METHOD_FORMS[2:5] + [
        "assert adds(1, 2).get(3) == 1", "n = [add(1, 2)].count(3)\nassert n == 1",
        "assert ' x '.strip() + str(add(1, 2)) == 'x3'",
        "import functools, operator\nassert functools.reduce(operator.add, [add(1, 2), 1]) == 4"]
    assert pool.score([item(good, forms)], TIMEOUTS)[0][0] == 1.0


def test_forged_reports_only_claim_values(pool):
    """A response that writes the harness's report itself (every fd) cannot pass without the
    right values: the parent compares them, and nothing it writes reaches the reason."""
    forge = textwrap.dedent("""
        import os
        for fd in range(3, 64):
            try:
                os.write(fd, b'T[["v", ["b", true]]]\\n[["v", ["s", "LEAK"]]]\\nE')
            except OSError:
                pass
        os._exit(0)
        """)
    value, error = pool.score([item(forge, TESTS)], TIMEOUTS)[0]
    assert error is None and value == 0.0 and "LEAK" not in value.reason, value.reason


def test_rebinding_the_setups_expected_values_does_not_pass(pool):
    """The response runs in the setup's namespace: rebinding the setup's `expected` made both
    sides of the comparison its own (reward 1.0, no forging, audit hook on)."""
    setup = "expected = 3\nWANT = [2]\nCASES = [(1, 1, 2), (2, 3, 5)]"
    tests = ["assert add(1, 2) == expected", "assert [add(1, 1)] == WANT",
             "for a, b, c in CASES:\n    assert add(a, b) == c"]
    rebind = "expected = -1\nWANT = [0]\nCASES = [(1, 1, 0)]\ndef add(a, b):\n    return a - b\n"
    good = "def add(a, b):\n    return a + b\n"
    out = pool.score([(k, {**v, "setup": setup}) for k, v in (item(rebind, tests), item(good, tests))], TIMEOUTS)
    assert out[0][1] is None and out[0][0] == 0.0, out[0][0].reason
    assert out[1][0] == 1.0


def forger(report: bytes) -> str:
    return textwrap.dedent(f"""
        import os, stat
        for fd in range(3, 64):
            try:
                if fd != 1 and stat.S_ISFIFO(os.fstat(fd).st_mode):
                    os.write(fd, {report!r})
            except OSError:
                pass
        os._exit(0)
        """)


# Expected values the test names: were probes the child reported, so a forger claiming the same
# value for every probe passed (7 == 7).
NAMED_EXPECTED = [
    "expected = 3\nassert add(1, 2) == expected",
    "def test_add():\n    want: int = 4\n    assert add(2, 2) == want\ntest_add()",
    "expected = [3]\nassert [add(1, 2)] == expected",
]


def test_a_forger_cannot_claim_the_expected_values_a_test_names(pool):
    same = b'T[["v", ["i", "7"]], ["v", ["i", "7"]]]\nE'
    listed = b'T[["v", ["i", "7"]], ["v", ["l", [["i", "7"]]]]]\nE'
    out = pool.score([item(forger(same), NAMED_EXPECTED[:1]), item(forger(same), NAMED_EXPECTED[1:2]),
                      item(forger(listed), NAMED_EXPECTED[2:])], TIMEOUTS)
    for (value, error), test in zip(out, NAMED_EXPECTED):
        assert error is None and value == 0.0, (test, value.reason)
    good = "def add(a, b):\n    return a + b\n"
    assert pool.score([item(good, NAMED_EXPECTED)], TIMEOUTS)[0][0] == 1.0
