"""LaSeR alignment: the policy's self-reward r = beta * (log pi(z | x, y) - c), the log-probability of
a fixed token after its own response, fitted to the verifier's labels by MSE. It rides along the RL
step (and fills the `laser` reward sources from the generators' log-probs), and has its own warm-up
step (`align_steps`). The offset c is state: fixed from the first batch when the config leaves it
open, checkpointed, and saved beside a model whose r it belongs to."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from actors import batch as B
from actors.objectives import OBJECTIVES, Objective

LASER_FILE = "laser.json"  # LaSeR's offset c, next to the model whose r it belongs to


@OBJECTIVES.register("laser_align")
class LaserAlign(Objective):
    name = "laser_align"
    columns = ("laser_logprob",)
    needs_tail = True

    def __init__(self, learner):
        from actors.judging import single_token

        super().__init__(learner)
        config = learner.config
        if not config.laser_rewards():
            raise ValueError("the laser_align objective needs a reward source with `laser: true` in the config")
        self.cfg = config.laser
        self.label = config.label_source(config.laser)
        self.c = config.laser.c
        source = learner.model_source
        if self.c is None and source and (Path(source) / LASER_FILE).is_file():
            # a model whose r was aligned (LaSeR's warm-up) keeps the offset it was aligned with
            self.c = json.loads((Path(source) / LASER_FILE).read_text())["c"]
        self.token = single_token(learner.tokenizer, config.laser.token, "laser.token")

    # ---- state -------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"laser_c": self.c}

    def load_state_dict(self, state: dict) -> None:
        self.c = state.get("laser_c", self.c)

    def save(self, out: Path) -> None:
        if self.cfg.c is None and self.c is not None:
            # a c learned from the data (not a configured one): a run from this model must keep it
            (out / LASER_FILE).write_text(json.dumps({"c": self.c}))

    def self_reward(self, tail: torch.Tensor) -> torch.Tensor:
        return self.cfg.beta * (torch.log_softmax(tail.float(), dim=-1)[:, self.token] - self.c)

    # ---- riding along the RL step ------------------------------------------------------------------
    def rewards(self, table: pa.Table) -> pa.Table:
        """r from the generators' log-probs into every laser reward source; c is fixed from the first
        batch when the config leaves it open."""
        if "laser_logprob" not in table.schema.names:
            raise B.BatchError("a laser reward source needs the generators' `laser_logprob` column")
        lp = table.column("laser_logprob").to_numpy(zero_copy_only=False).astype(np.float64)
        if self.c is None:
            self.c = float(np.nanmean(lp))
        r = (self.cfg.beta * (lp - self.c)).astype(np.float32)
        for spec in self.learner.config.laser_rewards():
            table = B.replace_column(table, B.REWARD_PREFIX + spec.name, pa.array(r, pa.float32(), mask=np.isnan(r)))
        return table

    def prepare(self, table: pa.Table, data: dict) -> torch.Tensor:
        label = table.column(B.REWARD_PREFIX + self.label).to_numpy(zero_copy_only=False).astype(np.float32)
        data["laser_label"] = torch.from_numpy(label)
        return ~torch.isnan(data["laser_label"])

    def class_weights(self, labels: torch.Tensor):
        """Per-sample weights of the MSE over one update's labelled samples, summing to 1: equal per
        sample, or with `laser.balance` each class (correct, wrong) half of the total, so that an
        accurate policy's few wrong samples are not drowned out (LaSeR's class-level re-weighting)."""
        labels = labels[~torch.isnan(labels)]
        good = int((labels >= 0.5).sum())
        bad = len(labels) - good
        if not self.cfg.balance or not good or not bad:
            return lambda t: torch.full_like(t, 1.0 / len(labels))
        return lambda t: torch.where(t >= 0.5, 0.5 / good, 0.5 / bad)

    def begin(self, data: dict, rows: torch.Tensor) -> None:
        labels = data["laser_label"][rows]
        self._labelled = int((~torch.isnan(labels)).sum())
        self._weight = self.class_weights(labels) if self._labelled else None

    def term(self, tail, data: dict, mb: torch.Tensor):
        """The MSE is one mean over the update's labelled samples, whatever the micro-batches."""
        if tail is None or not self._labelled:
            return 0.0, {}
        target = data["laser_label"][mb].to(self.learner.device)
        ok = ~torch.isnan(target)
        mse = (self._weight(target[ok]) * (self.self_reward(tail)[ok] - target[ok]) ** 2).sum()
        return self.cfg.mse_weight * mse, {"laser_mse": mse.item()}

    def metrics(self, sums: dict, updates: int) -> dict:
        return {"train/laser_mse": sums.get("laser_mse", 0.0) / max(updates, 1), "train/laser_c": self.c}

    # ---- the self-verification warm-up -------------------------------------------------------------
    def align_steps(self, batches: list[pa.Table], optimizer: torch.optim.Optimizer, nll_weight: float) -> dict:
        """One optimizer step per batch of the policy's own verifier-labelled samples: MSE between r
        and the label, plus `nll_weight` x the NLL of the correct samples (without it the shared
        weights forget the task). c is fixed from the first batch (as in RL) when left open."""
        from actors.sampling import token_logprobs

        lrn, dev = self.learner, self.learner.device
        key, sums = B.REWARD_PREFIX + self.label, {"mse": 0.0, "nll": 0.0}
        for table in batches:
            if "laser_logprob" not in table.schema.names:
                raise B.BatchError("self-verification batches need the generators' `laser_logprob` column")
            if self.c is None:  # fixed from the first batch, as in RL
                self.c = float(np.nanmean(table.column("laser_logprob").to_numpy(zero_copy_only=False)))
            label = torch.from_numpy(table.column(key).to_numpy(zero_copy_only=False).astype(np.float32))
            if torch.isnan(label).any():
                raise B.BatchError(f"self-verification batch has rows without a {key!r} label")
            ids, mask, positions, r_ids, r_mask, p_width = lrn._sequences(table)
            logits, tail = lrn._response_logits(lrn.model, ids, mask, positions, p_width, after=True)
            mse = ((self.self_reward(tail) - label.to(dev)) ** 2).mean()
            good = r_mask.to(dev).float() * (label >= 0.5).float().to(dev)[:, None]
            nll = -(token_logprobs(logits, r_ids.to(dev)) * good).sum() / good.sum().clamp(min=1)
            loss = mse + nll_weight * nll
            if not torch.isfinite(loss):
                raise FloatingPointError(f"self-verification loss is {float(loss)}; lower laser.warmup_lr")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            lrn.clip_grads(1.0)
            optimizer.step()
            sums["mse"] += mse.item()
            sums["nll"] += nll.item()
        n = max(len(batches), 1)
        return {"laser_warmup/mse": sums["mse"] / n, "laser_warmup/nll": sums["nll"] / n, "laser_warmup/c": self.c}
