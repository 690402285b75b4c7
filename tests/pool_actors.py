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

    def reduce(self, x: float, stall: dict | None = None, fail: int | None = None) -> float:
        if fail == self.ranks.rank:
            raise ValueError(f"rank {fail} failed on purpose")
        time.sleep((stall or {}).get(self.ranks.rank, 0))
        return self.ranks.sum({"x": x})["x"]
