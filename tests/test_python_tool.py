"""The `python` environment's tool runs in the code sandbox (actors/envs/sandbox.py): the hostile-code
corpus of tests/test_code_attacks.py, sent as tool calls, is stopped by the kernel layers (there is
no audit hook on the tool path: the kernel alone holds), its output never shows the secrets, and
the calling process lives on. Ordinary programs answer with what they print."""

from __future__ import annotations

import os

import pytest

from actors.envs import ENVIRONMENTS
from actors.envs.base import close_shared
from test_code_attacks import SECRET, corpus, secrets_dir  # noqa: F401  (secrets_dir: a fixture)

pytestmark = pytest.mark.slow
ESCAPED = "ESCAPED-7f3"


@pytest.fixture(scope="module")
def python():
    cls = ENVIRONMENTS.get("python")
    yield lambda **args: cls({"prompt": "?", "answer": "0"}, max_calls=4, wall_s=3.0, **args)
    close_shared()


def test_a_program_answers_with_what_it_prints(python):
    env = python()
    steps = type(env).step_batch([env, python(), python()], [
        "<python>x = 6\nprint(x * 7)</python>", "<python>2**10</python>",
        "<python>raise ValueError('nope')</python>"])
    assert steps[0].observation == "42" and steps[0].errors == 0
    assert steps[1].observation == "1024"
    assert steps[2].observation.startswith("error: exited with status 1") and "ValueError: nope" in steps[2].observation
    assert steps[2].errors == 1 and not any(s.done for s in steps)


def test_limits_hold_on_the_tool_path(python):
    env = python()
    steps = type(env).step_batch([python() for _ in range(3)], [
        "<python>while True:\n    pass</python>", "<python>print('x' * 10**7)</python>",
        "<python>b = bytearray(2 * 1024**3)</python>"])
    assert steps[0].observation.startswith(("error: timed out", "error: CPU time limit")), steps[0].observation
    assert steps[1].observation.startswith("error: wrote more than"), steps[1].observation
    assert steps[2].observation.startswith("error: exited with status 1") and "MemoryError" in steps[2].observation


def test_the_hostile_corpus_is_stopped_on_the_tool_path(python, secrets_dir):  # noqa: F811
    cases = corpus(secrets_dir)
    envs = [python() for _ in cases]
    turns = [f"<python>{code}\nprint({ESCAPED!r})</python>" for _, code, _, _ in cases]
    steps = type(envs[0]).step_batch(envs, turns)
    for (name, _, _, reasons), step in zip(cases, steps):
        text = step.observation
        assert ESCAPED not in text and SECRET not in text and "root:x:0" not in text, (name, text)
        assert step.errors == 1 and any(r in text for r in reasons), (name, text)
    assert os.getpid() > 0  # the test process, the tool's caller, was not signalled
    # the same programs, attack lines removed, run: the corpus would see an escape
    assert ESCAPED in type(envs[0]).step_batch([python()], [f"<python>print({ESCAPED!r})</python>"])[0].observation
