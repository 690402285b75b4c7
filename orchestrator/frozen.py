"""Frozen models a run depends on but does not train, kept by the run itself.

A frozen reward model (a directory the user named, or `model: auto` from the reward-model cache),
the warm policy that a recipe without a policy learner samples from, and each learner's frozen
reference would otherwise be read on resume from a path another run may delete or retrain. The run
copies the first two into `<run>/frozen/` once (a copy, not a link: a cache rewritten in place
would change a hard-linked file), the learners save their references into `<run>/<role>_reference`,
and every checkpoint hard-links all of them (files the run never rewrites) into its own `frozen/`
and `references/`, so a checkpoint is complete on its own and costs no extra space for them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

FROZEN = "frozen"
REFERENCES = "references"


def link_tree(src: Path, dst: Path) -> None:
    """dst: the same files as src, hard-linked where the filesystem allows, else copied."""
    def link(a, b):
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)
    shutil.copytree(src, dst, copy_function=link, dirs_exist_ok=True)


def freeze(run_dir: Path, policy: str | None, reward_models: dict[str, str], judge_vector: str | None = None) -> dict:
    """Copy the frozen models into the run; returns their index ({"policy": rel | None,
    "reward_models": {name: rel}, "judge_vector": rel | None}), paths relative to the run directory
    or a checkpoint."""
    index: dict = {"policy": None, "reward_models": {}, "judge_vector": None}
    wanted = ([("policy", policy)] if policy else []) + [(f"reward_models/{n}", p) for n, p in reward_models.items()]
    wanted += [("judge_vector", judge_vector)] if judge_vector else []
    for rel, src in wanted:
        dst = run_dir / FROZEN / rel
        if not dst.is_dir():
            tmp = dst.with_name(f".{dst.name}.tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("run", "*.tmp"))  # not a cache's own run
            os.replace(tmp, dst)
        if rel in ("policy", "judge_vector"):
            index[rel] = f"{FROZEN}/{rel}"
        else:
            index["reward_models"][rel.split("/", 1)[1]] = f"{FROZEN}/{rel}"
    return index


def into_checkpoint(tmp: Path, run_dir: Path, index: dict, learners: list[str]) -> None:
    """Link the run's frozen models and the learners' references into a checkpoint being written."""
    for rel in [index.get("policy"), index.get("judge_vector"), *index.get("reward_models", {}).values()]:
        if rel:
            if not (run_dir / rel / "config.json").is_file():
                raise FileNotFoundError(f"checkpoint: the run's frozen model {run_dir / rel} is gone (deleted "
                                        "while the run was going?); it cannot be stored in the checkpoint")
            link_tree(run_dir / rel, tmp / rel)
    for role in learners:
        ref = run_dir / f"{role}_reference"
        if (ref / "config.json").is_file():
            link_tree(ref, tmp / REFERENCES / role)


def from_checkpoint(ckpt: Path, run_dir: Path, state: dict, learners: list[str]) -> tuple[str | None, dict]:
    """On resume: put the checkpoint's frozen models and references back into the run directory
    (where later checkpoints link them from) if they are missing; returns (policy, reward_models)
    as directories. A checkpoint from before frozen copies existed names its sources directly."""
    index = state.get("frozen")
    if index is None:  # older layout: sources by path (they must still exist)
        return state.get("policy_source"), dict(state.get("reward_models", {}))
    for rel in [index.get("policy"), index.get("judge_vector"), *index.get("reward_models", {}).values()]:
        if rel:
            _restore_dir(ckpt / rel, run_dir / rel)
    for role in learners:
        saved = ckpt / REFERENCES / role
        if (saved / "config.json").is_file():
            _restore_dir(saved, run_dir / f"{role}_reference")
    policy = str(run_dir / index["policy"]) if index.get("policy") else None
    return policy, {name: str(run_dir / rel) for name, rel in index.get("reward_models", {}).items()}


def _restore_dir(src: Path, dst: Path) -> None:
    if (dst / "config.json").is_file():
        return
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"--resume: the checkpoint lacks its frozen model {src} (no config.json)")
    shutil.rmtree(dst, ignore_errors=True)
    link_tree(src, dst)
