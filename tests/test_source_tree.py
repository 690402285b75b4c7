"""A source tree that is not pip-installed runs (`python -m orchestrator.cli`), version included: the
GPU host of issue 31 has no registry and runs a checkout, where `--version` used to fail with
PackageNotFoundError.

The tree is copied to a temporary directory and run from there, with a `sitecustomize` that makes
the `coevo` distribution unknown to importlib.metadata (this venv has it installed in editable
mode): what a machine without the install sees."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

NOT_INSTALLED = '''
import importlib.metadata as metadata

_from_name = metadata.Distribution.from_name.__func__


def from_name(cls, name):
    if name.replace("-", "_").lower() == "coevo":
        raise metadata.PackageNotFoundError(name)
    return _from_name(cls, name)


metadata.Distribution.from_name = classmethod(from_name)
'''


@pytest.fixture(scope="module")
def source_tree(tmp_path_factory) -> tuple[Path, dict]:
    """(a copy of the checkout, an environment in which coevo is not installed)."""
    root = tmp_path_factory.mktemp("tree")
    tree = root / "coevo-src"
    for name in ("orchestrator", "actors", "pipelines"):
        shutil.copytree(REPO / name, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tree / "pyproject.toml")
    guard = root / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(NOT_INSTALLED)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(PYTHONPATH=str(guard), HF_HUB_OFFLINE="1", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    return tree, env


def test_the_guard_hides_the_installed_distribution(source_tree) -> None:
    tree, env = source_tree
    proc = subprocess.run([sys.executable, "-c", "import importlib.metadata as m; m.version('coevo')"],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "PackageNotFoundError" in proc.stderr


def test_version_from_a_source_tree_that_is_not_installed(source_tree) -> None:
    tree, env = source_tree
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "--version"], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "coevo 0.1.0"
    where = subprocess.run([sys.executable, "-c", "import orchestrator; print(orchestrator.__file__)"], cwd=tree,
                           env=env, capture_output=True, text=True, timeout=60)
    assert where.stdout.startswith(str(tree))  # the copy ran, not the checkout the venv points at


def test_a_run_from_a_source_tree_that_is_not_installed(source_tree, ray_env, tmp_path) -> None:
    tree, env = source_tree
    env = {**ray_env, "PYTHONPATH": env["PYTHONPATH"]}
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "run", "warmup.enabled=false", "train.max_steps=2",
         "train.eval_every=2", "rollout.prompts_per_step=4", "rollout.samples_per_prompt=2", "data.eval_size=8",
         "ray.num_cpus=2", "train.threads=1", "--output-dir", str(run_dir)],
        cwd=tree, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "done: 2 steps" in proc.stdout
    assert (run_dir / "checkpoints" / "final" / "policy_learner" / "config.json").is_file()
