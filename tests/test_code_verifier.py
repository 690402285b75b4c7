"""The code-execution verifier (actors/rewards/code.py): modes, the hostile corpus, VeRPO weights
and their checkpointed state, bad input, and the reward pool's {"value", "reason", "details"}
protocol it relies on.

Hostile code goes through the real RewardPool, as the Verifier runs it; time limits are short
(1 s per test) and timing bounds loose, because CI machines are shared.
"""

from __future__ import annotations

import json
import os
import socket
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from actors import batch as B
from actors.sandbox import child as code_child
from actors.rewards.code import code_tests, extract_code, verpo_reward, verpo_rewards, verpo_weights
from actors.sandbox import RewardPool, Scored
from actors.verifier import Verifier
from orchestrator.config import validate_config

ROOT = Path(__file__).resolve().parents[1]
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(-1, -1) == -2"]
GOOD = "```python\ndef add(a, b):\n    return a + b\n```"
FAST = {"test_timeout_s": 1.0, "cpu_time_s": 1, "time_limit_s": 3.0}
# Cases that must end by a limit other than time: wall time to spare, so a loaded machine does not
# make them "timed out" (the memory bomb did, at load 17 on 2 cores); still under the pool's 10 s.
NOT_BY_TIME = {"memory bomb": {"test_timeout_s": 8.0, "time_limit_s": 9.0}}
TIMEOUTS = {"code": 10.0}


@pytest.fixture(scope="module")
def pool():
    p = RewardPool({"code": "code_tests"}, workers=2)
    p.start()
    yield p
    p.close()


def item(response, tests=ADD_TESTS, **kw):
    return ("code", {"prompt": "Write add(a, b).", "response": response, "tests": tests, **kw})


def batch_seconds(pool, n=32) -> float:
    """Score a normal batch (n samples x 3 tests, half right, half wrong); all must score right."""
    items = [item(GOOD if i % 2 else "def add(a, b): return a * b") for i in range(n)]
    start = time.perf_counter()
    out = pool.score(items, TIMEOUTS)
    elapsed = time.perf_counter() - start
    assert [v for v, _ in out] == [1.0 if i % 2 else 1 / 3 for i in range(n)]  # 0*0 == 0 passes
    return elapsed


# ---- modes and extraction ----------------------------------------------------------------------------
def test_modes_on_correct_partial_and_wrong_solutions(pool):
    responses = [GOOD, "def add(a, b):\n    return abs(a + b)", "def add(a, b): return a - b - 1",
                 "Here you go:\n```python\ndef add(a, b): return a + b\n```\nDone."]
    items = [item(r, mode=m) for m in ("pass_fraction", "all_pass") for r in responses]
    out = pool.score(items, TIMEOUTS)
    assert [v for v, _ in out] == [1.0, 2 / 3, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    assert all(e is None and isinstance(v, Scored) for v, e in out)
    assert out[0][0].reason is None and out[0][0].details == {"passed": [1, 1, 1]}
    partial = out[1][0]
    assert partial.details == {"passed": [1, 1, 0]}
    assert partial.reason == "2/3 tests passed; test 3: AssertionError at line 1"
    assert out[2][0].reason.startswith("0/3 tests passed; test 1: AssertionError at line 1")


def test_extraction_modes():
    text = "intro\n```py\nx = 1\n```\nmore\n```python\ndef f(): return 2\n```\n```json\n{}\n```"
    assert extract_code(text) == "def f(): return 2\n"  # the last python fence
    assert extract_code("no fence here", "auto") == "no fence here"
    assert extract_code("no fence here", "fence") is None
    assert extract_code("```python\ndef f(): return 1", "fence") == "def f(): return 1"  # left open
    assert extract_code("x + 1", "completion", prompt="def f(x): return ") == "def f(x): return x + 1"
    assert extract_code(text, "response") == text
    out = code_tests("p", "no code at all", tests=ADD_TESTS, extract="fence")
    assert out == 0.0 and "no ```python code block" in out.reason


def test_completion_mode_on_the_generated_dataset():
    import importlib.util

    path = ROOT / "benchmarks" / "make_code_task.py"
    spec = importlib.util.spec_from_file_location("make_code_task", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.rows
    data = rows()
    assert 100 <= len(data) <= 300 and len({r["id"] for r in data}) == len(data)
    assert data == rows()  # deterministic
    row = next(r for r in data if r["entry"] == "add_3")
    good = code_tests(row["prompt"], row["answer"], tests=row["tests"], entry=row["entry"],
                      extract="completion")
    wrong = code_tests(row["prompt"], "x + 4", tests=row["tests"], entry=row["entry"], extract="completion")
    assert good == 1.0 and wrong == 0.0 and isinstance(good, float)
    # a JSON string of tests works the same; a response that never defines `entry` costs nothing
    assert code_tests("p", "def add(a, b): return a + b", tests=json.dumps(ADD_TESTS)) == 1.0
    other = code_tests("p", "def plus(a, b): return a + b", tests=ADD_TESTS, entry="add")
    assert (other, other.reason) == (0.0, "the code does not define 'add'")
    assert other.details == {"passed": [0, 0, 0]}
    with open(ROOT / "pipelines" / "examples" / "code_tasks.jsonl") as f:
        assert [json.loads(line) for line in f] == data  # the committed file is the generated one


# ---- the hostile corpus ------------------------------------------------------------------------------
def hostile_corpus(port: int, outside: str) -> list[tuple[str, str, list[str] | None, tuple[str, ...]]]:
    """(name, code, tests or None for ADD_TESTS, accepted reason fragments)."""
    def add_ok(body: str) -> str:
        return textwrap.dedent(body) + "\ndef add(a, b):\n    return a + b\n"

    return [
        ("busy loop", "while True:\n    pass\n", None, ("CPU time limit", "timed out")),
        ("busy loop in the function", "def add(a, b):\n    while True:\n        pass\n", None,
         ("CPU time limit", "timed out", "not run")),
        ("sleep", "import time\ntime.sleep(60)\n", None, ("timed out after 1s",)),
        ("fork bomb", "import os\nwhile True:\n    os.fork()\n", None, ("PermissionError in the code",)),
        ("memory bomb", "blocks = []\nwhile True:\n    blocks.append(bytearray(2**25))\n", None,
         ("memory limit (256 MB) exceeded",)),
        ("memory bomb at once", "x = bytearray(10**11)\n", None, ("memory limit",)),
        ("huge output", "import sys\nwhile True:\n    sys.stdout.write('x' * 2**20)\n", None,
         ("bytes of output",)),
        ("huge raw output", "import os\nwhile True:\n    os.write(2, b'\\x00' * 2**20)\n", None,
         ("bytes of output",)),
        ("network", add_ok(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)"),
         None, ("not allowed", "Permission")),
        ("raw socket connect", add_ok(f"""
            import socket
            s = socket.socket()
            s.connect(('127.0.0.1', {port}))"""), None, ("not allowed", "Permission")),
        ("write outside", add_ok(f"open({outside!r}, 'w').write('pwned')"), None,
         ("not allowed", "Permission")),
        ("kill its parent", add_ok("import os\nos.kill(os.getppid(), 9)"), None,
         ("not allowed", "Permission")),
        ("sys.exit(0) first", "import sys\nsys.exit(0)\n", None, ("called sys.exit()",)),
        ("os._exit(0) first", "import os\nos._exit(0)\n", None, ("exited with status 0",)),
        ("sys.exit in the function", "import sys\ndef add(a, b):\n    sys.exit(0)\n", None,
         ("called sys.exit()",)),
        ("override AssertionError", textwrap.dedent("""
            import builtins
            builtins.AssertionError = type("Fine", (BaseException,), {})
            AssertionError = None
            def add(a, b):
                return 99
            """), None, ("test 1: AssertionError at line 1",)),
        ("override builtins the test uses", textwrap.dedent("""
            import builtins
            builtins.len = lambda x: 3
            len = lambda x: 3
            def add(a, b):
                return []
            """), ["assert len(add(1, 2)) == 3"], ("test 1: AssertionError at line 1",)),
        ("always-equal object", textwrap.dedent("""
            class E:
                def __eq__(self, other): return True
                def __ne__(self, other): return False
                def __bool__(self): return True
            def add(a, b):
                return E()
            """), None, ("test 1: a value is not a plain value at line 1",)),
        ("int subclass", "class I(int):\n    def __eq__(self, o): return True\n"
                         "def add(a, b):\n    return I(0)\n", None, ("a value is not a plain value",)),
        ("frame introspection", textwrap.dedent("""
            import os, sys
            f = sys._getframe(1)
            os.write(f.f_locals["rfd"], b"T" + f.f_locals["token"])
            os._exit(0)
            """), None, ("ValueError in the code",)),
        ("frames through a traceback", textwrap.dedent("""
            import os
            try:
                raise ValueError
            except ValueError as e:
                f = e.__traceback__.tb_frame.f_back
            os.write(f.f_locals["rfd"], b"T" + f.f_locals["token"])
            os._exit(0)
            """), None, ("AttributeError in the code",)),
        ("garbage-collector introspection", "import gc, os\nobjs = gc.get_objects()\nos._exit(0)\n", None,
         ("PermissionError in the code",)),
        ("forge results on every fd", textwrap.dedent("""
            import os
            for fd in range(3, 64):
                try:
                    os.write(fd, b"T" + b"0" * 32)
                except OSError:
                    pass
            os._exit(0)
            """), None, ("exited with status 0",)),
        ("patch the harness's tools", textwrap.dedent("""
            import builtins, os
            os._exit = lambda code: None
            os.write = lambda fd, data: len(data)
            builtins.exec = lambda *a, **k: None
            builtins.eval = lambda *a, **k: 3
            def add(a, b):
                return 99
            """), None, ("AssertionError at line 1", "exited with status")),
        ("rewrite the harness", textwrap.dedent("""
            import sys
            sys.modules["__main__"]._harness = lambda: None
            with open("/proc/self/mem", "wb") as f:
                f.write(b"x")
            """), None, ("PermissionError in the code",)),
        ("read the dataset", add_ok(f"open({os.path.abspath(__file__)!r}).read()"), None,
         ("PermissionError in the code",)),
    ]


def test_hostile_corpus_scores_zero_and_the_pool_keeps_serving(pool, tmp_path, capsys):
    before = batch_seconds(pool)
    pool_stats = pool.stats()
    outside = str(tmp_path / "pwned.txt")
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.05)
        corpus = hostile_corpus(server.getsockname()[1], outside)
        items = [item(code, tests or ADD_TESTS, **{**FAST, **NOT_BY_TIME.get(name, {})})
                 for name, code, tests, _ in corpus]
        start = time.perf_counter()
        out = pool.score(items, TIMEOUTS)
        hostile_s = time.perf_counter() - start
        with pytest.raises(socket.timeout):
            server.accept()  # nothing ever connected
    for (name, _, _, reasons), (value, error) in zip(corpus, out):
        assert error is None, (name, error)  # scored, not failed
        assert value == 0.0, (name, value, value.reason)
        assert value.reason and any(r in value.reason for r in reasons), (name, value.reason)
    assert os.listdir(tmp_path) == []  # nothing written outside
    after_stats = pool.stats()
    assert after_stats["deaths"] == pool_stats["deaths"]  # no worker died: the parent was never hit
    assert after_stats["timeouts"] == pool_stats["timeouts"]  # time limits held inside code_tests
    # a correct solution right afterwards, then a normal batch at the normal speed
    assert pool.score([item(GOOD)], TIMEOUTS) == [(1.0, None)]
    after = batch_seconds(pool)
    with capsys.disabled():
        print(f"\n[code verifier] batch of 32 samples x 3 tests: {before:.2f}s before, {after:.2f}s after "
              f"{len(corpus)} hostile samples (scored in {hostile_s:.2f}s)")
    assert after < 2 * before + 1.0


def test_kernel_layers_hold_without_the_audit_hook(tmp_path):
    """The in-child audit hook is the last layer, not the only one: with it off, the kernel still
    refuses what matters (where this machine has the layers)."""
    p = RewardPool({"code": "code_tests"}, workers=2, env={"COEVO_CODE_TESTS_NO_AUDIT_HOOK": "1"})
    try:
        p.start()
        landlock, nproc = p.isolation["landlock"], p.isolation["max_processes"] is not None
        with socket.create_server(("127.0.0.1", 0)) as server:
            server.settimeout(0.05)
            port = server.getsockname()[1]
            cases = []
            if "signals" in landlock:
                cases.append(("import os\nos.kill(os.getppid(), 9)", "PermissionError"))
            if nproc:  # bounded, should the limit not hold: 2**6 processes, all in its group
                cases.append(("import os\nfor _ in range(6):\n    os.fork()", "BlockingIOError"))
            if "tcp" in landlock or code_child.seccomp_program():
                cases.append((f"import socket\nsocket.create_connection(('127.0.0.1', {port}))",
                              "PermissionError"))
            if code_child.seccomp_program():
                cases.append(("import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                              f"s.sendto(b'x', ('127.0.0.1', {port}))", "PermissionError"))
            if landlock:
                cases.append((f"open({str(tmp_path / 'pwned.txt')!r}, 'w')", "PermissionError"))
            if not cases:
                pytest.skip("no kernel layers here (no Landlock, no seccomp, no uid drop)")
            items = [item(code + "\ndef add(a, b): return a + b\n", **FAST) for code, _ in cases]
            out = p.score(items, TIMEOUTS)
            with pytest.raises(socket.timeout):
                server.accept()
        for (code, expected), (value, error) in zip(cases, out):
            assert error is None and value == 0.0 and expected in value.reason, (code, value.reason)
        assert os.listdir(tmp_path) == []
        assert p.stats()["deaths"] == 0
        assert p.score([item(GOOD)], TIMEOUTS) == [(1.0, None)]
    finally:
        p.close()


# ---- bad input -----------------------------------------------------------------------------------------
def test_bad_input_gives_a_null_reward_and_a_reason_never_a_crash(pool):
    enormous = "def add(a, b): return a + b\n" + "#" * 10_000_000
    items = [item(""), item("def add(a, b): return '\udcff'"), item(b"\xff\xfe"),
             ("code", {"prompt": "q", "response": GOOD}), item(GOOD, tests="not json"),
             item(GOOD, tests=["assert add(1,"]), item(enormous), item(GOOD, tests=[]),
             item(GOOD, mode="best"), item(GOOD, setup="import not_a_module_anywhere"),
             item(GOOD, tests=["assert isclose(add(0.1, 0.2), 0.3)"], setup="from math import isclose"),
             item(GOOD)]
    start = time.perf_counter()
    out = pool.score(items, TIMEOUTS)
    assert time.perf_counter() - start < 5
    assert out[0][0] == 0.0 and out[0][0].reason == "empty response: no code to run"
    assert out[1] == (None, out[1][1]) and "lone surrogate" in out[1][1]
    assert out[2][0] is None and "not valid UTF-8" in out[2][1]
    assert out[3][0] is None and "no 'tests' column" in out[3][1]
    assert out[4][0] is None and "not JSON" in out[4][1]
    assert out[5][0] is None and "tests[0] is not valid Python" in out[5][1]
    assert out[6][0] is None and "over max_chars=100,000" in out[6][1]
    assert out[7][0] is None and "'tests' is empty" in out[7][1]
    assert out[8][0] is None and "args.mode must be one of" in out[8][1]
    assert out[9][0] is None and "the row's setup failed: ModuleNotFoundError" in out[9][1]
    assert out[10] == (1.0, None)  # setup's names are there for the tests
    assert out[11] == (1.0, None)  # and the pool goes on


# ---- VeRPO ------------------------------------------------------------------------------------------------
def test_verpo_weights_by_hand():
    # pass rates (passes + 1) / (attempts + 2): 3/6, 4/6, 2/6 -> difficulties 1/2, 1/3, 2/3 -> / 3/2
    w = verpo_weights([4, 4, 4], [2, 3, 1])
    assert np.allclose(w, [1 / 3, 2 / 9, 4 / 9])
    assert np.allclose(verpo_weights([0, 0], [0, 0]), [0.5, 0.5])  # unseen: uniform
    assert np.allclose(verpo_weights([3, 3], [3, 3], prior=0), [0.5, 0.5])  # all easy, no prior
    assert verpo_reward([1, 1, 0], w) == pytest.approx(5 / 9)
    assert verpo_reward([1, 1, 1], w) == pytest.approx(1.0)
    assert verpo_reward([1, 1, 0], w, outcome_weight=0.5) == pytest.approx(5 / 18)


def test_verpo_statistics_accumulate_decay_and_reset():
    conf = {"key": "k", "prior": 1.0, "decay": 1.0, "outcome_weight": 0.0}
    rows = [("p", {"passed": [1, 1, 1], "verpo": conf}), ("p", {"passed": [0, 1, 0], "verpo": conf}),
            ("p", {"passed": [1, 1, 0], "verpo": conf}), ("p", {"passed": [0, 0, 0], "verpo": conf}),
            ("q", {"passed": [1, 1, 1], "verpo": conf}), ("x", {"passed": "bad", "verpo": conf})]
    stats, rewards = verpo_rewards({}, rows)
    assert stats["p"] == ["k", [4.0, 4.0, 4.0], [2.0, 3.0, 1.0]]
    assert np.allclose(rewards[:5], [1.0, 2 / 9, 5 / 9, 0.0, 1.0]) and rewards[5] is None
    assert "x" not in stats
    stats2, rewards2 = verpo_rewards(stats, rows[:4])  # counts 8, passes 4, 6, 2: weights 1/3, .2, 7/15
    assert stats["p"][1] == [4.0, 4.0, 4.0]  # the earlier state is left as it was
    assert np.allclose(rewards2, [1.0, 0.2, 1 / 3 + 0.2, 0.0])
    halved = {**conf, "decay": 0.5}
    stats3, _ = verpo_rewards(stats2, [("p", {"passed": [1, 1, 1], "verpo": halved})])
    assert stats3["p"][1:] == [[5.0, 5.0, 5.0], [3.0, 4.0, 2.0]]
    changed = {**conf, "key": "other"}  # the prompt's tests changed: its statistics start again
    stats4, _ = verpo_rewards(stats3, [("p", {"passed": [1, 0, 0], "verpo": changed})])
    assert stats4["p"] == ["other", [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]


VERPO_RESPONSES = ["def add(a, b): return a + b", "def add(a, b): return 0",
                   "def add(a, b): return abs(a + b)", "def add("]


def verpo_table(prompts: list[str]) -> pa.Table:
    responses = [r for _ in prompts for r in VERPO_RESPONSES]
    n = len(responses)
    lengths = np.ones(n, dtype=np.int64)
    return B.rollout_table(
        uid=[f"u{i}" for i in range(n)], prompt_id=[p for p in prompts for _ in VERPO_RESPONSES],
        prompt=["Write add(a, b)."] * n, response=responses,
        prompt_ids=B.list_column(np.ones(n, np.int32), lengths, pa.int32()),
        response_ids=B.list_column(np.ones(n, np.int32), lengths, pa.int32()),
        behavior_logprobs=B.list_column(np.zeros(n, np.float32), lengths, pa.float32()),
        policy_version=0, finish_reason=["stop"] * n,
        extra={"answer": pa.array(["a + b"] * n), "tests": pa.array([ADD_TESTS] * n, pa.list_(pa.string()))},
    )


def test_verpo_through_the_verifier_and_its_checkpointed_state():
    cfg = validate_config({"rewards": [{"name": "verpo", "fn": "code_tests", "args": {"mode": "verpo"}}],
                           "rollout": {"samples_per_prompt": 4}})
    first, second = Verifier(cfg), None
    try:
        scored, info = first.score(verpo_table(["p0"]))
        B.validate(scored)
        # pass vectors [1,1,1], [0,1,0], [1,1,0], [0,0,0]: weights 1/3, 2/9, 4/9 (see above)
        assert np.allclose(scored.column("reward.verpo").to_pylist(), [1.0, 2 / 9, 5 / 9, 0.0])
        assert scored.column("reward_error.verpo").to_pylist() == [None] * 4
        reasons = scored.column("reward_reason.verpo").to_pylist()
        assert reasons[0] is None and reasons[1].startswith("1/3 tests passed")
        assert "SyntaxError" in reasons[3]
        saved = json.loads(json.dumps(first.state_dict()))  # as the run's checkpoint stores it
        assert saved["verpo"]["verpo"]["p0"][1:] == [[4.0, 4.0, 4.0], [2.0, 3.0, 1.0]]
        second = Verifier(cfg)
        second.load_state_dict(saved)
        again_first, _ = first.score(verpo_table(["p0", "p1"]))
        again_second, _ = second.score(verpo_table(["p0", "p1"]))
        expected = [1.0, 0.2, 1 / 3 + 0.2, 0.0] + [1.0, 2 / 9, 5 / 9, 0.0]  # p0: 8 attempts; p1: new
        assert np.allclose(again_first.column("reward.verpo").to_pylist(), expected)
        assert (again_second.column("reward.verpo").to_pylist()
                == again_first.column("reward.verpo").to_pylist())
        assert first.state_dict() == second.state_dict()
    finally:
        first.close()
        if second is not None:
            second.close()


# ---- the pool's detailed-result protocol ------------------------------------------------------------------
DETAILED = '''
def detailed(prompt, response, **_):
    if response == "ok":
        return {"value": 0.5, "reason": "half", "details": {"passed": [1, 0]}}
    if response == "no reason":
        return {"value": 1}
    if response == "extra key":
        return {"value": 1.0, "why": "x"}
    if response == "nan":
        return {"value": float("nan")}
    if response == "bad details":
        return {"value": 1.0, "details": {"x": object()}}
    if response == "huge details":
        return {"value": 1.0, "details": ["x" * 100] * 1000}
    if response == "bad reason":
        return {"value": 1.0, "reason": 3}
    if response == "surrogate":
        return {"value": 1.0, "reason": "bad \\udcff text"}
    if response == "scored":
        from actors.sandbox.worker import Scored
        return Scored(0.25, "a quarter", [1, 0, 0, 0])
    return 1.0
'''


def test_detailed_results_through_the_pool(tmp_path, monkeypatch):
    name = f"coevo_detailed_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(DETAILED)
    monkeypatch.syspath_prepend(str(tmp_path))
    p = RewardPool({"d": f"{name}:detailed"}, workers=1)
    try:
        cases = ["ok", "no reason", "extra key", "nan", "bad details", "huge details", "bad reason",
                 "surrogate", "plain", "scored"]
        out = p.score([("d", {"prompt": "q", "response": r}) for r in cases], {"d": 5.0})
    finally:
        p.close()
    ok = out[0][0]
    assert isinstance(ok, Scored) and ok == 0.5 and ok.reason == "half" and ok.details == {"passed": [1, 0]}
    assert out[1][0] == 1.0 and out[1][0].reason is None and out[1][0].details is None
    for i in (2, 3, 4, 5, 6):
        assert out[i][0] is None and '{"value": finite number' in out[i][1], cases[i]
    assert out[7][0] == 1.0 and out[7][0].reason == "bad ? text"
    assert out[8] == (1.0, None) and type(out[8][0]) is float
    assert out[9] == (0.25, None) and (out[9][0].reason, out[9][0].details) == ("a quarter", [1, 0, 0, 0])
