"""DPH-RL's rehearsal (Li et al. 2025, "The Choice of Divergence: A Neglected Key to Mitigating
Diversity Collapse in Reinforcement Learning with Verifiable Reward"): a mass-covering f-divergence
to the initial policy, estimated on samples the initial policy drew once before training (with their
log-probs), so no reference model runs online. It rides along the RL step: every optimizer update
adds `coef` times the divergence on a few rehearsal samples.

With samples y ~ pi_init and the token ratio r = pi_theta / pi_init:
- forward_kl: KL(pi_init || pi_theta) per token, log pi_init - log pi_theta (gradient: -grad log pi_theta,
  i.e. supervised learning on the initial policy's samples);
- js: the Jensen-Shannon divergence per token, (log(2 / (1 + r)) + r log(2r / (1 + r))) / 2, 0 at r = 1.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import torch

from actors import batch as B
from actors.objectives import OBJECTIVES, Objective

DIVERGENCES = ("forward_kl", "js")


def divergence(name: str, logprobs: torch.Tensor, init_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token divergence estimate on samples of the initial policy."""
    log_r = logprobs - init_logprobs
    if name == "forward_kl":
        return -log_r
    if name == "js":
        r = torch.exp(log_r)
        return 0.5 * (math.log(2.0) - torch.nn.functional.softplus(log_r) + r * (math.log(2.0) + log_r
                                                                                   - torch.nn.functional.softplus(log_r)))
    raise ValueError(f"rehearsal divergence {name!r} is not one of {list(DIVERGENCES)}")


@OBJECTIVES.register("rehearsal")
class Rehearsal(Objective):
    name = "rehearsal"
    columns = ("prompt_ids", "response_ids", "behavior_logprobs")  # the initial policy's log-probs

    def __init__(self, learner, divergence: str = "js", coef: float = 0.1, batch: int = 32):
        super().__init__(learner)
        if divergence not in DIVERGENCES:
            raise ValueError(f"rehearsal divergence {divergence!r} is not one of {list(DIVERGENCES)}")
        if not coef > 0 or batch < 1:
            raise ValueError(f"rehearsal needs coef > 0 and batch >= 1, got coef={coef!r}, batch={batch!r}")
        self.divergence, self.coef, self.batch = divergence, coef, batch
        self.table: pa.Table | None = None
        self._sums = {"rehearsal/divergence": 0.0, "rehearsal/updates": 0}

    # ---- the set, drawn once from the initial policy -----------------------------------------------
    def set(self, table: pa.Table) -> int:
        self.require(table)
        self.table = table.select(list(self.columns))
        return table.num_rows

    def size(self) -> int:
        return 0 if self.table is None else self.table.num_rows

    def state_dict(self) -> dict:  # checkpointed: a resumed run must not draw it again from newer weights
        return {"rehearsal": self.table}

    def load_state_dict(self, state: dict) -> None:
        if state.get("rehearsal") is not None:
            self.table = state["rehearsal"]

    # ---- riding along the RL step ------------------------------------------------------------------
    def begin(self, data: dict, rows: torch.Tensor) -> None:
        """Adds coef x the divergence (token mean) on `batch` rehearsal samples to this update's
        gradient. Every rank computes the same rows (the update's gradients are averaged over ranks)."""
        if not self.size():
            return
        lrn = self.learner
        rng = np.random.default_rng([lrn.config.seed, lrn.version, int(rows[0]) if len(rows) else 0])
        pick = rng.choice(self.size(), size=min(self.batch, self.size()), replace=False)
        table = self.table.take(pa.array(pick))
        ids, mask, positions, r_ids, r_mask, p_width = lrn._sequences(table)
        init, _ = B.to_padded(table.column("behavior_logprobs"), 0.0, torch.float32)
        logp = lrn._token_logprobs(lrn.model, ids, mask, positions, r_ids, p_width, **lrn.sampling)
        m = r_mask.to(lrn.device).float()
        per_token = divergence(self.divergence, logp, init.to(lrn.device))
        value = (per_token * m).sum() / m.sum().clamp(min=1)
        (self.coef * value).backward()
        self._sums["rehearsal/divergence"] += float(value.detach())
        self._sums["rehearsal/updates"] += 1

    def metrics(self, sums: dict, updates: int) -> dict:
        out = {}
        if self._sums["rehearsal/updates"]:
            out["rehearsal/divergence"] = self._sums["rehearsal/divergence"] / self._sums["rehearsal/updates"]
            out["rehearsal/samples"] = self.size()
        self._sums = {"rehearsal/divergence": 0.0, "rehearsal/updates": 0}
        return out
