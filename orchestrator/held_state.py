"""Statistics a role's replicas share (VeRPO's per-test pass counts), held by the driver.

Held inside the replicas, they would be lost when Ray restarts one, differ between replicas, and
count a retried batch twice. Instead the pool sends the one merged copy with every call (an object
store reference, re-put only after it changed), the replica scores against it and returns what
this batch adds (`info[DELTA_KEY]`), and the pool merges that delta when the answer arrives. A
delta names its batch (a hash of the rows' uids): a batch merged once is skipped if it comes
again, e.g. an in-flight piece scored after a checkpoint and scored again after the resume.
Work whose answer never arrives (a killed or hung replica) adds nothing. The checkpoint holds this
one merged copy.
"""

from __future__ import annotations

from collections.abc import Callable

import ray

from actors.batch import DELTA_KEY  # noqa: F401  (re-exported: the pools read it here)

SEEN_LIMIT = 100_000  # batch keys remembered (oldest dropped): far more than a checkpoint's pieces


class HeldState:
    methods = ("score", "evaluate")  # the calls that read the state and return a delta

    def __init__(self, merge: Callable[[dict, dict], dict]):
        self._merge = merge
        self.state: dict = {}
        self.seen: dict[str, None] = {}  # insertion-ordered set of merged batch keys
        self._ref = None

    def ref(self):
        if self._ref is None:
            self._ref = ray.put(self.state)
        return self._ref

    def merge(self, delta: dict | None) -> bool:
        """Add a call's delta; False if it carries nothing or its batch was merged before."""
        if not delta or not delta.get("state"):
            return False
        key = delta.get("batch")
        if key is not None:
            if key in self.seen:
                return False
            self.seen[key] = None
            if len(self.seen) > SEEN_LIMIT:
                del self.seen[next(iter(self.seen))]
        self.state = self._merge(self.state, delta["state"])
        self._ref = None
        return True

    def state_dict(self) -> dict:
        return {"state": self.state, "seen": list(self.seen)}

    def load_state_dict(self, saved: dict) -> None:
        if not isinstance(saved, dict) or not isinstance(saved.get("state", {}), dict):
            raise ValueError(f"checkpoint: held role state must be {{'state': {{...}}, 'seen': [...]}}, "
                             f"got {type(saved).__name__}")
        self.state = dict(saved.get("state", {}))
        self.seen = dict.fromkeys(saved.get("seen", []))
        self._ref = None
