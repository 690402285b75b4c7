"""Tiny actors for the Pool fault tests (tests/test_pool_faults.py): importable by Ray workers, as a
recipe's `module:Class` is."""

from __future__ import annotations

import os
import time
from pathlib import Path


class Worker:
    """`work(x)` returns (x, this process's pid). A file named by `hang_once` makes the first call
    that finds it hang (it removes the file); `hang_always` makes every call hang. update_weights
    rejects the version named by `reject_version`."""

    def __init__(self, config, hang_once: str | None = None, hang_always: bool = False,
                 reject_version: int | None = None, role: dict | None = None):
        self.hang_once, self.hang_always, self.reject_version = hang_once, hang_always, reject_version
        self.version = 0

    def ping(self) -> int:
        return os.getpid()

    def update_weights(self, version: int, payload) -> int:
        if version == self.reject_version:
            from actors.weights import WeightMismatchError
            raise WeightMismatchError(f"weight update does not fit the model: missing 1 keys (e.g. ['head.w']) "
                                      f"(version {version}, nothing was loaded)")
        self.version = version
        return version

    def work(self, x, expect_version: int | None = None):
        if self.hang_always:
            time.sleep(3600)
        if self.hang_once:
            try:
                Path(self.hang_once).unlink()
                time.sleep(3600)
            except FileNotFoundError:
                pass
        return x, os.getpid()

    def held(self, x, seconds: float = 0.0, expect_version: int | None = None):
        """`(x, pid, the weights version this replica holds)` after `seconds` of work."""
        time.sleep(seconds)
        return x, os.getpid(), self.version


class Ranked:
    """A rank of a RankGroup (tests/test_rank_group_faults.py) over gloo: `reduce(x)` sums x over the
    ranks, after `stall[rank]` seconds; rank `fail` raises instead."""

    def __init__(self, config, role: dict | None = None):
        from actors.distributed import Ranks
        role = role or {}
        self.ranks = Ranks(role.get("rank", 0), role.get("world_size", 1))

    def ping(self) -> int:
        return os.getpid()

    def rendezvous(self) -> tuple[str, int]:
        from actors.distributed import free_port
        return "127.0.0.1", free_port()

    def init_distributed(self, address: str, port: int) -> int:
        self.ranks.init(address, port, "gloo", timeout_s=60)
        return self.ranks.rank

    def reduce(self, x: float, stall: dict | None = None, fail: int | None = None, oom: int | None = None,
               peers_exit_s: float | None = None) -> float:
        """`oom`: that rank runs out of CUDA memory (as torch says it); `peers_exit_s`: the others then
        die after that long in place of the collective (as NCCL's watchdog ends a process)."""
        if fail == self.ranks.rank:
            raise ValueError(f"rank {fail} failed on purpose")
        if oom == self.ranks.rank:
            raise _cuda_oom()
        if oom is not None and peers_exit_s is not None:
            time.sleep(peers_exit_s)
            os._exit(1)
        time.sleep((stall or {}).get(self.ranks.rank, 0))
        return self.ranks.sum({"x": x})["x"]


def _cuda_oom():
    import torch
    return torch.cuda.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
        "1.06 GiB is free. Of the allocated memory 76.52 GiB is allocated by PyTorch")


class Hungry:
    """Runs out of CUDA memory (torch's own error) in `generate`, or at start-up with `at_start`."""

    def __init__(self, config, role: dict | None = None, at_start: bool = False):
        if at_start:
            raise _cuda_oom()
        self.calls = 0

    def ping(self) -> int:
        return os.getpid()

    def generate(self, x, expect_version: int | None = None):
        self.calls += 1
        raise _cuda_oom()

    def count(self) -> int:
        return self.calls


def _tiny(seed: int):
    from actors import modeling
    return modeling.tiny_model(modeling.char_tokenizer(), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                               intermediate_size=64, seed=seed)


class TinyLearner:
    """A learner's weight-publishing side on a tiny CPU model (channel tests): `publish_parts`, and
    what CUDA IPC's export reads (`full_state`, `version`)."""

    def __init__(self, config, role: dict | None = None):
        self.model, self.version, self.device = _tiny(seed=1), 0, "cpu"

    def ping(self) -> int:
        return os.getpid()

    def step(self) -> int:
        import torch
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(0.01)
        self.version += 1
        return self.version

    def full_state(self) -> dict:
        return self.model.state_dict()

    def publish_parts(self):
        from actors.weights import export_state
        return export_state(self.model, self.version), {"version": self.version}


class TinyReplica:
    """A replica that installs published weights into a tiny CPU model (channel tests)."""

    def __init__(self, config, role: dict | None = None):
        self.model, self.version, self.device = _tiny(seed=2), 0, "cpu"

    def ping(self) -> int:
        return os.getpid()

    def update_weights(self, version: int, payload: dict) -> int:
        from actors.weights import load_state
        load_state(self.model, payload, version, where="tiny replica")
        self.version = version
        return version

    def checksum(self) -> tuple[int, float]:
        return self.version, float(sum(p.double().sum() for p in self.model.parameters()))
