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
