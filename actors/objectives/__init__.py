"""Learner objectives: each training signal a learner can host, in its own module, registered by name.

A learner actor (actors/learner.py) owns a model, its optimizer and checkpoints, and hosts one or
more objectives; each public training method of the learner hands its batch to the objective that
owns it. An objective declares
- what it needs from a batch (`columns`, checked by `require` with an error naming the column);
- how it computes its loss and metrics over micro-batches given the model (its own step method, or,
  for an objective that rides along another one's step, `prepare` / `begin` / `term`);
- its options, as typed constructor arguments (a role spec's `{"name": ..., **options}`): an
  objective reads no recipe's config section (tests/test_imports.py checks it);
- what state it keeps (`parameters` to train, `state_dict` to checkpoint, `save` beside the model).

Built-ins: policy_gradient, preference, sft, laser_align, value, rehearsal, self_judge. A `module:Class` path names your
own. See docs/learner.md.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import torch

from actors import batch as B
from actors.registry import Registry

OBJECTIVES = Registry("learner objective", plugins=tuple(f"actors.objectives.{m}" for m in (
    "laser_align", "policy_gradient", "preference", "rehearsal", "self_judge", "sft", "value")))


class Objective:
    """One training signal a learner hosts. `learner` is the host: model, tokenizer, device,
    optimizer, reference and the tensor helpers of actors/trainable.py. Its public methods beyond
    this interface are what a recipe calls through `Learner.call_objective`."""

    name = "objective"
    columns: tuple[str, ...] = ()  # the batch columns its step reads
    needs_tail = False  # riders: whether `term` needs the logits after each response's last token
    rides_alone = False  # riders: whether `begin` alone makes its loss (it can ride a preference step too)

    def __init__(self, learner):
        self.learner = learner

    def require(self, table: pa.Table, columns: tuple[str, ...] | None = None) -> None:
        missing = [c for c in (self.columns if columns is None else columns) if c not in table.schema.names]
        if missing:
            raise B.BatchError(f"the {self.name} objective needs batch column(s) {missing}; "
                               f"the batch has {table.schema.names}")

    # ---- riding along another objective's step (LaSeR's MSE on the RL step) -----------------------
    def prepare(self, table: pa.Table, data: dict) -> torch.Tensor | None:
        """Add this objective's tensors to `data`; returns the rows it needs a forward pass for."""
        return None

    def begin(self, data: dict, rows: torch.Tensor) -> None:
        """Start one optimizer update over `rows`."""

    def term(self, tail: torch.Tensor | None, data: dict, mb: torch.Tensor) -> tuple[torch.Tensor | float, dict]:
        """This objective's loss on micro-batch `mb` (already divided as the update's mean) and its sums."""
        return 0.0, {}

    def metrics(self, sums: dict, updates: int) -> dict:
        return {}

    # ---- state ------------------------------------------------------------------------------------
    def parameters(self) -> list[torch.nn.Parameter]:
        """Trainable tensors of its own (a value head), optimised with the model."""
        return []

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def save(self, out: Path) -> None:
        """Files that travel with the saved model (a run built from it needs them)."""


def build(specs, learner) -> dict[str, Objective]:
    """Objectives from names or `{"name": ..., **options}` entries, in order, keyed by name."""
    out: dict[str, Objective] = {}
    for spec in specs:
        options = dict(spec) if isinstance(spec, dict) else {"name": spec}
        if not isinstance(options.get("name"), str):
            raise ValueError(f"learner objective {spec!r} needs a 'name' (one of {', '.join(OBJECTIVES.names())})")
        name = options.pop("name")
        objective = OBJECTIVES.get(name)(learner, **options)
        if objective.name in out:
            raise ValueError(f"learner objective {objective.name!r} is listed twice in {list(specs)}")
        out[objective.name] = objective
    return out
