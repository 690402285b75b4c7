"""LaSeR alignment: the policy's self-reward r = beta * (log pi(z | x, y) - c), the log-probability of
a fixed token z after its own response, fitted to the verifier's labels by MSE. It rides along the RL
step and has its own warm-up step (`align_steps`). Its settings come from the recipe's role spec
(pipelines/stages/laser.py: LaserConfig.objective). The offset c is not its state: the credit step
(orchestrator/credit.py, pipelines/laser_reward.py) fixes and checkpoints it and writes it into every
batch as the `laser_c` column, so r here is the r that rewarded the batch."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from actors import batch as B
from actors.objectives import OBJECTIVES, Objective


def draw_weights(right: torch.Tensor, accuracy: float) -> torch.Tensor:
    """Per-row weights that give the correct rows `accuracy` of the total weight and the wrong rows
    the rest, whatever the batch's own mix (a batch of one kind keeps weight 1)."""
    share = float(right.mean())
    if share in (0.0, 1.0):
        return torch.ones_like(right)
    return torch.where(right > 0, accuracy / share, (1 - accuracy) / (1 - share))


@OBJECTIVES.register("laser_align")
class LaserAlign(Objective):
    name = "laser_align"
    columns = ("laser_c",)
    needs_tail = True

    def __init__(self, learner, token: str = "Y", beta: float = 0.25, mse_weight: float = 1.0,
                 balance: bool = False, label: str | None = None):
        """`token`: z; `beta`: r's scale; `mse_weight`: the MSE's weight in the RL loss; `balance`:
        correct and wrong labelled samples weigh half each; `label`: the reward source r is aligned
        with (default: the first verifier function)."""
        from actors.judging import single_token

        super().__init__(learner)
        config = learner.config
        if not config.laser_rewards():
            raise ValueError("the laser_align objective needs a reward source with `laser: true` in the config")
        if not beta > 0 or not mse_weight >= 0:
            raise ValueError(f"laser_align needs beta > 0 and mse_weight >= 0, got beta={beta!r}, "
                             f"mse_weight={mse_weight!r}")
        fns = config.fn_rewards()
        self.label = label or (fns[0].name if fns else None)
        if self.label is None:
            raise ValueError("the laser_align objective aligns r with a verifier's labels: the config has no "
                             "verifier reward function (rewards[].fn) and no label source")
        self.beta, self.mse_weight, self.balance = beta, mse_weight, balance
        self.token = single_token(learner.tokenizer, token, "laser.token")
        self._c = None

    def offset(self, table: pa.Table) -> float:
        """The batch's c: the `laser_c` column the credit step wrote, one value for every row."""
        self.require(table)
        values = pc.unique(table.column("laser_c")).to_pylist()
        if len(values) != 1 or values[0] is None or not np.isfinite(values[0]):
            raise B.BatchError(f"column 'laser_c' must hold one finite value for the whole batch (the offset c "
                               f"of its self-reward), got {sorted(values, key=str)[:5]}")
        return values[0]

    def self_reward(self, tail: torch.Tensor, c: float) -> torch.Tensor:
        return self.beta * (torch.log_softmax(tail.float(), dim=-1)[:, self.token] - c)

    # ---- riding along the RL step ------------------------------------------------------------------
    def prepare(self, table: pa.Table, data: dict) -> torch.Tensor:
        self._c = self.offset(table)
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
        if not self.balance or not good or not bad:
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
        mse = (self._weight(target[ok]) * (self.self_reward(tail, self._c)[ok] - target[ok]) ** 2).sum()
        return self.mse_weight * mse, {"laser_mse": mse.item()}

    def metrics(self, sums: dict, updates: int) -> dict:
        return {"train/laser_mse": sums.get("laser_mse", 0.0) / max(updates, 1)}

    # ---- the self-verification warm-up -------------------------------------------------------------
    def align_steps(self, batches: list[pa.Table], lr: float, nll_weight: float, nll_on: str = "correct",
                    sample_accuracy: float | None = None) -> dict:
        """One optimizer step (the warm-ups' own AdamW at `lr`) per batch of the policy's own
        verifier-labelled samples: MSE between r and the label, plus `nll_weight` x the NLL of the
        correct samples (`nll_on="correct"`: without it the shared weights forget the task, and with
        it they also learn the task from the labels) or of every sample (`"all"`). A batch of
        (correct, wrong) pairs holds half correct samples, more than the policy draws, so "all"
        weighs each kind by its share of the draw, `sample_accuracy` (the batch's own mix where
        None): the NLL is then the policy's own samples' in expectation, label-blind, and holds the
        policy where it was instead of teaching it from the labels (measured on sorting: at
        `laser.warmup_nll` 1 the pairs' plain NLL took held-out accuracy 0.45 -> 0.64-0.725). The
        warm-up runs alone, so it takes every core even where async training shares them with
        generators."""
        from actors.runtime import torch_threads
        from actors.sampling import token_logprobs

        lrn, dev = self.learner, self.learner.device
        optimizer = lrn.warmup_optimizer(lr)
        key, sums = B.REWARD_PREFIX + self.label, {"mse": 0.0, "nll": 0.0}
        with torch_threads(lrn.alone_threads):
            for table in batches:
                c = self.offset(table)
                label = torch.from_numpy(table.column(key).to_numpy(zero_copy_only=False).astype(np.float32))
                if torch.isnan(label).any():
                    raise B.BatchError(f"self-verification batch has rows without a {key!r} label")
                ids, mask, positions, r_ids, r_mask, p_width = lrn._sequences(table)
                logits, tail = lrn._response_logits(lrn.model, ids, mask, positions, p_width, after=True)
                mse = ((self.self_reward(tail, c) - label.to(dev)) ** 2).mean()
                good = r_mask.to(dev).float()
                right = (label >= 0.5).float().to(dev)
                if nll_on == "correct":
                    good = good * right[:, None]
                elif sample_accuracy is not None:  # "all": each kind at its share of the draw
                    good = good * draw_weights(right, sample_accuracy)[:, None]
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
        return {"laser_warmup/mse": sums["mse"] / n, "laser_warmup/nll": sums["nll"] / n}
