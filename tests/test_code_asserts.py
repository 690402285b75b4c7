"""code_tests' parent-side verdict (actors/sandbox/asserts.py, run.py): which test forms
are accepted and how they split, the evaluator over plain values, strict decoding, sanitised
reasons; and the start-up refusal when an isolation layer is missing."""

from __future__ import annotations

import ast
import os
import sys

import pytest

from actors.sandbox import child as code_child
from actors.rewards.code import code_tests, reward_check
from actors.sandbox.asserts import (NotPlain, decode, evaluate, exception_name, plan_test,
                                         setup_constants)
from actors.sandbox.run import _check
from actors.sandbox import RewardPool


def split(test: str, child=frozenset(), known=frozenset(), constants=None):
    steps, checks = plan_test(test, 0, set(child), set(known), constants)
    return steps, [ast.unparse(c[0]) for c in checks]


def test_asserts_split_into_parent_side_checks_and_probes():
    assert split("assert add(1, 2) == 3, 'msg'") == ([[1, ["add(1, 2)"], 1]], ["<p0> == 3"])
    assert split("assert abs(add(.1, .2) - .3) < 1e-9")[1] == ["abs(<p0> - 0.3) < 1e-09"]
    assert split("for x in range(2):\n    assert f(x) in (x,)") == (
        [[1, ["f(0)"], 2], [1, ["f(1)"], 2]], ["<p0> in (0,)", "<p0> in (1,)"])
    assert split("def test_f():\n    y = f()\n    assert y\ntest_f()") == ([[0, "y = f()", 2], [1, ["y"], 3]], ["<p0>"])
    # math imported by the setup is the parent's; a name the setup binds is the child's
    assert split("assert isclose(f(), .3)", known={"isclose"})[1] == ["isclose(<p0>, 0.3)"]
    assert split("assert abs(f()) == 1", child={"abs"}) == ([[1, ["abs(f())"], 1]], ["<p0> == 1"])


def test_values_the_test_names_once_stay_with_the_parent():
    # the parent keeps `expected`: only add(1, 2) is the child's to report
    assert split("expected = 3\nassert add(1, 2) == expected") == (
        [[0, "expected = 3", 1], [1, ["add(1, 2)"], 2]], ["<p0> == 3"])
    assert split("cases = [(1, 3)]\nfor a, b in cases:\n    assert f(a) == b")[1] == ["<p0> == 3"]
    # bound twice, handed to the child's code, or not the parent's to compute: the child's value
    assert split("e = 3\ne = f(e)\nassert g() == e")[1] == ["<p0> == <p1>"]
    assert split("xs = [3, 1]\nsort(xs)\nassert xs == [1, 3]")[1] == ["<p0> == [1, 3]"]
    assert split("xs = [3, 1]\nassert f(xs) == xs")[1] == ["<p0> == <p1>"]
    assert split("t = (3, 1)\nassert f(t) == t")[1] == ["<p0> == (3, 1)"]  # immutable: safe
    assert split("e = f()\nassert g() == e")[1] == ["<p0> == <p1>"]


def test_the_setups_constants_stay_with_the_parent():
    setup = ast.parse("import math\nE = 3\nL = [1, 2]\nT = (E, 4)\nN = 0\nN = 1\nR = f()\n"
                      "def g():\n    L.append(1)\nM = [5]")
    assert setup_constants(setup, {"math"}) == {"E": 3, "T": (3, 4), "M": [5]}  # L: g mutates it
    consts = {"E": 3, "M": [5]}
    assert split("assert add(1, 2) == E", child={"E", "M"}, constants=consts)[1] == ["<p0> == 3"]
    assert split("E = f()\nassert add(1, 2) == E", child={"E"}, constants=consts)[1] == ["<p0> == <p1>"]
    assert split("g(M)\nassert add(1, 2) == M", child={"E", "M"}, constants=consts)[1] == ["<p0> == <p1>"]


def test_a_report_must_hold_one_entry_per_probe():
    expr = ast.Compare(ast.Name("<p0>", ast.Load()), [ast.Eq()], [ast.Constant(3)])
    assert _check(b'[["v", ["i", "0x3"]]]', expr, {}) is None
    assert _check(b'[["v", ["i", "0x3"]], ["v", ["i", "0x3"]]]', expr, {}) == "malformed report"


def test_sets_and_dicts_of_colliding_hashes_are_refused():
    """k * (2**61 - 1) all hash to 0: a set of 30,000 of them costs the parent tens of seconds."""
    m = (1 << 61) - 1
    with pytest.raises(NotPlain):
        decode(["S", [["i", hex(m * k)] for k in range(1, 30_000)]])
    with pytest.raises(NotPlain):
        decode(["d", [[["i", hex(m * k)], ["n"]] for k in range(1, 30_000)]])
    with pytest.raises(OverflowError, match="share a hash"):
        evaluate(ast.parse("set(p) == {0}", mode="eval").body, {"p": [m * k for k in range(30_000)]})
    assert decode(["S", [["i", hex(k)] for k in range(30_000)]]) == set(range(30_000))


@pytest.mark.parametrize("test, fragment", [
    ("if True:\n    assert f() == 1", "tests[3] line 1: an assert inside if is not supported"),
    ("try:\n    assert f()\nexcept Exception:\n    pass", "an assert inside try"),
    ("x = f()", "tests[3] has no assert"),
    ("assert all(f(x) == 1 for x in g())", "a comparison inside an expression only the test process"),
    ("for x in f():\n    assert x", "a for loop over something only the test process can compute"),
    ("def test_f(a):\n    assert a", "test function test_f() with parameters"),
    # a copy passed `is not xs` and a wrong `[]` too: the parent judges identity of singletons only
    ("xs = [1]\nassert f(xs) is not xs", "tests[3] line 2: `is` between values"),
    # an always-equal object made `ok` True in the test process
    ("ok = add(1, 2) == 3\nassert ok", "tests[3] line 1: a comparison outside an assert"),
    ("if add(1, 2) == 3:\n    ok = 1\nassert ok", "a comparison outside an assert"),
    ("for x in range(5000):\n    assert f(x)", "more than 1000"),
    ("for g in [abs, len]:\n    assert g(f())", "tests[3] line 1: the loop runs over builtin_function_or_method values"),
])
def test_unsupported_forms_are_bad_rows_naming_test_line_and_forms(test, fragment):
    with pytest.raises(ValueError, match="supported forms|more than") as e:
        plan_test(test, 3, set())
    assert fragment in str(e.value)


def test_the_evaluator_refuses_what_could_hang_the_parent():
    with pytest.raises(OverflowError):
        evaluate(ast.parse("p ** 10 ** 9 == 1", mode="eval").body, {"p": 7})  # p: a probe's value
    with pytest.raises(OverflowError):
        evaluate(ast.parse("'x' * 10 ** 12", mode="eval").body, {})
    with pytest.raises(OverflowError):
        evaluate(ast.parse("sum(list(range(0, p))) == 1", mode="eval").body, {"p": 10 ** 18})
    with pytest.raises(OverflowError):  # 45,000 probe-made 32-bit factors: 11 s of the parent's CPU
        evaluate(ast.parse("math.prod(p) == 1", mode="eval").body, {"p": [2 ** 32 - 1] * 45_000})
    with pytest.raises(OverflowError):
        evaluate(ast.parse("round(5, p) == 0", mode="eval").body, {"p": -10 ** 7})
    assert evaluate(ast.parse("math.prod(p)", mode="eval").body, {"p": [2, 3]}) == 6
    with pytest.raises(TypeError, match="identity"):  # two reported values are copies
        evaluate(ast.parse("p is q", mode="eval").body, {"p": [1], "q": [1]})
    assert evaluate(ast.parse("p is None or type(q) is list", mode="eval").body, {"p": 1, "q": [1]})


def test_decoding_is_strict():
    assert decode(["t", [["i", "-0x5"], ["f", "nan"], ["y", "ff"], ["F", [["b", True]]]]])[2:] == (b"\xff", frozenset({True}))
    for bad in (["i", 5], ["x"], ["l", [["s", 1]]], ["d", [[["l", []], ["n"]]]], ["b", 1], "s"):
        with pytest.raises(NotPlain):
            decode(bad)
    deep = ["n"]
    for _ in range(30):
        deep = ["l", [deep]]
    with pytest.raises(NotPlain):
        decode(deep)


def test_exception_names_from_the_child_are_builtin_ones_only():
    assert exception_name("ZeroDivisionError") == "ZeroDivisionError"
    assert exception_name("s3cr3t_data_in_a_class_name") == "an exception of its own class"
    assert exception_name("not an identifier!") == "an exception of its own class"


def test_reasons_never_carry_the_childs_output_or_messages():
    leaky = ("import sys\nprint('OUTPUT-LEAK')\nclass Leak_SECRET(Exception):\n    pass\n"
             "def add(a, b):\n    raise Leak_SECRET('MESSAGE-LEAK')\n")
    out = code_tests("p", leaky, tests=["assert add(1, 2) == 3", "assert add(1, 1) == 2, 'x'"])
    assert out == 0.0
    assert out.reason == ("0/2 tests passed; test 1: an exception of its own class at line 1; "
                          "test 2: an exception of its own class at line 1")
    wrong = code_tests("p", "def add(a, b):\n    return 'VALUE-LEAK'", tests=["assert add(1, 2) == 3"])
    assert wrong.reason == "0/1 tests passed; test 1: AssertionError at line 1"
    raising = code_tests("p", "def add(a, b):\n    raise ValueError('MESSAGE-LEAK')", tests=["assert add(1, 2) == 3"])
    assert raising.reason == "0/1 tests passed; test 1: ValueError at line 1"


def test_a_probe_that_raised_fails_only_when_its_value_is_needed():
    code = "def f(x):\n    return 1 / x\n"
    out = code_tests("p", code, tests=["assert f(1) == 1 or f(0) == 1", "assert f(0) == 1 or True"])
    assert out == 0.5 and out.reason == "1/2 tests passed; test 2: ZeroDivisionError at line 1"


def test_the_start_up_check_refuses_a_missing_layer_unless_allowed(monkeypatch, capsys):
    seen = {"landlock_abi": 3, "seccomp": True, "holds": ["capabilities", "landlock_fs", "seccomp"],
            "missing": {"landlock_tcp": "Landlock ABI 3 < 4", "landlock_signals": "Landlock ABI 3 < 6"}}
    monkeypatch.delenv(code_child.ALLOW_ENV, raising=False)
    with pytest.raises(RuntimeError, match=r"landlock_signals \(Landlock ABI 3 < 6\); landlock_tcp") as e:
        reward_check({"uid": 65534}, seen)
    assert f"{code_child.ALLOW_ENV}=landlock_signals,landlock_tcp" in str(e.value)
    monkeypatch.setenv(code_child.ALLOW_ENV, "landlock")
    try:
        assert reward_check({"uid": 65534}, seen) == seen
        assert "WARNING: code_tests runs WITHOUT" in capsys.readouterr().err
    finally:
        from actors.rewards import code

        code._KERNEL.pop(sys.executable, None)  # the real layers are checked again on next use
    with pytest.raises(ValueError, match="allow_missing_layers: unknown layer 'landlok'"):
        code_child.allowed_missing(["landlok"])


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid layer only matters for a pool started as root")
def test_a_root_pool_that_keeps_root_refuses_to_start_unless_allowed():
    pool = RewardPool({"code": "code_tests"}, workers=1, drop_privileges=False)
    try:
        with pytest.raises(RuntimeError, match="refuses to start without these isolation layers: uid"):
            pool.start()
    finally:
        pool.close()
    pool = RewardPool({"code": "code_tests"}, workers=1, drop_privileges=False,
                      env={code_child.ALLOW_ENV: "uid"})
    try:
        pool.start()
        assert list(pool.isolation["checks"]["code"]["missing"]) == ["uid"]
        item = ("code", {"prompt": "p", "response": "def add(a, b): return a + b", "tests": ["assert add(1, 2) == 3"]})
        assert pool.score([item], {"code": 10.0}) == [(1.0, None)]
    finally:
        pool.close()


def test_the_test_process_has_every_kernel_layer_here(tmp_path):
    found = code_child.check(sys.executable, str(tmp_path))
    if found["landlock_abi"] < 6:
        pytest.skip(f"Landlock ABI {found['landlock_abi']} here")
    assert found["missing"] == {} and set(found["holds"]) == set(code_child.LAYERS)


def test_the_verifier_hands_allow_missing_layers_to_its_pool():
    from actors.verifier import Verifier
    from orchestrator.config import validate_config

    def verifier(layers):
        return Verifier(validate_config({"rewards": [
            {"name": "tests", "fn": "code_tests", "args": {"allow_missing_layers": layers}}]}))

    v = verifier(["landlock", "uid"])
    try:
        assert v.sandbox.env == {code_child.ALLOW_ENV: "landlock_fs,landlock_signals,landlock_tcp,uid"}
    finally:
        v.close()
    with pytest.raises(ValueError, match="allow_missing_layers: unknown layer 'seccom'"):
        verifier(["seccom"])


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another uid")
def test_an_unprivileged_uid_keeps_every_layer(tmp_path):
    """A non-root uid cannot empty its bounding set (no CAP_SETPCAP); under no_new_privs it gains
    nothing from it, so the layer holds. Run as nobody, with the interpreter shown to it as the
    pool's zygote does."""
    import json
    import shutil
    import tempfile

    from actors.sandbox import mountns
    from actors.sandbox.worker import _collect

    scratch = tempfile.mkdtemp(prefix="coevo-uid-")  # /tmp itself: nobody reaches it
    os.chmod(scratch, 0o777)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        out = {}
        try:
            os.close(r)
            stage = tmp_path / "stage"
            stage.mkdir()
            mountns.expose([sys.executable, sys.prefix, sys.base_prefix, *sys.path], 65534, 65534, str(stage))
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)  # the bounding set stays full
            found = code_child.check(sys.executable, scratch)
            out = {"holds": found["holds"], "missing": found["missing"]}
        except BaseException as e:
            out = {"error": f"{type(e).__name__}: {e}"}
        finally:
            os.write(w, json.dumps(out).encode())
            os._exit(0)
    data = _collect(pid, r, w)
    shutil.rmtree(scratch)
    out = json.loads(data)
    assert out.get("missing") == {} and "capabilities" in out["holds"], out
