"""RL policy gradient: the policy loss (plus the KL to the reference and the entropy bonus) from the
algorithm registries, weighted per response token by the batch's `advantages` column, which the
credit step wrote on the driver (orchestrator/credit.py); `algorithm.mini_batches` optimizer steps.
Other hosted objectives ride along the same forward passes (LaSeR's self-reward MSE)."""

from __future__ import annotations

import contextlib
import logging
import time

import pyarrow as pa
import pyarrow.compute as pc
import torch

from actors import attention
from actors import batch as B
from actors.objectives import OBJECTIVES, Objective
from actors.objectives.rl_metrics import rl_metrics

log = logging.getLogger("coevo.learner")
SUMS = ("loss", "pg_loss", "kl", "clip_frac", "is_weight")


@OBJECTIVES.register("policy_gradient")
class PolicyGradient(Objective):
    """One row per sampled response with its per-token `advantages`; the learner's `algorithm`
    section picks the loss, the off-policy correction, the KL and the entropy terms."""

    name = "policy_gradient"
    columns = (*B.CORE_FIELDS, "advantages")

    def riders(self) -> list[Objective]:
        return [o for o in self.learner.objectives.values() if o is not self]

    def train_step(self, *tables: pa.Table, dump_path: str | None = None) -> dict[str, float]:
        lrn, algo = self.learner, self.learner.algo
        started = time.perf_counter()
        lrn.reset_peak_memory()
        table = B.concat(list(tables))
        B.validate(table)
        if "advantages" not in table.schema.names:
            raise B.BatchError("the policy_gradient objective trains on the per-token `advantages` column that "
                               "the credit step writes (orchestrator/credit.py: Credit.apply); the batch has "
                               f"{table.schema.names}")
        distinct = pc.count_distinct(table.column("uid")).as_py()
        if distinct != table.num_rows:  # exactly-once accounting
            raise B.BatchError(f"train batch has repeated uids: {table.num_rows} rows, {distinct} distinct")
        if "reward_model_version" in table.schema.names:  # one reward-model version per batch
            versions = pc.unique(table.column("reward_model_version")).to_pylist()
            if len(versions) > 1:
                raise B.BatchError(f"train batch mixes reward-model versions {sorted(versions)}")
        groups = torch.from_numpy(B.group_index(table))
        old_lp, _ = B.to_padded(table.column("behavior_logprobs"), 0.0, torch.float32)
        ids, mask, positions, r_ids, r_mask, p_width = lrn._sequences(table)
        # the tokens that train: every response token, or in multi-turn episodes the policy's only
        # (r_mask stays the layout: which tokens exist, packed or padded)
        l_mask = B.loss_mask(table) if "loss_mask" in table.schema.names else r_mask
        adv, _ = B.to_padded(table.column("advantages"), 0.0, torch.float32, width=r_mask.shape[1])
        active = torch.ones(table.num_rows, dtype=torch.bool)
        if "reward_mask" in table.schema.names:  # e.g. Parrot selection: dominated samples do not train
            active &= torch.from_numpy(table.column("reward_mask").to_numpy(zero_copy_only=False).astype(bool))
        data = dict(ids=ids, mask=mask, positions=positions, r_ids=r_ids, r_mask=r_mask, l_mask=l_mask, old_lp=old_lp,
                    adv=adv, groups=groups, p_width=p_width)
        # Rows whose advantage is 0 at every token carry no policy gradient; without a KL term their
        # forward/backward is wasted work. The token-mean still counts their tokens (unchanged update).
        needed = active & ((adv != 0) & l_mask).any(dim=1)
        if not (algo.skip_uniform_groups and lrn.reference is None and algo.entropy_coef == 0):
            needed = active
        for rider in self.riders():
            rows = rider.prepare(table, data)
            if rows is not None:
                needed = needed | rows
        n = table.num_rows
        gen = torch.Generator().manual_seed(hash((lrn.config.seed, lrn.version)) % 2**63)
        order = torch.randperm(n, generator=gen) if algo.mini_batches > 1 else torch.arange(n)
        updates = torch.tensor_split(order, min(algo.mini_batches, n))
        # each rank's rows of each update: whole groups, balanced by tokens (actors.distributed)
        cost = r_mask.sum(1) + p_width
        mine = [lrn.ranks.shard(rows[needed[rows]], groups, cost) for rows in updates]
        data["prox"] = self._proximal(data, mine, updates)
        sums = {k: 0.0 for k in SUMS}
        norms, skipped, computed = [], 0, 0
        for rows, own in zip(updates, mine):
            ok, norm, done = self._update(rows, own, needed, data, sums)
            norms.append(norm)
            skipped += not ok
            computed += done
        lrn.version += 1
        if dump_path:  # the batch as trained, advantages included
            B.dump_parquet(table, dump_path)
        out = rl_metrics(lrn, table, groups, sums, old_lp, l_mask, norms, skipped)
        for rider in self.riders():
            out.update(rider.metrics(sums, len(norms)))
        out["train/rows_computed_frac"] = computed / max(n, 1)
        elapsed = time.perf_counter() - started
        out["time/learner_s"] = elapsed  # inside the learner, without the call
        out.update(lrn.perf_metrics(sums.get("work_tokens", 0.0), sums.get("work_sq", 0.0), elapsed))
        lrn.release_cached_memory()
        return out

    def _proximal(self, d: dict, mine: list[torch.Tensor], updates: list[torch.Tensor]) -> torch.Tensor | None:
        """Log-probs of the current weights before this step's updates (decoupled PPO's proximal
        policy), computed without gradients for the rows this rank trains."""
        lrn = self.learner
        if lrn.algo.off_policy != "decoupled_ppo":
            return None
        prox = torch.zeros_like(d["old_lp"])
        rows = torch.cat(mine)
        with torch.no_grad():
            for mb, real in lrn.ranks.micro_batches(lrn.plan_micro_batches(rows, d), None, torch.cat(updates)):
                lp = self._forward(lrn.model, d, mb)["logp"].cpu()
                if real:
                    prox[mb] = lp
        return prox

    def _forward(self, model, d: dict, mb: torch.Tensor, entropy: bool = False, tail: bool = False) -> dict:
        """Rows `mb`: response log-probs [n, R] under the sampling distribution (with `entropy`, its
        entropy; with `tail`, the logits after each response), packed or padded (learner.packing);
        `tokens` and `sq` for the FLOP count."""
        from actors.sampling import token_entropy, token_logprobs

        lrn = self.learner
        if lrn.packing:
            return lrn._packed_stats(model, d, mb, entropy=entropy, tail=tail)
        out = lrn._response_logits(model, d["ids"][mb], d["mask"][mb], d["positions"][mb], d["p_width"],
                                   groups=d["groups"][mb], after=tail)
        logits, tail_logits = out if tail else (out, None)
        stats = {"logp": token_logprobs(logits, d["r_ids"][mb].to(lrn.device), **lrn.sampling), "tail": tail_logits}
        if entropy:
            stats["entropy"] = token_entropy(logits, **lrn.sampling)
        # prompt tokens once per group (the shared-prompt forward), each response's own
        lengths = d["mask"][mb].sum(1)
        p_len = lengths - d["r_mask"][mb].sum(1)
        groups, inverse = torch.unique(d["groups"][mb], return_inverse=True)
        prompts = torch.zeros(len(groups), dtype=p_len.dtype).scatter_(0, inverse, p_len)  # one per group
        stats["tokens"] = int(d["r_mask"][mb].sum() + prompts.sum())
        stats["sq"] = float((lengths.double() ** 2).sum())
        return stats

    def _loss(self, logp, old_lp, adv, prox, mask):
        """The policy loss under the off-policy correction (any loss composes with any correction)."""
        from actors.algorithms import OFF_POLICY, POLICY_LOSSES
        from actors.algorithms.losses import corrected

        a = self.learner.algo
        extra = {} if a.clip_eps_high is None else {"clip_eps_high": a.clip_eps_high}
        return corrected(POLICY_LOSSES.get(a.policy_loss), OFF_POLICY.get(a.off_policy or "none"), logp, old_lp, adv,
                         proximal_logprobs=prox, is_cap=a.is_cap, clip_eps=a.clip_eps, mask=mask, **extra,
                         **a.loss_params)

    def _row_weights(self, rows: torch.Tensor, r_mask: torch.Tensor) -> torch.Tensor:
        """Each row's weight on its summed token losses, so that the update's loss is aggregated as
        `algorithm.loss_agg` says. Normalisers come from the whole update (every rank's rows), so N
        ranks compute what one does."""
        lengths = r_mask.sum(1).double()
        n = len(rows)
        mode = self.learner.algo.aggregation()
        if mode == "token_mean":
            w = torch.full_like(lengths, 1.0 / max(float(lengths[rows].sum()), 1.0))
        elif mode == "seq_mean_token_mean":
            w = 1.0 / (lengths.clamp(min=1) * n)
        elif mode == "seq_mean_token_sum":
            w = torch.full_like(lengths, 1.0 / n)
        else:  # seq_sum_constant
            w = torch.full_like(lengths, 1.0 / (n * self.learner.config.rollout.max_new_tokens))
        return w.float()

    def _update(self, rows: torch.Tensor, own: torch.Tensor, needed: torch.Tensor, d: dict,
                sums: dict) -> tuple[bool, float, int]:
        """One optimizer step on `rows`: their loss aggregated as `algorithm.loss_agg` says, in micro-batches
        over the rows that need a forward pass (`own`: this rank's share of them). A non-finite loss
        or gradient skips the step (counted, warned) instead of poisoning the weights."""
        from actors.algorithms import KL_ESTIMATORS

        lrn, dev, p_width = self.learner, self.learner.device, d["p_width"]
        kl_estimator = KL_ESTIMATORS.get(lrn.algo.kl_estimator)
        row_w = self._row_weights(rows, d["l_mask"])
        # Zeros, not None: AdamW skips a parameter whose grad is None, but a zero gradient still moves
        # it through momentum, which is what the same update without skipped rows would do.
        lrn.optimizer.zero_grad(set_to_none=False)
        for param in lrn.trained_parameters():  # a fresh or just-restored process has None grads
            if param.grad is None and param.requires_grad:
                param.grad = torch.zeros_like(param)
        part = {k: 0.0 for k in sums} | {"work_tokens": 0.0, "work_sq": 0.0}
        if lrn.algo.entropy_coef > 0:  # every rank reduces the same keys
            part["entropy"] = 0.0
        # Sums stay on the device (in float64, as Python floats summed them) and are read once after
        # the loop: no host synchronisation inside it, so the next micro-batch is queued while the
        # device still runs this one.
        acc: dict[str, torch.Tensor] = {}

        def add(key: str, value: torch.Tensor) -> None:
            value = value.detach().double()
            acc[key] = acc[key] + value if key in acc else value

        nonfinite = torch.zeros((), dtype=torch.bool, device=dev)
        compute = rows[needed[rows]]
        riders = self.riders()
        after = any(r.needs_tail for r in riders)
        # times the world size: the ranks' gradients are averaged, and the sum is the whole update's
        scale = lrn.ranks.world_size
        for rider in riders:
            rider.begin(d, rows)
        # the packed kernel stays chosen over the backward passes too: activation checkpointing
        # recomputes layers there, and a recomputed layer looks its attention kernel up again
        with attention.packed(lrn.model) if lrn.packing else contextlib.nullcontext():
            for mb, real in lrn.ranks.micro_batches(lrn.plan_micro_batches(own, d), None, compute):
                m = d["l_mask"][mb].to(dev).float()  # the loss mask: policy tokens only
                fwd = self._forward(lrn.model, d, mb, entropy=lrn.algo.entropy_coef > 0, tail=after)
                logp, tail = fwd["logp"], fwd["tail"] if after else None
                if real:  # the FLOP count's inputs (summed over ranks with the other sums)
                    part["work_tokens"] += fwd["tokens"]
                    part["work_sq"] += fwd["sq"]
                pg, stats = self._loss(logp, d["old_lp"][mb].to(dev), d["adv"][mb].to(dev),
                                       None if d["prox"] is None else d["prox"][mb].to(dev), m)
                loss = pg
                if lrn.algo.entropy_coef > 0:  # a bonus on the sampling distribution's entropy
                    ent = fwd["entropy"]
                    loss = loss - lrn.algo.entropy_coef * ent
                    if real:
                        add("entropy", (ent * m).sum())
                terms = []
                for rider in riders:
                    term, rider_sums = rider.term(tail, d, mb)
                    if isinstance(term, torch.Tensor) or term:
                        terms.append(term)
                    for k, v in rider_sums.items():
                        part[k] = part.get(k, 0.0) + (v if real else 0.0)
                if lrn.reference is not None:
                    with torch.no_grad():
                        ref_lp = self._forward(lrn.reference, d, mb)["logp"]
                    kl = kl_estimator(logp, ref_lp)
                    loss = loss + lrn.algo.kl_coef * kl
                    if real:
                        add("kl", (kl * m).sum())
                total = (loss * m * row_w[mb].to(dev)[:, None]).sum()  # the update's aggregation (loss_agg)
                for term in terms:
                    total = total + term
                if not real:  # a ghost micro-batch (fsdp2): the collectives, no gradient, no sums
                    (total * 0).backward()
                    continue
                nonfinite |= ~torch.isfinite(total.detach())  # a poisoned gradient: the step is skipped
                (total * scale).backward()
                add("loss", (loss * m).sum())
                add("pg_loss", (pg * m).sum())
                add("clip_frac", (stats["clip_frac"] * m).sum())
                add("is_weight", (stats["is_weight"] * m).sum())
        if acc:  # one read for every sum
            for k, v in zip(acc, torch.stack(list(acc.values())).tolist()):
                part[k] += v
        finite = not bool(nonfinite)
        grad_norm = lrn.clip_grads(lrn.algo.grad_clip)
        finite = lrn.ranks.all(finite)
        if finite and torch.isfinite(grad_norm):
            lrn.optimizer.step()
        else:
            finite = False
            lrn.optimizer.zero_grad(set_to_none=True)
            lrn.skipped_steps += 1
            log.warning("non-finite loss or gradient (loss=%s, grad_norm=%s): step skipped (%d so far)",
                        part["loss"] / max(float(d["l_mask"][rows].sum()), 1.0), float(grad_norm), lrn.skipped_steps)
        part = lrn.ranks.sum(part)
        # rows that were not computed had is_weight 1 in effect
        part["is_weight"] += float(d["l_mask"][rows[~needed[rows]]].sum())
        for k, v in part.items():
            sums[k] = sums.get(k, 0.0) + v
        return finite, float(grad_norm), len(compute)
