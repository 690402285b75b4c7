"""The critic's objective: a value head (one linear layer) on the hosting learner's model, which has
the policy's architecture, predicting a value per response token; trained with the clipped value
loss against given returns (actors/algorithms/value.py). Recipe ppo hosts it in its critic role and
calls `values_of` before its credit step (GAE, which writes the `returns`) and `step` after it,
through the learner's `call_objective`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from actors import batch as B
from actors.algorithms.value import clipped_value_loss
from actors.objectives import OBJECTIVES, Objective

VALUE_HEAD_FILE = "value_head.pt"  # beside the body, so a critic built from the saved model keeps its head


@OBJECTIVES.register("value")
class Value(Objective):
    name = "value"
    columns = ("prompt_ids", "response_ids", "returns", "old_values")  # returns, old values: one per token

    def __init__(self, learner, clip_eps: float = 0.2):
        super().__init__(learner)
        if not clip_eps > 0:
            raise ValueError(f"value objective: clip_eps must be > 0, got {clip_eps!r}")
        self.clip_eps = clip_eps
        self.head = torch.nn.Linear(learner.model.config.hidden_size, 1).to(learner.device)
        torch.nn.init.zeros_(self.head.weight)  # values start at 0: no draw from the global RNG
        torch.nn.init.zeros_(self.head.bias)
        source = learner.model_source
        if source and (Path(source) / VALUE_HEAD_FILE).is_file():
            self.head.load_state_dict(torch.load(Path(source) / VALUE_HEAD_FILE, weights_only=True))

    def parameters(self) -> list[torch.nn.Parameter]:
        return list(self.head.parameters())

    def state_dict(self) -> dict:
        return {"value_head": self.head.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if "value_head" in state:
            self.head.load_state_dict(state["value_head"])

    def save(self, out: Path) -> None:
        torch.save(self.head.state_dict(), out / VALUE_HEAD_FILE)

    def values(self, ids, mask, positions, p_width: int) -> torch.Tensor:
        """V(prefix) [B, T_response] for the state before each response token: the last hidden state
        where the policy's logits for that token would come from."""
        lrn = self.learner
        body = lrn.model.base_model  # the transformer without its LM head
        dev = lrn.device
        hidden = body(input_ids=ids[:, :-1].to(dev), attention_mask=mask[:, :-1].to(dev),
                      position_ids=positions[:, :-1].to(dev)).last_hidden_state
        return self.head(hidden[:, p_width - 1:].float()).squeeze(-1)

    def tensors(self, table: pa.Table) -> dict:
        """Padded sequences, returns and old values; a per-token column whose length differs from the
        row's response is an error naming the column and row."""
        self.require(table)
        data = dict(zip(("ids", "mask", "positions", "r_ids", "r_mask", "p_width"), self.learner._sequences(table)))
        n_tokens = B._lengths(table.column("response_ids"))
        for name in ("returns", "old_values"):
            lengths = B._lengths(table.column(name))
            bad = np.nonzero(lengths != n_tokens)[0]
            if len(bad):
                r = int(bad[0])
                raise B.BatchError(f"value objective: column {name!r} row {r} has {lengths[r]} values but "
                                   f"response_ids has {n_tokens[r]} tokens")
            data[name], _ = B.to_padded(table.column(name), 0.0, torch.float32)
        return data

    def loss(self, data: dict, mb: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """Micro-batch `mb`: the summed per-token loss over its response tokens (the caller divides by
        the update's token count) and its sums."""
        dev = self.learner.device
        m = data["r_mask"][mb].to(dev).float()
        v = self.values(data["ids"][mb], data["mask"][mb], data["positions"][mb], data["p_width"])
        loss, stats = clipped_value_loss(v, data["old_values"][mb].to(dev), data["returns"][mb].to(dev), self.clip_eps)
        sums = {"loss": (loss.detach() * m).sum().item(), "clip_frac": (stats["clip_frac"] * m).sum().item(),
                "value": (v.detach() * m).sum().item()}
        return (loss * m).sum(), sums

    def values_of(self, table: pa.Table) -> tuple[pa.Table, dict]:
        """The table with `old_values` at the critic's current version, and `{"version"}`."""
        return self.annotate(table), {"version": self.learner.version}

    @torch.no_grad()
    def annotate(self, table: pa.Table) -> pa.Table:
        """The table with `old_values`: the value of the state before every response token."""
        lrn = self.learner
        ids, mask, positions, _, r_mask, p_width = lrn._sequences(table)
        out = torch.cat([self.values(ids[mb], mask[mb], positions[mb], p_width).cpu()
                         for mb in torch.arange(table.num_rows).split(lrn.algo.micro_batch_size)])
        lengths = r_mask.sum(1).numpy()
        return B.replace_column(table, "old_values", B.list_column(out[r_mask].numpy(), lengths, pa.float32()))

    def step(self, *tables: pa.Table) -> dict[str, float]:
        """One optimizer step on the concatenated tables: the token-mean value loss over every response
        token, in micro-batches."""
        lrn = self.learner
        table = B.concat(list(tables))
        data = self.tensors(table)
        tokens = max(int(data["r_mask"].sum()), 1)
        lrn.optimizer.zero_grad(set_to_none=True)
        sums = {"loss": 0.0, "clip_frac": 0.0, "value": 0.0}
        rows = torch.arange(table.num_rows)
        # this rank's rows, by whole groups; times the world size, as the ranks' gradients are averaged
        keyed = "group_id" in table.schema.names or "prompt_id" in table.schema.names
        groups = torch.from_numpy(B.group_index(table)) if keyed else rows  # no groups: rows are split alone
        own = lrn.ranks.shard(rows, groups, data["r_mask"].sum(1) + data["p_width"])
        for mb, real in lrn.ranks.micro_batches(own, lrn.algo.micro_batch_size, rows):
            loss, part = self.loss(data, mb)
            total = loss / tokens
            if real and not torch.isfinite(total):
                raise FloatingPointError(f"value loss is {float(total)}; lower the learning rate")
            (total * lrn.ranks.world_size * real).backward()
            if real:
                sums = {k: sums[k] + part[k] for k in sums}
        sums = lrn.ranks.sum(sums)
        grad_norm = lrn.clip_grads(lrn.algo.grad_clip)
        lrn.optimizer.step()
        lrn.version += 1
        return {"version": lrn.version, "value/loss": sums["loss"] / tokens, "value/clip_frac": sums["clip_frac"] / tokens,
                "value/mean": sums["value"] / tokens, "train/grad_norm": float(grad_norm)}
