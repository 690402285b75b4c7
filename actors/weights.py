"""Versioned weight updates (the receiving end of a weight channel): all or nothing.

A learner publishes `{"version": v, "state": {name: numpy array}}` once to the object store; every
replica that hosts the same model reads it zero-copy. Before a single tensor is copied, the payload's
keys, shapes and dtypes are checked against the receiving model, so a mismatched update fails loudly
instead of loading part of a model (which `load_state_dict(strict=False)` would do silently).
"""

from __future__ import annotations

import warnings

import numpy as np
import torch


class StaleReplicaError(RuntimeError):
    """A replica was asked to work at a weights version it does not hold (e.g. it was restarted);
    the pool re-sends it the current weights and retries the work."""


class WeightMismatchError(ValueError):
    """A weight update does not fit the model it was sent to; nothing was loaded."""


def export_state(model: torch.nn.Module | dict, version: int) -> dict:
    """The publishable payload of a model or a state dict: numpy arrays (the object store maps them
    zero-copy)."""
    state = model.state_dict() if isinstance(model, torch.nn.Module) else model
    return {"version": int(version), "state": {k: v.detach().cpu().numpy() for k, v in state.items()}}


CASTS_UPDATES = "coevo_casts_updates"  # set on a copy that holds the model in a dtype of its own


def inference_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """`model` as a copy that does not train, in `dtype` (model.dtype). A learner publishes its
    float32 master weights: a copy in another dtype takes them cast as they load (the check below
    accepts a floating-point tensor for a floating-point one), in one pass, all or nothing."""
    model = model.to(dtype)
    setattr(model, CASTS_UPDATES, dtype != torch.float32)
    return model


def _torch_dtype(dtype) -> torch.dtype:
    return dtype if isinstance(dtype, torch.dtype) else torch.from_numpy(np.empty(0, dtype=dtype)).dtype


def check_state(model: torch.nn.Module, state: dict, where: str = "model") -> None:
    """Raise WeightMismatchError naming every missing, unexpected or mis-shaped/typed tensor
    (`state`: numpy arrays or torch tensors). A copy in a dtype of its own (`inference_copy`) takes
    floating-point tensors of another floating-point dtype, cast as they load."""
    own = model.state_dict()
    casts = getattr(model, CASTS_UPDATES, False)
    problems = []
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing:
        problems.append(f"missing {len(missing)} keys (e.g. {missing[:3]})")
    if unexpected:
        problems.append(f"unexpected {len(unexpected)} keys (e.g. {unexpected[:3]})")
    for name in sorted(set(own) & set(state)):
        mine, theirs = own[name], state[name]
        if tuple(mine.shape) != tuple(theirs.shape):
            problems.append(f"{name}: shape {tuple(theirs.shape)} != {tuple(mine.shape)}")
        elif _torch_dtype(theirs.dtype) != mine.dtype and not (
                casts and _torch_dtype(theirs.dtype).is_floating_point and mine.dtype.is_floating_point):
            problems.append(f"{name}: dtype {theirs.dtype} != {mine.dtype}")
        if len(problems) > 8:
            break
    if problems:
        raise WeightMismatchError(f"weight update does not fit the {where}: " + "; ".join(problems)
                                  + " (nothing was loaded)")


def payload_state(payload: dict) -> dict:
    """The tensors of a published payload: numpy arrays from the object store, or views of a buffer
    on this GPU that a colocated learner exported (`{"ipc": ...}`, actors.weight_ipc)."""
    if "ipc" in payload:
        from actors.weight_ipc import tensors
        return tensors(payload["ipc"])
    return payload["state"]


def load_state(model: torch.nn.Module, payload: dict, version: int, where: str = "model") -> None:
    """Check, then copy every tensor of a published payload into `model` (cast to its dtype where it
    is an `inference_copy`)."""
    if payload.get("version") != version:
        raise WeightMismatchError(f"weight update for the {where} says version {payload.get('version')} "
                                  f"but was sent as version {version}")
    state = payload_state(payload)
    check_state(model, state, where)
    with warnings.catch_warnings():  # object-store arrays are read-only; load_state_dict copies
        warnings.simplefilter("ignore", UserWarning)
        tensors = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in state.items()}
    model.load_state_dict(tensors, strict=True)
