"""Verifier actor: rule-based reward functions over a rollout batch.

A function that raises, returns a non-number or exceeds its time limit gives that sample a null
`reward.<source>` and a `reward_error.<source>` message; the run goes on.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import ray

from actors import batch as B

# Columns a reward function does not get: prompt, response and dataset columns pass through.
NOT_DATASET = (set(B.CORE_FIELDS) | set(B.OPTIONAL_FIELDS)) - {"prompt", "response"}


class Verifier:
    def __init__(self, verifier_config):
        from actors.rewards.sandbox import RewardSandbox

        self.specs = verifier_config.rewards
        self.on_error = verifier_config.on_error
        self.accuracy_column = (B.REWARD_PREFIX + verifier_config.accuracy_source
                                if verifier_config.accuracy_source else "reward")
        self.sandbox = RewardSandbox({r.name: r.fn or r.name for r in self.specs})
        self.timeouts = {r.name: r.timeout_s for r in self.specs}

    def score(self, table: pa.Table) -> pa.Table:
        """Add `reward.<source>`, `reward_error.<source>` per source and the weighted `reward`."""
        B.validate(table)
        columns = [n for n in table.schema.names
                   if n not in NOT_DATASET and not n.startswith(("reward", "reward_error"))]
        rows = table.select(columns).to_pylist()
        items = [(spec.name, row) for spec in self.specs for row in rows]
        results = self.sandbox.score(items, self.timeouts)
        total = np.zeros(table.num_rows, dtype=np.float32)
        for k, spec in enumerate(self.specs):
            part = results[k * len(rows):(k + 1) * len(rows)]
            values = pa.array([v for v, _ in part], pa.float32())
            errors = pa.array([e for _, e in part], pa.string())
            table = table.append_column(B.REWARD_PREFIX + spec.name, values)
            table = table.append_column(B.REWARD_ERROR_PREFIX + spec.name, errors)
            filled = values.fill_null(self.on_error).to_numpy(zero_copy_only=False)
            total += spec.weight * filled
        if "reward" in table.schema.names:
            table = table.drop_columns(["reward"])
        return B.with_version(table.append_column("reward", pa.array(total, pa.float32())))

    def evaluate(self, table: pa.Table) -> dict[str, float]:
        """Score a greedy eval batch; accuracy is the mean of `accuracy_source` (default: the
        aggregated reward), failed samples counting as `on_error`."""
        scored = self.score(table)
        column = scored.column(self.accuracy_column).fill_null(self.on_error)
        return {"accuracy": float(np.mean(column.to_numpy())), "samples": scored.num_rows,
                **B.reward_error_counts(scored)}

    def close(self) -> None:
        self.sandbox.close()



VerifierActor = ray.remote(Verifier)
