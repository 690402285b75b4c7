"""The sandboxed reward pool: hanging and hostile reward functions cost one sample, not the run.

Every test is bounded by short time limits (0.5-2 s). Tests assert behaviour (values, reasons,
counters); the few time bounds are loose, far from what the failure they guard against would take,
because CI machines are shared and loaded (the suite has run at load 17 on 2 cores).
"""

from __future__ import annotations

import os
import signal
import textwrap
import time

import pytest

from actors.sandbox import RewardPool

USER_MODULE = '''
import os, signal, sys, time
from actors.rewards import group_reward

def ok(prompt, response, answer, **_):
    return float(response.strip() == answer)

def hang(prompt, response, answer, **_):
    if response == "hang":
        time.sleep(60)
    return 1.0

def spin(prompt, response, answer, **_):
    if response == "hang":
        while True:
            pass
    return 1.0

def exits(prompt, response, answer, **_):
    if response == "sys.exit":
        sys.exit(3)
    if response == "os._exit":
        os._exit(4)
    if response == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    return 1.0

def kill_parent(prompt, response, answer, **_):
    if response.startswith("kill"):
        os.kill(os.getppid(), signal.SIGKILL)
    if response == "kill, wait":
        time.sleep(10)  # dies with the zygote before it can answer
    return 1.0

def signal_owner(prompt, response, answer, owner=0, **_):
    os.kill(int(owner), signal.SIGUSR1)
    return 1.0

def fork_bomb(prompt, response, answer, **_):
    if response == "bomb":
        for _ in range(8):  # at most 2**8 processes even without RLIMIT_NPROC
            try:
                os.fork()
            except OSError:
                pass
        time.sleep(60)
    return 1.0

def memory_bomb(prompt, response, answer, **_):
    if response == "bomb":
        blocks = []
        while True:
            blocks.append(bytearray(32 * 2**20))
    return 1.0

def spam(prompt, response, answer, **_):
    if response == "spam":
        chunk = "x" * 2**20
        for _ in range(50):
            print(chunk)
            sys.stderr.write(chunk)
            os.write(1, chunk.encode())
            os.write(2, b"\\x05\\x00\\x00\\x00" + chunk.encode())
    return 0.5

def escape(prompt, response, answer, target="", **_):
    with open(target, "w") as f:
        f.write("escaped")
    return 1.0

def local_write(prompt, response, answer, **_):
    import tempfile
    with open("scratch.txt", "w") as f:
        f.write("fine")
    with tempfile.NamedTemporaryFile() as f:
        f.write(b"x")
    return float(os.path.exists(os.path.join(os.environ["HOME"], "scratch.txt")))

def where(prompt, response, answer, **_):
    raise RuntimeError(f"cwd={os.getcwd()}")

def env_leak(prompt, response, answer, **_):
    leaked = [k for k in os.environ
              if k.endswith(("SECRET", "_TOKEN", "_KEY")) or k.startswith(("RAY_", "AWS_"))]
    if leaked:
        raise RuntimeError(f"leaked {leaked}")
    return 1.0

def tamper(prompt, response, answer, **_):
    if response == "tamper":
        os.write(4, b'{"s": 123456789, "v": 1.0}\\n\\x80\\x04garbage\\n')
    return 1.0

def leave_child(prompt, response, answer, **_):
    import subprocess
    return float(subprocess.Popen(["sleep", "60"], start_new_session=True).pid)

def connect(prompt, response, answer, port=0, **_):
    import socket
    socket.create_connection(("127.0.0.1", int(port)), timeout=2).close()
    return 1.0

def cpu_burn(prompt, response, answer, **_):
    while True:
        pass

def preloaded(prompt, response, answer, **_):
    return float("colorsys" in sys.modules and "wave" in sys.modules)

preloaded.reward_preload = ("colorsys",)

@group_reward
def majority(prompt, responses, **_):
    top = max(set(responses), key=responses.count)
    return [float(r == top) for r in responses]

@group_reward
def bad_group(prompt, responses, mode="ok", **_):
    if mode == "short":
        return [1.0] * (len(responses) - 1)
    if mode == "nan":
        return [0.0, float("nan")] + [0.0] * (len(responses) - 2)
    if mode == "text":
        return "one"
    if mode == "raise":
        raise ValueError("group broke")
    return [0.5] * len(responses)
'''


@pytest.fixture
def mod(tmp_path, monkeypatch):
    name = f"coevo_pool_rewards_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


@pytest.fixture
def make_pool(mod):
    pools = []

    def make(*fns: str, **kwargs) -> RewardPool:
        pool = RewardPool({fn: f"{mod}:{fn}" for fn in fns}, **kwargs)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()


def item(source, response, answer="x", **extra):
    return (source, {"prompt": "p", "response": response, "answer": answer, **extra})


def timed(pool, items, timeouts):
    start = time.monotonic()
    out = pool.score(items, timeouts)
    return out, time.monotonic() - start


def assert_normal_speed(pool):
    """After a hostile batch the pool serves a plain one, every value right, with no sample timing
    out or lost to a dead worker, and keeps its ready workers (the time bound is for a hang only:
    the batch may restart a zygote the hostile one killed, seconds on a loaded machine)."""
    before = pool.stats()
    out, elapsed = timed(pool, [item("ok", "x" if i % 2 else "y") for i in range(100)], {"ok": 5.0})
    assert out == [(1.0 if i % 2 else 0.0, None) for i in range(100)]
    after = pool.stats()
    assert [after[k] - before[k] for k in ("timeouts", "deaths")] == [0, 0]
    assert after["workers"] == pool.workers
    assert elapsed < 30, elapsed


def isolated_from_owner(pool) -> bool:
    iso = pool.isolation
    return iso["uid"] is not None or "signals" in iso["landlock"]


# ---- plain scoring ---------------------------------------------------------------------------------
def test_scores_many_items_in_order(make_pool):
    pool = make_pool("ok", "hang", workers=3)
    items = [item("ok" if i % 3 else "hang", "x" if i % 2 else "y") for i in range(300)]
    out = pool.score(items, {"ok": 5.0, "hang": 5.0})
    assert out == [((1.0 if i % 2 else 0.0) if i % 3 else 1.0, None) for i in range(300)]
    stats = pool.stats()
    assert stats["items"] == 300 and stats["restarts"] == 0 and stats["workers"] == 3
    assert stats["sources"]["ok"]["items"] == 200 and stats["sources"]["hang"]["items"] == 100
    assert pool.score([], {}) == []


def test_trivial_function_is_fast():
    pool = RewardPool({"im": "integer_match"})
    try:
        pool.start()
        items = [("im", {"prompt": "p", "response": str(i % 5), "answer": "3"}) for i in range(256)]
        spawned = pool.stats()["spawned"]
        times = []
        for _ in range(5):
            out, elapsed = timed(pool, items, {"im": 1.0})
            times.append(elapsed)
        assert [v for v, _ in out] == [float(i % 5 == 3) for i in range(256)]
        # fast because nothing is started per batch: the same workers serve every batch
        assert pool.stats()["spawned"] == spawned and pool.stats()["zygote_starts"] == 1
        assert sorted(times)[2] < 2.0, times  # ~4 ms on an idle 2-core machine
    finally:
        pool.close()


def test_group_reward(make_pool):
    pool = make_pool("majority", "bad_group", "ok")
    assert pool.scope("majority") == "group" and pool.scope("ok") == "sample"
    group = {"prompt": "p", "responses": ["4", "5", "4", "4"], "answer": "4"}
    items = [("majority", group), ("majority", {**group, "responses": ["a", "b", "b"]}),
             ("majority", {"prompt": "p", "response": "no list"}),
             *(("bad_group", {**group, "mode": m}) for m in ("ok", "short", "nan", "text", "raise")),
             item("ok", "x")]
    out = pool.score(items, {"majority": 5.0, "bad_group": 5.0, "ok": 5.0})
    assert out[0] == ([1.0, 0.0, 1.0, 1.0], None)
    assert out[1] == ([0.0, 1.0, 1.0], None)
    assert out[2][0] is None and "responses" in out[2][1]
    assert out[3] == ([0.5] * 4, None)
    assert out[4][0] is None and "returned 3 values for 4 responses" in out[4][1]
    assert out[5][0] is None and "nan at position 1" in out[5][1]
    assert out[6][0] is None and "'one'" in out[6][1] and "list of 4 finite numbers" in out[6][1]
    assert out[7][0] is None and "ValueError: group broke" in out[7][1]
    assert out[8] == (1.0, None)


def test_preload_imports_in_the_zygote(make_pool):
    pool = make_pool("preloaded", preload=("wave",))
    assert pool.score([item("preloaded", "x")], {"preloaded": 5.0}) == [(1.0, None)]


# ---- hanging ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", ["hang", "spin"])
def test_a_tenth_hanging_costs_about_one_limit(make_pool, fn):
    pool = make_pool(fn, "ok", max_workers=16)
    items = [item(fn, "hang" if i % 10 == 3 else "fine") for i in range(100)]
    out, elapsed = timed(pool, items, {fn: 2.0})
    for i, (value, error) in enumerate(out):
        if i % 10 == 3:
            assert value is None and error == "timed out after 2s"
        else:
            assert (value, error) == (1.0, None)
    assert elapsed < 12, elapsed  # side by side: about 2 s; one after another: 10 x 2 s
    assert pool.stats()["timeouts"] == 10
    assert_normal_speed(pool)
    assert pool.stats()["workers"] == 2  # the extra workers went with the batch


@pytest.mark.parametrize("fn", ["hang", "spin"])
def test_everything_hanging_is_bounded(make_pool, fn):
    pool = make_pool(fn, "ok", max_workers=8)
    out, elapsed = timed(pool, [item(fn, "hang") for _ in range(64)], {fn: 0.5})
    assert all(value is None for value, _ in out)
    timed_out = sum(e == "timed out after 0.5s" for _, e in out)
    skipped = sum(e.startswith("timed out (skipped: no sample of") for _, e in out)
    assert timed_out >= 2 and timed_out + skipped == 64
    assert pool.stats()["sources"][fn]["timeouts"] == pool.stats()["timeouts"] == 64
    assert elapsed < 0.5 + 10, elapsed  # serially: 32 s
    assert_normal_speed(pool)


@pytest.mark.parametrize("hang_first", [True, False])
def test_a_hanging_source_costs_no_other_source_its_scores(make_pool, hang_first):
    """Every sample of one source hangs: the other source keeps all its scores, in either order of
    the list, and each hanging sample counts as a timeout of its own source."""
    pool = make_pool("hang", "ok", max_workers=4)
    hanging = [item("hang", "hang") for _ in range(32)]
    fine = [item("ok", "x" if i % 2 else "y") for i in range(32)]
    out = pool.score(hanging + fine if hang_first else fine + hanging, {"hang": 0.5, "ok": 0.5})
    hung, scored = (out[:32], out[32:]) if hang_first else (out[32:], out[:32])
    assert scored == [(1.0 if i % 2 else 0.0, None) for i in range(32)]
    assert all(v is None and e.startswith("timed out") for v, e in hung), hung
    sources = pool.stats()["sources"]
    assert sources["hang"]["timeouts"] == sources["hang"]["errors"] == 32
    assert sources["ok"] == {**sources["ok"], "items": 32, "errors": 0, "timeouts": 0}


# ---- hostile functions -----------------------------------------------------------------------------
def test_exits_and_crashes_cost_one_sample(make_pool):
    pool = make_pool("exits", "ok")
    out = pool.score([item("exits", r) for r in ("a", "sys.exit", "b", "os._exit", "c", "segv", "d")],
                     {"exits": 5.0})
    assert out[0::2] == [(1.0, None)] * 4
    assert out[1] == (None, "called sys.exit(3); a reward function must return a value")
    assert out[3] == (None, "worker died (exit code 4)")
    assert out[5][0] is None and out[5][1].startswith("worker died (signal 11")
    assert pool.stats()["restarts"] == 2  # sys.exit is caught in the worker
    assert_normal_speed(pool)


def test_output_spam_is_discarded(make_pool):
    pool = make_pool("spam", "ok")
    out, elapsed = timed(pool, [item("spam", r) for r in ("spam", "a", "spam")], {"spam": 5.0})
    assert out == [(0.5, None)] * 3
    assert pool.stats()["restarts"] == 0
    assert_normal_speed(pool)


def test_memory_bomb(make_pool):
    pool = make_pool("memory_bomb", "ok", memory_mb=256)
    out, elapsed = timed(pool, [item("memory_bomb", r) for r in ("a", "bomb", "b")], {"memory_bomb": 5.0})
    assert out[0] == out[2] == (1.0, None)
    assert out[1][0] is None and "memory limit (256 MB) exceeded" in out[1][1]  # not the 5 s limit
    assert_normal_speed(pool)


def test_cpu_time_limit(make_pool):
    pool = make_pool("cpu_burn", "ok", cpu_time_s=0.5)
    out, elapsed = timed(pool, [item("cpu_burn", "x")], {"cpu_burn": 10.0})
    assert out[0][0] is None and out[0][1].startswith("CPU time limit (0.5s) exceeded")  # not the 10 s limit
    assert_normal_speed(pool)


def test_fork_bomb(make_pool):
    pool = make_pool("fork_bomb", "ok", max_processes=64)
    pool.start()
    if pool.isolation["max_processes"] is None:
        pytest.skip("no uid to drop to: RLIMIT_NPROC does not bind root")
    out, elapsed = timed(pool, [item("fork_bomb", r) for r in ("a", "bomb", "b")], {"fork_bomb": 1.0})
    assert out[0] == out[2] == (1.0, None)
    assert out[1] == (None, "timed out after 1s")
    assert_normal_speed(pool)
    zygote = pool._proc.pid
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and len(_descendants(zygote)) > pool.stats()["workers"]:
        time.sleep(0.05)
    assert len(_descendants(zygote)) == pool.stats()["workers"]  # the whole bomb is gone


def _descendants(root: int) -> list[int]:
    """Live processes under `root` (zombies excluded), from /proc."""
    children: dict[int, list[int]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state, ppid = f.read().rpartition(")")[2].split()[:2]
        except OSError:
            continue
        if state != "Z":
            children.setdefault(int(ppid), []).append(int(pid))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def test_leftover_processes_are_killed(make_pool):
    pool = make_pool("leave_child", "ok")
    [(pid, error)] = pool.score([item("leave_child", "x")], {"leave_child": 5.0})
    assert error is None
    assert not os.path.exists(f"/proc/{int(pid)}")  # killed and reaped right after the call
    assert_normal_speed(pool)


def test_killing_its_parent_kills_at_most_the_zygote(make_pool):
    # Unconfined (root without capabilities, no Landlock): the zygote can be killed; it comes back.
    pool = make_pool("kill_parent", "ok", drop_privileges=False, landlock=False)
    out = pool.score([item("kill_parent", r) for r in ("a", "kill", "b")], {"kill_parent": 5.0})
    assert out[0] == out[2] == (1.0, None)  # a bystander whose worker died with the zygote: retried
    assert out[1] == (1.0, None) or "worker died with its zygote, twice" in out[1][1]
    assert_normal_speed(pool)
    if pool.isolation["identity"] in ("no_caps", "None"):
        out = pool.score([item("kill_parent", r) for r in ("a", "kill, wait", "b")], {"kill_parent": 5.0})
        assert out[0] == out[2] == (1.0, None)
        assert out[1] == (None, "worker died with its zygote, twice (does this reward function kill "
                                "its parent process?)")
        assert_normal_speed(pool)  # the zygote that died last is restarted by the next use at the latest
        assert pool.stats()["zygote_restarts"] >= 2
    # Confined (the default): the kill itself is refused.
    pool = make_pool("kill_parent", "ok")
    out = pool.score([item("kill_parent", r) for r in ("a", "kill", "b")], {"kill_parent": 5.0})
    if isolated_from_owner(pool):
        assert out[1][0] is None and "PermissionError" in out[1][1]
        assert pool.stats()["zygote_restarts"] == 0
    assert out[0] == out[2] == (1.0, None)


def test_the_owner_cannot_be_signalled(make_pool):
    pool = make_pool("signal_owner")
    pool.start()
    if not isolated_from_owner(pool):
        pytest.skip("neither a uid drop nor Landlock signal scoping is available here")
    got = []
    old = signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
    try:
        out = pool.score([item("signal_owner", "x", owner=os.getpid())], {"signal_owner": 5.0})
        time.sleep(0.05)
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert out[0][0] is None and "PermissionError" in out[0][1]
    assert got == []


def test_writes_stay_in_the_worker_directory(make_pool, tmp_path):
    pool = make_pool("escape", "local_write", "where", "ok")
    pool.start()
    if pool.isolation["uid"] is None and not pool.isolation["landlock"]:
        pytest.skip("no uid drop and no Landlock here")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    targets = [str(private / "escaped.txt"), f"/tmp/coevo-escape-{os.getpid()}.txt",
               f"/dev/shm/coevo-escape-{os.getpid()}.txt"]
    items = [item("escape", "x", target=t) for t in targets] + [item("local_write", "x"), item("where", "x")]
    out = pool.score(items, {"escape": 5.0, "local_write": 5.0, "where": 5.0})
    for (value, error), target in zip(out, targets):
        if pool.isolation["landlock"] or target.startswith(str(private)):
            assert value is None and "PermissionError" in error, target
            assert not os.path.exists(target)
    assert out[3] == (1.0, None)  # its own directory (cwd, HOME, TMPDIR) is writable
    cwd = out[4][1].split("cwd=")[1].split(" (at")[0]
    assert os.path.isdir(cwd) and cwd.startswith(tempfile_root())
    pool.close()
    assert not os.path.exists(cwd)  # the throwaway directory is gone with its worker


def tempfile_root() -> str:
    import tempfile

    return tempfile.gettempdir()


def test_no_tcp_connections(make_pool):
    import socket

    pool = make_pool("connect")
    pool.start()
    if "tcp" not in pool.isolation["landlock"]:
        pytest.skip("Landlock has no TCP rules here (kernel < 6.7)")
    with socket.create_server(("127.0.0.1", 0)) as server:  # stands in for Ray's GCS
        out = pool.score([item("connect", "x", port=server.getsockname()[1])], {"connect": 5.0})
    assert out[0][0] is None and "PermissionError" in out[0][1]


def test_environment_has_no_secrets(mod, monkeypatch):
    for name in ("MY_API_TOKEN", "AWS_SECRET_ACCESS_KEY", "RAY_ADDRESS", "OPENAI_API_KEY"):
        monkeypatch.setenv(name, "secret")
    pool = RewardPool({"env_leak": f"{mod}:env_leak"}, env={"MY_SETTING": "1"})
    try:
        assert pool.score([item("env_leak", "x")], {"env_leak": 5.0}) == [(1.0, None)]
    finally:
        pool.close()


def test_forged_replies_are_rejected(make_pool):
    pool = make_pool("tamper", "ok")
    out = pool.score([item("tamper", r) for r in ("a", "tamper", "b")], {"tamper": 5.0})
    assert out[0] == out[2] == (1.0, None)
    # The forged line names no sample of this batch and is ignored; the garbage that follows
    # costs the worker, and the sample it was running.
    assert out[1][0] is None and "invalid reply" in out[1][1]
    assert pool.stats()["restarts"] == 1
    assert_normal_speed(pool)


def test_bad_function_path_fails_to_start(mod):
    pool = RewardPool({"x": f"{mod}:does_not_exist"})
    with pytest.raises(RuntimeError, match="failed to start"):
        pool.score([item("x", "x")], {"x": 5.0})
    pool.close()
