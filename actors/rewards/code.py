"""Code execution: a response's code against the row's unit tests, each test in a fresh sandboxed
interpreter; and VeRPO's difficulty-weighted partial credit.

`code_tests` (registered by name) extracts the code from the response, then runs every unit test
of the row in its own `python -I -S -B` subprocess (isolated mode, no site-packages: the standard
library only) and scores the passes. It runs inside the reward pool (actors.sandbox.pool), so a
test process inherits the pool worker's isolation and adds its own layers.

The `tests` column
------------------
A list of test strings, or a JSON string holding such a list. Each test string is Python source,
usually one `assert`, and may hold several statements (the forms below), all run in the namespace
where the code was defined::

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

Every mode returns a `Scored` float (actors.sandbox.worker: the score, with `reason` and `details`
attributes the pool carries back to the Verifier): `reason` says why a sample lost marks ("1/3 tests
passed; test 2: AssertionError at line 1; test 3: timed out after 2s"); the Verifier writes it to
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
(default: this Python), `allow_missing_layers` (isolation layers it may run without, see above), and for `verpo`: `prior`, `decay`, `outcome_weight`. RLIMIT_CPU counts
whole seconds: `cpu_time_s` is rounded, at least 1. When the code fails before any test statement
runs (an exception, a timeout or a limit while defining it), the remaining tests are not started:
they would run the same code again.

YAML::

    - {name: tests, fn: code_tests, timeout_s: 10, args: {mode: pass_fraction}}
    - {name: solved, fn: code_tests, weight: 0, args: {mode: all_pass}}
    - {name: verpo, fn: code_tests, timeout_s: 10, args: {mode: verpo, extract: completion}}

Protections (docs/security.md has the whole list and what holds where a layer is missing):

- The parent decides: each test is parsed before anything runs (actors.sandbox.asserts:
  supported forms are top-level asserts, simple statements, parameterless `def test_*()` and
  `for` loops over literals or range; anything else holding an assert is a bad row). The test
  process (actors.sandbox.harness) only reports plain values of the sub-expressions the parent
  cannot evaluate itself; it holds no expected value and no secret.
- Kernel layers of each test process (actors.sandbox.child): Landlock reads/listings/exec
  only of its directory and the interpreter's files, writes only in its directory; no TCP; no
  signals outside; seccomp (no sockets, no io_uring); no capabilities; rlimits; its
  process group killed after each test. A missing layer makes the pool refuse to start unless
  `allow_missing_layers` lists it (then a warning at every start).
- `reward_reason` holds only text the parent builds (built-in exception class names, lines,
  limits), never the process's output, messages or values.
- Last, Python-level layer: an audit hook in the test process (off with
  COEVO_CODE_TESTS_NO_AUDIT_HOOK=1, for tests that show the kernel alone holds).

Bad input: undecodable bytes or lone surrogates, a missing or malformed `tests` column, a test
that does not parse or holds an assert in an unsupported form, or a response over `max_chars`
raise ValueError (the pool turns that into a null reward and the message); an empty response, no
code, or code that does not parse score 0 with a reason, without starting any process.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import sys
import tempfile
import time

from actors import sandbox
from actors.rewards import REWARD_FUNCTIONS
from actors.rewards.text import MISSING, check_text, refuse_longer, require
from actors.sandbox import audit_hook_on, bound_names, plan_test, run_test, setup_constants, whitelisted_imports

MODES = ("pass_fraction", "all_pass", "verpo")
EXTRACTS = ("auto", "fence", "response", "completion")
FENCE_LANGS = ("python", "py", "python3", "")
MAX_REASON = 600  # characters of a sample's reason

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


# ---- the kernel layers (checked once per interpreter, in the pool at start) -------------------------
_KERNEL: dict[str, dict] = {}


def kernel_layers(python: str, allow=None) -> dict:
    """The kernel layers a test process gets here (sandbox.check, once per interpreter); raises
    RuntimeError naming each missing layer unless `allow` (the code_tests arg
    `allow_missing_layers`) or sandbox.ALLOW_ENV lists it."""
    if python not in _KERNEL:
        with tempfile.TemporaryDirectory(prefix="code-check-") as directory:
            _KERNEL[python] = sandbox.check(python, directory)
    layers = _KERNEL[python]
    refused = set(layers["missing"]) - sandbox.allowed_missing() - sandbox.allowed_missing(allow or [])
    if refused:
        raise RuntimeError(
            "code_tests refuses to run untrusted code without these kernel layers: "
            + "; ".join(f"{name} ({layers['missing'][name]})" for name in sorted(refused))
            + f". To run weaker anyway, list them in the code_tests arg allow_missing_layers "
            f"(or {sandbox.ALLOW_ENV}); see docs/security.md")
    return layers


def isolation(python: str | None = None) -> dict:
    """The layers a test process gets here (run from a pool worker, it adds to the worker's)."""
    layers = kernel_layers(python or sys.executable, allow=list(sandbox.LAYERS))
    return {"kernel": layers["holds"], "missing": sorted(layers["missing"]),
            "landlock_abi": layers["landlock_abi"], "uid": os.geteuid(), "nproc_enforced": os.geteuid() != 0,
            "rlimits": ["AS", "CPU", "FSIZE", "NOFILE", "NPROC", "CORE"],
            "in_child": (["audit_hook"] if audit_hook_on() else []) + ["pristine_builtins"],
            "judge": "the parent evaluates every assert on plain values the test process reports"}


def reward_check(iso: dict, seen: dict | None = None) -> dict:
    """The pool's start-up check (actors.sandbox.worker calls it with the workers' identity, then
    again in the zygote with what it found): refuses to start without a layer, or warns."""
    if seen is None:
        layers = dict(kernel_layers(sys.executable, allow=list(sandbox.LAYERS)))
        layers["missing"] = dict(layers["missing"])
        if iso.get("uid") is None and os.geteuid() == 0:
            layers["missing"]["uid"] = ("the pool runs as root (without capabilities): "
                                        + " | ".join(iso.get("notes") or ["drop_privileges=False"]))
        return layers
    if seen.get("rules"):  # the workers forked from here need not find them again
        sandbox.remember_rules(sys.executable, seen["rules"])
    seen = {k: v for k, v in seen.items() if k != "rules"}
    _KERNEL[sys.executable] = {k: v for k, v in seen.items() if k != "missing"} | {
        "missing": {k: v for k, v in seen["missing"].items() if k != "uid"}}
    refused = set(seen["missing"]) - sandbox.allowed_missing()
    if refused:
        raise RuntimeError(
            "code_tests refuses to start without these isolation layers: "
            + "; ".join(f"{name} ({seen['missing'][name]})" for name in sorted(refused))
            + f". To run weaker anyway, set {sandbox.ALLOW_ENV}={','.join(sorted(refused))} "
            "(verifier config: the code_tests arg allow_missing_layers); see docs/security.md")
    if seen["missing"]:
        print(f"WARNING: code_tests runs WITHOUT the isolation layers {sorted(seen['missing'])} "
              f"(allowed by {sandbox.ALLOW_ENV}): {seen['missing']}", file=sys.stderr, flush=True)
    return seen


# ---- the reward function ------------------------------------------------------------------------------
@REWARD_FUNCTIONS.register("code_tests")
def code_tests(prompt: str, response: str, tests=MISSING, setup=None, entry=None, mode: str = "pass_fraction",
               extract: str = "auto", test_timeout_s: float = 2.0, cpu_time_s: float = 1.0,
               time_limit_s: float = 4.0, memory_mb: float = 256, max_output_bytes: int = 1 << 20,
               file_mb: float = 16, max_chars: int | None = 100_000, interpreter: str | None = None,
               prior: float = 1.0, decay: float = 1.0, outcome_weight: float = 0.0,
               allow_missing_layers=None, **columns) -> float:
    """Run the response's code against the row's unit tests (see the module docstring for the
    `tests` format, the modes, the arguments and the protections).

    YAML: `{name: tests, fn: code_tests, timeout_s: 10, args: {mode: pass_fraction}}`
    """
    from actors.sandbox import Scored  # here: the zygote runs actors.sandbox.worker as __main__

    if mode not in MODES:
        raise ValueError(f"args.mode must be one of {MODES}, got {mode!r}")
    test_timeout_s = _number(test_timeout_s, "test_timeout_s")
    cpu_time_s = _number(cpu_time_s, "cpu_time_s")
    time_limit_s = _number(time_limit_s, "time_limit_s")
    memory_mb = _number(memory_mb, "memory_mb", 16)
    max_output_bytes = int(_number(max_output_bytes, "max_output_bytes"))
    file_mb = _number(file_mb, "file_mb")
    cases = parse_tests(tests, columns)
    text = refuse_longer(check_text(response), max_chars)
    setup = check_text(setup, "setup") if setup else ""
    known: set[str] = set()
    child = set()
    constants: dict = {}
    if setup:
        try:
            setup_tree = ast.parse(setup, "<setup>")
        except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
            raise ValueError(f"'setup' is not valid Python: {type(e).__name__}: {e}") from None
        known = whitelisted_imports(setup_tree)
        child = bound_names(setup) - known
        constants = {k: v for k, v in setup_constants(setup_tree, known).items() if k != entry}
    if entry is not None and not (isinstance(entry, str) and entry.isidentifier()):
        raise ValueError(f"'entry' must be a Python name, got {entry!r}")
    plans = [plan_test(t, i, child | ({entry} if entry else set()), known, constants) for i, t in enumerate(cases)]
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
    layers = kernel_layers(python, allow_missing_layers)
    passed, failures = [], []
    start = time.monotonic()
    for i, (test, checks) in enumerate(plans):
        left = time_limit_s - (time.monotonic() - start)
        if left < 0.05:
            passed.extend([0] * (n - i))
            failures.append(f"tests {i + 1}-{n}: not run (time_limit_s={time_limit_s:g} used up)"
                            if i + 1 < n else f"test {n}: not run (time_limit_s={time_limit_s:g} used up)")
            break
        ok, why, reached = run_test(python, {"code": code, "setup": setup, "steps": test, "entry": entry},
                                    checks, layers, min(test_timeout_s, left), cpu_time_s, memory_mb,
                                    max_output_bytes, file_mb)
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


code_tests.reward_preload = ("subprocess", "actors.sandbox.worker", "actors.sandbox.run")
code_tests.reward_check = reward_check


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
