"""Reward sources that fail loudly: a function that errors on every sample stops the run, one that
errors often warns on the console.

Per step the loop passes, per reward source, the samples it scored, how many failed and the first
error (from the verifier's per-piece info, so the driver never reads the tables). A source that
failed on every sample it scored for `verifier.max_failed_steps` steps in a row stops the run with
its function's name and that error: training on a constant `verifier.on_error` reward teaches
nothing. A source failing on more than WARN_RATE of a step's samples warns, at most once per
source every WARN_EVERY_S seconds.
"""

from __future__ import annotations

import time

WARN_RATE = 0.2
WARN_EVERY_S = 60.0
KEYS = ("errors/", "scored/", "first_error/")  # the verifier info keys this module reads


class RewardFailure(RuntimeError):
    """A reward source failed on every sample for too many steps."""


def health_info(info: dict) -> dict:
    """The verifier info a recipe keeps in a piece's info for the check."""
    return {k: v for k, v in info.items() if k.startswith(KEYS)}


def step_counts(infos: list[dict]) -> dict[str, tuple[int, int, str | None]]:
    """Sum pieces' verifier info into source -> (scored, errors, first error)."""
    out: dict[str, tuple[int, int, str | None]] = {}
    for info in infos:
        for key, scored in info.items():
            if not key.startswith("scored/"):
                continue
            source = key[len("scored/"):]
            total, errors, first = out.get(source, (0, 0, None))
            out[source] = (total + scored, errors + info.get(f"errors/{source}", 0),
                           first or info.get(f"first_error/{source}"))
    return out


class RewardHealth:
    def __init__(self, functions: dict[str, str], max_failed_steps: int,
                 warn_rate: float = WARN_RATE, warn_every_s: float = WARN_EVERY_S):
        """`functions`: source name -> the function it runs (registry name or module:function)."""
        self.functions = dict(functions)
        self.max_failed_steps, self.warn_rate, self.warn_every_s = max_failed_steps, warn_rate, warn_every_s
        self.streak: dict[str, int] = {}  # source -> steps in a row it failed on every sample
        self.first: dict[str, str] = {}  # source -> the first error of its streak
        self.warned_at: dict[str, float] = {}

    def observe(self, step: int, counts: dict[str, tuple[int, int, str | None]],
                now: float | None = None) -> list[str]:
        """Warnings to print for this step; raises RewardFailure when a source keeps failing."""
        now = time.monotonic() if now is None else now
        warnings = []
        for source, (scored, errors, first) in sorted(counts.items()):
            if scored <= 0:
                continue  # labelled nothing this step: no evidence either way
            name = self._name(source)
            if errors >= scored:
                if not self.streak.get(source):
                    self.first[source] = first or "no message"
                self.streak[source] = self.streak.get(source, 0) + 1
                if self.max_failed_steps and self.streak[source] >= self.max_failed_steps:
                    raise RewardFailure(
                        f"reward {name} failed on every sample for {self.streak[source]} steps in a row "
                        f"(steps {step - self.streak[source] + 1}-{step}); its first error: "
                        f"{self.first[source]}. Fix the function, or set verifier.max_failed_steps=0 "
                        f"to train on regardless")
            else:
                self.streak[source] = 0
            if errors > self.warn_rate * scored and now - self.warned_at.get(source, -1e18) >= self.warn_every_s:
                self.warned_at[source] = now
                warnings.append(f"warning: reward {name} failed on {errors}/{scored} samples at step {step} "
                                f"({errors / scored:.0%}); first error: {first or 'no message'} "
                                f"(reward_error.{source} in the rollouts has each reason)")
        return warnings

    def _name(self, source: str) -> str:
        fn = self.functions.get(source, source)
        return f"source {source!r}" if fn == source else f"source {source!r} (function {fn!r})"
