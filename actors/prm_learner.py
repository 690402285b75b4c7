"""PRIME's implicit process reward model (Cui et al. 2025, "Process Reinforcement through Implicit
Rewards"): a causal LM pi_phi, initialised from the policy, and a frozen reference pi_ref. Each
response token gets the dense reward r_t = beta * (log pi_phi(y_t | ...) - log pi_ref(y_t | ...));
their sum is the implicit outcome reward, which is trained online with cross-entropy against the
verifier's outcome labels, using only the policy's rollouts. Following PRIME, each batch first
updates the PRM on its labels, then is scored by the updated PRM into `token_rewards`.
"""

from __future__ import annotations

import copy
import time

import numpy as np
import pyarrow as pa
import ray
import torch
import torch.nn.functional as F

from actors import batch as B
from actors.trainable import Trainable, adamw


class ImplicitPRM(Trainable):
    def __init__(self, config, model_source: str, reference_source: str | None = None, role: dict | None = None, *,
                 beta: float, lr: float, label: str, threshold: float):
        """`beta`: r_t = beta * log(pi_phi / pi_ref); `lr`: the PRM's learning rate; `label`: the
        verifier source whose outcome labels it learns, a response counting as correct at `threshold`
        or above (the recipe's role arguments: pipelines/prime.py)."""
        from actors import modeling

        self._setup(config, role, seed_offset=13)
        self.beta = beta
        self.label_source = label
        self.threshold = threshold
        attn = config.model.attn_implementation
        self.model = modeling.load_model(model_source, attn=attn).to(self.device).train()
        self.tokenizer = modeling.load_tokenizer(model_source)
        self._engine_setup()
        ref = modeling.load_model(reference_source, attn=attn) if reference_source else copy.deepcopy(self.model)
        self.reference = ref.to(self.device, self.frozen_dtype()).eval().requires_grad_(False)
        self.optimizer = adamw(self.model.parameters(), lr=lr)
        self.micro = config.algorithm.micro_batch_size

    def _implicit(self, model, seq, rows, groups) -> torch.Tensor:
        ids, mask, positions, r_ids, _, p_width = seq
        return self._token_logprobs(model, ids[rows], mask[rows], positions[rows], r_ids[rows], p_width,
                                    groups=groups[rows])

    @ray.method(num_returns=2)
    def update_and_score(self, *tables: pa.Table) -> tuple[pa.Table, dict]:
        """Cross-entropy step on the labelled rows, then dense rewards for every row."""
        start = time.perf_counter()
        table = B.concat(list(tables))
        seq = self._sequences(table)
        r_mask = seq[4].float()
        label = table.column(B.REWARD_PREFIX + self.label_source).to_numpy(zero_copy_only=False).astype(np.float64)
        labelled = torch.from_numpy(~np.isnan(label))
        target = torch.from_numpy(np.nan_to_num(label) >= self.threshold).float()
        rows = torch.arange(table.num_rows)
        groups = torch.from_numpy(B.group_index(table))
        with torch.no_grad():
            ref = torch.cat([self._implicit(self.reference, seq, mb, groups) for mb in rows.split(self.micro)])
        info = {"prm/labelled": int(labelled.sum())}
        lab_rows = rows[labelled]
        if len(lab_rows):
            self.optimizer.zero_grad(set_to_none=True)
            sums = {"right": 0.0, "loss": 0.0}
            # this rank's labelled rows, by whole groups; the mean is over every rank's (actors.distributed)
            own = self.ranks.shard(lab_rows, groups, r_mask.sum(1) + seq[5])
            for mb, real in self.ranks.micro_batches(own, self.micro, lab_rows):
                logp = self._implicit(self.model, seq, mb, groups)
                outcome = self.beta * ((logp - ref[mb]) * r_mask[mb]).sum(1)
                loss = F.binary_cross_entropy_with_logits(outcome, target[mb], reduction="sum") / len(lab_rows)
                (loss * self.ranks.world_size * real).backward()
                if real:
                    sums["loss"] += loss.item() * len(lab_rows)
                    sums["right"] += int(((outcome > 0).float() == target[mb]).sum())
            sums = self.ranks.sum(sums)
            right, total_loss = sums["right"], sums["loss"]
            self.clip_grads(1.0)
            self.optimizer.step()
            self.version += 1
            info.update({"prm/loss": total_loss / len(lab_rows), "prm/accuracy_before": right / len(lab_rows)})
        with torch.no_grad():
            logp = torch.cat([self._implicit(self.model, seq, mb, groups) for mb in rows.split(self.micro)])
        dense = (self.beta * (logp - ref) * r_mask).cpu()
        lengths = r_mask.sum(1).long().numpy()
        flat = dense[r_mask.bool()].numpy().astype(np.float32)
        table = B.replace_column(table, "token_rewards", B.list_column(flat, lengths, pa.float32()))
        outcome = dense.sum(1).numpy()
        info.update({"prm/version": self.version, "prm/implicit_reward_mean": float(outcome.mean()),
                     "prm/token_reward_abs_mean": float(dense.abs().sum() / max(r_mask.sum(), 1)),
                     "busy_s": time.perf_counter() - start})
        return B.with_version(table), info


ImplicitPRMActor = ray.remote(ImplicitPRM)
