"""A judge apart from the policy (`judge.separate`): the judging warm-up's change to the weights,
kept as a "judge vector" (judged weights minus the weights it started from), which a judge pool adds
to every policy version it receives. The policy starts RL where the warm-up found it (its accuracy
and its sampling distribution untouched) and still judges itself: the judge is the current policy
plus what the warm-up taught it about judging.

The vector is a model-shaped directory (the base model's config.json and a safetensors file of
differences) so that runs copy it into their checkpoints like any frozen model.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

FILE = "judge_vector.safetensors"


def _parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Floating parameters by name, each tensor once (tied embeddings are one parameter)."""
    return {n: p for n, p in model.named_parameters() if p.is_floating_point()}


def _mismatch(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """Up to 3 parameter names that one side lacks or that differ in shape (empty: they match)."""
    return sorted(a.keys() ^ b.keys())[:3] or [n for n in a if a[n].shape != b[n].shape][:3]


@torch.no_grad()
def write(base_dir: str | Path, judged_dir: str | Path, out: str | Path) -> Path:
    """Save judged - base (parameter by parameter) to the directory `out`, atomically."""
    from safetensors.torch import save_file

    from actors.modeling import load_model

    base, judged = _parameters(load_model(base_dir)), _parameters(load_model(judged_dir))
    odd = _mismatch(base, judged)
    if odd:
        raise ValueError(f"judge vector: {judged_dir} and {base_dir} are not the same architecture "
                         f"(parameters differ, e.g. {odd})")
    delta = {n: (judged[n] - base[n]).contiguous() for n in base}
    out = Path(out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copy2(Path(judged_dir) / "config.json", tmp / "config.json")
    save_file(delta, str(tmp / FILE))
    if out.exists():  # another run wrote the same vector meanwhile
        shutil.rmtree(tmp)
    else:
        os.replace(tmp, out)
    return out


def load(path: str | Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    file = Path(path) / FILE
    if not file.is_file():
        raise FileNotFoundError(f"{file} not found: judge.separate's judge vector is missing (deleted from the run "
                                "directory or its checkpoint?)")
    return load_file(str(file))


@torch.no_grad()
def add(model: torch.nn.Module, vector: dict[str, torch.Tensor]) -> None:
    """model's parameters += vector (the judge on top of the policy version just loaded)."""
    own = _parameters(model)
    odd = _mismatch(own, vector)
    if odd:
        raise ValueError(f"judge vector: its parameters do not match the judge's model (e.g. {odd})")
    for name, p in own.items():
        p.add_(vector[name].to(device=p.device, dtype=p.dtype))
