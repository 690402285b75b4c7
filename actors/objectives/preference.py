"""Preference optimisation on (prompt, chosen, rejected) pairs: a pairwise loss from the registry
(dpo, ipo, simpo, ...) against the learner's frozen reference, optionally plus the chosen responses'
NLL (RPO), or `raft`: supervised fine-tuning on the chosen responses. One optimizer step a call.
Given labelled samples (`examples`), the learner's other objectives that ride along a step by
themselves (`rides_alone`: self_judge) add their loss to the same step."""

from __future__ import annotations

import logging

import pyarrow as pa
import torch

from actors import batch as B
from actors.objectives import OBJECTIVES, Objective

log = logging.getLogger("coevo.learner")


@OBJECTIVES.register("preference")
class Preference(Objective):
    name = "preference"
    columns = ("prompt", "chosen", "rejected")

    def step(self, pairs: pa.Table, loss: str = "dpo", params: dict | None = None, nll_weight: float = 0.0,
             examples: pa.Table | None = None) -> dict:
        from actors.algorithms import PREFERENCE_LOSSES
        from actors.algorithms.preference import sft_nll

        lrn = self.learner
        B.validate_pairs(pairs)
        n = pairs.num_rows
        prompts = lrn._tokenize(pairs.column("prompt").to_pylist())
        responses = lrn._tokenize(pairs.column("chosen").to_pylist() + pairs.column("rejected").to_pylist(), eos=True)
        table = pa.table({"prompt_ids": pa.concat_arrays([prompts, prompts]), "response_ids": responses})
        ids, mask, positions, r_ids, r_mask, p_width = lrn._sequences(table)
        m = r_mask.to(lrn.device).float()
        logp = lrn._token_logprobs(lrn.model, ids, mask, positions, r_ids, p_width)
        if loss == "raft":
            total, stats = sft_nll(logp[:n], m[:n]), {}
        else:
            if lrn.reference is None and loss != "simpo":
                raise RuntimeError(f"preference loss {loss!r} needs a reference: call snapshot_reference first")
            seq, lengths = (logp * m).sum(1), m.sum(1)
            ref = None
            if lrn.reference is not None:
                with torch.no_grad():
                    ref = (lrn._token_logprobs(lrn.reference, ids, mask, positions, r_ids, p_width) * m).sum(1)
            total, stats = PREFERENCE_LOSSES.get(loss)(
                chosen_logps=seq[:n], rejected_logps=seq[n:], chosen_lengths=lengths[:n], rejected_lengths=lengths[n:],
                ref_chosen_logps=None if ref is None else ref[:n], ref_rejected_logps=None if ref is None else ref[n:],
                **(params or {}))
            if nll_weight:
                nll = sft_nll(logp[:n], m[:n])
                total, stats = total + nll_weight * nll, {**stats, "chosen_nll": nll.detach()}
        lrn.optimizer.zero_grad(set_to_none=True)
        if not torch.isfinite(total):
            lrn.skipped_steps += 1
            log.warning("non-finite preference loss %s: step skipped", float(total))
            return {"version": lrn.version, "pref/step_skipped": 1.0}
        total.backward()
        riders = self.riders(examples)
        for rider in riders:
            rider.prepare(examples, {})
            rider.begin({}, torch.arange(n))
        grad_norm = lrn.clip_grads(lrn.algo.grad_clip)
        lrn.optimizer.step()
        lrn.version += 1
        out = {"version": lrn.version, "pref/loss": total.item(), "pref/pairs": n, "train/grad_norm": float(grad_norm)}
        out.update({f"pref/{k}": float(v) for k, v in stats.items()})
        for rider in riders:
            out.update(rider.metrics({}, 1))
        return out

    def riders(self, examples: pa.Table | None) -> list[Objective]:
        """The objectives that train on `examples` in this step: those whose columns it has and whose
        loss needs no forward pass of the step's own (`begin` alone: not the RL step's riders)."""
        if examples is None:
            return []
        return [o for o in self.learner.objectives.values()
                if o is not self and o.rides_alone
                and all(c in examples.schema.names for c in o.columns)]
