"""Per-process torch set-up shared by the actors that run models."""

from __future__ import annotations

import os
import random
from contextlib import contextmanager

import numpy as np
import torch


def setup_torch(threads: int, seed: int, want_gpu: bool = False) -> str:
    """Pin torch's thread count (Ray sets OMP_NUM_THREADS=1 in workers) and seed; return device."""
    torch.set_num_threads(threads or os.cpu_count() or 1)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if want_gpu and not torch.cuda.is_available():
        raise RuntimeError("num_gpus > 0 was asked for but torch sees no CUDA device here")
    return "cuda" if want_gpu else "cpu"


@contextmanager
def torch_threads(threads: int):
    """Run a block with `threads` torch threads (0: every core), then restore the previous count."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads or os.cpu_count() or 1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def device_of(actor) -> str:
    """The torch device an actor computes on: its own `device`, or its backend's (a generator's)."""
    for holder in (actor, getattr(actor, "backend", None)):
        device = getattr(holder, "device", None)
        if isinstance(device, (str, torch.device)):
            return str(device)
    return "cpu"
