"""Where the loop's train batches come from: one interface for the rollouts a policy generates
(orchestrator.rollouts.Rollouts), a file of preference pairs (orchestrator.pair_source.PairSource)
and a recipe's own source (self_rewarding's iterations). A recipe's `source(ctx, state)` returns one;
the loop (orchestrator.loop) calls only what is declared here."""

from __future__ import annotations

from dataclasses import dataclass, field

import ray


@dataclass
class PairPiece:
    """A train batch of preference pairs, already in the object store."""
    table: ray.ObjectRef
    samples: int
    info: dict = field(default_factory=dict)


class BatchSource:
    """The loop's view of a batch source. `take` is the one method a source must have; the others
    default to a source that produces nothing in the background and keeps no pieces in flight."""

    def start(self) -> None:
        """Begin producing (a background task), once the run's actors are up."""

    async def take(self) -> list | None:
        """The pieces of the next train batch; None when the run should stop."""
        raise NotImplementedError

    def last_batch(self) -> bool:
        """The batch just taken is the run's last, before train.max_steps (a source that ends on its
        own, as self_rewarding's iterations do): the loop evaluates after it, as at max_steps."""
        return False

    def trained_batch(self) -> None:
        """The batch just taken was trained on (admission may let more work start)."""

    def interrupt(self) -> None:
        """A stop was requested: a `take` waiting for work returns None."""

    def accounting(self) -> dict:
        """Counts for the metrics row and the summary."""
        return {}

    async def snapshot(self) -> dict:
        """State for a checkpoint; `pieces` in flight, `tables` to store beside it."""
        return {"pieces": []}

    async def stop(self) -> None:
        """Stop producing; what is in flight is dropped (a checkpoint taken before keeps it)."""
