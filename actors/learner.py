"""Policy learner actor: owns the policy and its optimizer; aggregates rewards, computes advantages
and losses from the registries, takes gradient steps and publishes versioned weights."""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray
import torch

from actors import batch as B
from actors.trainable import Trainable, adamw, clip_grad_norm

log = logging.getLogger("coevo.learner")
REFERENCE_DIR = "reference"
LASER_FILE = "laser.json"  # LaSeR's offset c, next to the model whose r it belongs to


class Learner(Trainable):
    def __init__(self, config, model_source: str | None = None, role: dict | None = None):
        from actors import modeling
        from actors.rewards.aggregate import Aggregator

        self._setup(config, role)
        self.algo = config.algorithm
        self.sampling = dict(temperature=config.rollout.temperature, top_k=config.rollout.top_k,
                             top_p=config.rollout.top_p)
        self.model, self.tokenizer = modeling.build(config.model, config.seed)
        if model_source:
            self.model = modeling.load_model(model_source)
        self.model.to(self.device).train()
        self.reference = None
        if self.algo.kl_coef > 0:  # frozen copy of the starting policy (replaced on resume)
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.optimizer = self._new_optimizer(self.algo.lr)
        self.aggregator = Aggregator(config.aggregate_spec(), sources=[r.name for r in config.rewards])
        self.skipped_steps = 0
        self.laser_label = config.label_source(config.laser) if config.laser_rewards() else None
        self.laser_c = config.laser.c
        if self.laser_c is None and model_source and (Path(model_source) / LASER_FILE).is_file():
            # a model whose r was aligned (LaSeR's warm-up) keeps the offset it was aligned with
            self.laser_c = json.loads((Path(model_source) / LASER_FILE).read_text())["c"]
        if self.laser_label is not None:
            from actors.judging import single_token
            self.laser_token = single_token(self.tokenizer, config.laser.token, "laser.token")

    def _new_optimizer(self, lr: float) -> torch.optim.Optimizer:
        return adamw(self.model.parameters(), lr=lr, weight_decay=self.algo.weight_decay)

    # ---- checkpoints -----------------------------------------------------------------------------
    def save(self, path: str, optimizer: bool = True) -> str:
        out = super().save(path, optimizer)
        if self.laser_label is not None and self.config.laser.c is None and self.laser_c is not None:
            # a c learned from the data (not a configured one): a run from this model must keep it
            (Path(out) / LASER_FILE).write_text(json.dumps({"c": self.laser_c}))
        if optimizer and getattr(self, "_reference_moves", False):
            self.reference.save_pretrained(Path(out) / REFERENCE_DIR)
        return out

    def restore(self, path: str) -> int:
        version = super().restore(path)
        if (Path(path) / REFERENCE_DIR / "config.json").is_file():
            self.load_reference(str(Path(path) / REFERENCE_DIR))
            self._reference_moves = True
        return version

    def extra_state(self) -> dict:
        return {"aggregator": self.aggregator.state_dict(), "skipped_steps": self.skipped_steps,
                "laser_c": self.laser_c}

    def load_extra_state(self, state: dict) -> None:
        self.aggregator.load_state_dict(state.get("aggregator", {}))
        self.skipped_steps = state.get("skipped_steps", 0)
        self.laser_c = state.get("laser_c", self.laser_c)

    def reset_optimizer(self) -> None:
        """A fresh AdamW for RL after warm-up (its own learning rate, no carried-over moments)."""
        self.optimizer = self._new_optimizer(self.algo.lr)
        if self.algo.kl_coef > 0:  # the reference is the policy RL starts from
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)

    # ---- RL step ---------------------------------------------------------------------------------
    def train_step(self, *tables: pa.Table, dump_path: str | None = None) -> dict[str, float]:
        """`algorithm.mini_batches` optimizer steps on the concatenated batches (one row per sampled
        response). Returns metrics, with `version` the learner's version after the update."""
        from actors.algorithms import ADVANTAGES
        from actors.algorithms.advantages import combine_advantages, process_advantages

        started = time.perf_counter()
        table = B.concat(list(tables))
        B.validate(table)
        distinct = pc.count_distinct(table.column("uid")).as_py()
        if distinct != table.num_rows:  # exactly-once accounting
            raise B.BatchError(f"train batch has repeated uids: {table.num_rows} rows, {distinct} distinct")
        if "reward_model_version" in table.schema.names:  # one reward-model version per batch
            versions = pc.unique(table.column("reward_model_version")).to_pylist()
            if len(versions) > 1:
                raise B.BatchError(f"train batch mixes reward-model versions {sorted(versions)}")
        table = self._laser_rewards(table)
        table, reward_metrics = self.aggregator.apply(table)
        rewards = torch.from_numpy(table.column("reward").to_numpy().astype(np.float32))
        groups = torch.from_numpy(B.group_index(table))
        estimator = ADVANTAGES.get(self.algo.advantage)
        outcome = estimator(rewards, groups)
        old_lp, _ = B.to_padded(table.column("behavior_logprobs"), 0.0, torch.float32)
        ids, mask, positions, r_ids, r_mask, p_width = self._sequences(table)
        adv = outcome[:, None].expand_as(old_lp).clone()
        if "token_rewards" in table.schema.names:  # dense (process) rewards: per-token advantages
            dense, _ = B.to_padded(table.column("token_rewards"), 0.0, torch.float32)
            process = process_advantages(dense, r_mask.float(), groups)
            adv = combine_advantages(outcome, self.config.prime.process_weight * process, r_mask.float())
        active = torch.ones(table.num_rows, dtype=torch.bool)
        if "reward_mask" in table.schema.names:  # e.g. Parrot selection: dominated samples do not train
            active &= torch.from_numpy(table.column("reward_mask").to_numpy(zero_copy_only=False).astype(bool))
            adv = adv * active[:, None]
        data = dict(ids=ids, mask=mask, positions=positions, r_ids=r_ids, r_mask=r_mask, old_lp=old_lp, adv=adv,
                    groups=groups)
        # Rows whose advantage is 0 at every token carry no policy gradient; without a KL term their
        # forward/backward is wasted work. The token-mean still counts their tokens (unchanged update).
        needed = active & ((adv != 0) & r_mask).any(dim=1)
        if not (self.algo.skip_uniform_groups and self.reference is None):
            needed = active
        if self.laser_label is not None:  # LaSeR: align the self-reward with the verifier's labels
            label = table.column(B.REWARD_PREFIX + self.laser_label).to_numpy(zero_copy_only=False).astype(np.float32)
            data["laser_label"] = torch.from_numpy(label)
            needed = needed | ~torch.isnan(data["laser_label"])
        prox = self._proximal(data, needed, p_width)

        n = table.num_rows
        gen = torch.Generator().manual_seed(hash((self.config.seed, self.version)) % 2**63)
        order = torch.randperm(n, generator=gen) if self.algo.mini_batches > 1 else torch.arange(n)
        sums = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "is_weight": 0.0, "laser_mse": 0.0}
        norms, skipped, computed = [], 0, 0
        for rows in torch.tensor_split(order, min(self.algo.mini_batches, n)):
            ok, norm, done = self._update(rows, needed, data, prox, p_width, sums)
            norms.append(norm)
            skipped += not ok
            computed += done
        self.version += 1
        n_tokens = int(r_mask.sum())
        if dump_path:
            lengths = r_mask.sum(1).numpy()
            flat = adv[r_mask].numpy()
            B.dump_parquet(table.append_column("advantages", B.list_column(flat, lengths, pa.float32())), dump_path)
        out = self._metrics(table, rewards, groups, outcome, sums, n_tokens, old_lp, r_mask, norms, skipped)
        out.update(reward_metrics)
        out["train/rows_computed_frac"] = computed / max(n, 1)
        out["time/learner_s"] = time.perf_counter() - started  # inside the learner, without the call
        return out

    def _laser_rewards(self, table: pa.Table) -> pa.Table:
        """LaSeR's self-reward r = beta * (log pi(z | x, y) - c) from the generator's log-probs; c is
        fixed from the first batch when the config leaves it open."""
        if self.laser_label is None:
            return table
        if "laser_logprob" not in table.schema.names:
            raise B.BatchError("a laser reward source needs the generators' `laser_logprob` column")
        lp = table.column("laser_logprob").to_numpy(zero_copy_only=False).astype(np.float64)
        if self.laser_c is None:
            self.laser_c = float(np.nanmean(lp))
        r = (self.config.laser.beta * (lp - self.laser_c)).astype(np.float32)
        for spec in self.config.laser_rewards():
            table = B.replace_column(table, B.REWARD_PREFIX + spec.name, pa.array(r, pa.float32(), mask=np.isnan(r)))
        return table

    def _laser_class_weights(self, labels: torch.Tensor):
        """Per-sample weights of LaSeR's MSE over one update's labelled samples, summing to 1: equal
        per sample, or with `laser.balance` each class (correct, wrong) half of the total, so that an
        accurate policy's few wrong samples are not drowned out (LaSeR's class-level re-weighting)."""
        labels = labels[~torch.isnan(labels)]
        good = int((labels >= 0.5).sum())
        bad = len(labels) - good
        if not self.config.laser.balance or not good or not bad:
            return lambda t: torch.full_like(t, 1.0 / len(labels))
        return lambda t: torch.where(t >= 0.5, 0.5 / good, 0.5 / bad)

    def _proximal(self, d: dict, needed: torch.Tensor, p_width: int) -> torch.Tensor | None:
        """Log-probs of the current weights before this step's updates (decoupled PPO's proximal
        policy), computed without gradients for the rows that train."""
        if self.algo.off_policy != "decoupled_ppo":
            return None
        prox = torch.zeros_like(d["old_lp"])
        rows = torch.nonzero(needed).squeeze(1)
        with torch.no_grad():
            for mb in (rows.split(self.algo.micro_batch_size) if len(rows) else ()):
                prox[mb] = self._token_logprobs(self.model, d["ids"][mb], d["mask"][mb], d["positions"][mb],
                                                d["r_ids"][mb], p_width, groups=d["groups"][mb], **self.sampling).cpu()
        return prox

    def _loss(self, logp, old_lp, adv, prox):
        from actors.algorithms import OFF_POLICY, POLICY_LOSSES

        a = self.algo
        if a.off_policy in (None, "none"):
            extra = {} if a.clip_eps_high is None else {"clip_eps_high": a.clip_eps_high}
            loss, stats = POLICY_LOSSES.get(a.policy_loss)(logp, old_lp, adv, clip_eps=a.clip_eps, **extra)
            stats.setdefault("is_weight", torch.ones_like(logp))
            return loss, stats
        return OFF_POLICY.get(a.off_policy)(logp, old_lp, adv, proximal_logprobs=prox, clip_eps=a.clip_eps,
                                            clip_eps_high=a.clip_eps_high, is_cap=a.is_cap)

    def _update(self, rows: torch.Tensor, needed: torch.Tensor, d: dict, prox, p_width: int,
                sums: dict) -> tuple[bool, float, int]:
        """One optimizer step on `rows`: token-mean over all their response tokens, in micro-batches
        over the rows that need a forward pass. A non-finite loss or gradient skips the step
        (counted, warned) instead of poisoning the weights."""
        from actors.algorithms.losses import kl_k3
        from actors.sampling import token_logprobs

        tokens = max(int(d["r_mask"][rows].sum()), 1)
        # Zeros, not None: AdamW skips a parameter whose grad is None, but a zero gradient still moves
        # it through momentum, which is what the same update without skipped rows would do.
        self.optimizer.zero_grad(set_to_none=False)
        for param in self.model.parameters():  # a fresh or just-restored process has None grads
            if param.grad is None and param.requires_grad:
                param.grad = torch.zeros_like(param)
        part = {k: 0.0 for k in sums}
        finite = True
        compute = rows[needed[rows]]
        labelled = int((~torch.isnan(d["laser_label"][rows])).sum()) if "laser_label" in d else 0
        if labelled:
            class_weight = self._laser_class_weights(d["laser_label"][rows])
        for mb in (compute.split(self.algo.micro_batch_size) if len(compute) else ()):
            m = d["r_mask"][mb].to(self.device).float()
            out = self._response_logits(self.model, d["ids"][mb], d["mask"][mb], d["positions"][mb], p_width,
                                        groups=d["groups"][mb], after="laser_label" in d)
            logits, tail = out if "laser_label" in d else (out, None)
            logp = token_logprobs(logits, d["r_ids"][mb].to(self.device), **self.sampling)
            pg, stats = self._loss(logp, d["old_lp"][mb].to(self.device), d["adv"][mb].to(self.device),
                                   None if prox is None else prox[mb].to(self.device))
            loss = pg
            extra = 0.0
            if tail is not None and labelled:  # LaSeR's MSE, a mean over the update's labelled samples
                cfg = self.config.laser
                r = cfg.beta * (torch.log_softmax(tail.float(), dim=-1)[:, self.laser_token] - self.laser_c)
                target = d["laser_label"][mb].to(self.device)
                ok = ~torch.isnan(target)
                mse = (class_weight(target[ok]) * (r[ok] - target[ok]) ** 2).sum()
                extra = cfg.mse_weight * mse
                part["laser_mse"] += mse.item()
            if self.reference is not None:
                with torch.no_grad():
                    ref_lp = self._token_logprobs(self.reference, d["ids"][mb], d["mask"][mb], d["positions"][mb],
                                                  d["r_ids"][mb], p_width, groups=d["groups"][mb], **self.sampling)
                kl = kl_k3(logp, ref_lp)
                loss = loss + self.algo.kl_coef * kl
                part["kl"] += (kl.detach() * m).sum().item()
            total = (loss * m).sum() / tokens + extra  # each micro-batch divides by the update's token count
            if not torch.isfinite(total):
                finite = False
                break
            total.backward()
            with torch.no_grad():
                part["loss"] += (loss * m).sum().item()
                part["pg_loss"] += (pg * m).sum().item()
                part["clip_frac"] += (stats["clip_frac"] * m).sum().item()
                part["is_weight"] += (stats["is_weight"] * m).sum().item()
        grad_norm = clip_grad_norm(self.model, self.algo.grad_clip)
        if finite and torch.isfinite(grad_norm):
            self.optimizer.step()
        else:
            finite = False
            self.optimizer.zero_grad(set_to_none=True)
            self.skipped_steps += 1
            log.warning("non-finite loss or gradient (loss=%s, grad_norm=%s): step skipped (%d so far)",
                        part["loss"] / tokens, float(grad_norm), self.skipped_steps)
        # rows that were not computed had is_weight 1 in effect
        part["is_weight"] += float(d["r_mask"][rows[~needed[rows]]].sum())
        for k, v in part.items():
            sums[k] += v
        return finite, float(grad_norm), len(compute)

    def _metrics(self, table, rewards, groups, outcome, sums, n_tokens, old_lp, r_mask, norms, skipped) -> dict:
        n_groups = int(groups.max()) + 1 if len(groups) else 0
        lo = torch.full((n_groups,), math.inf).scatter_reduce(0, groups, rewards, "amin")
        hi = torch.full((n_groups,), -math.inf).scatter_reduce(0, groups, rewards, "amax")
        versions = table.column("policy_version")
        per_token = max(n_tokens, 1)
        out = {
            "version": self.version,
            "reward/mean": float(rewards.mean()),
            "reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0,
            "train/loss": sums["loss"] / per_token,
            "train/pg_loss": sums["pg_loss"] / per_token,
            "train/clip_frac": sums["clip_frac"] / per_token,
            "train/is_weight_mean": sums["is_weight"] / per_token,
            # the behaviour policy's negative log-likelihood of its own samples (an entropy estimate)
            "train/neg_logprob": float(-(old_lp * r_mask).sum()) / per_token,
            "train/grad_norm": float(np.mean(norms)) if norms else 0.0,
            "train/skipped_nonfinite": float(self.skipped_steps),
            "train/step_skipped": float(skipped > 0),
            "train/optimizer_steps": len(norms),
            "train/advantage_abs_mean": float(outcome.abs().mean()),
            "samples/count": table.num_rows,
            "samples/tokens": int(n_tokens + pc.sum(pc.list_value_length(table.column("prompt_ids"))).as_py()),
            "samples/response_length": n_tokens / max(table.num_rows, 1),
            "samples/truncated_frac": float(pc.mean(pc.equal(pc.cast(table.column("finish_reason"),
                                                                    pa.string()), "length")).as_py()),
            # groups whose samples all got the same reward carry no group-relative signal
            "samples/uniform_reward_groups_frac": float((lo == hi).float().mean()) if n_groups else 0.0,
            "policy/version_min": int(pc.min(versions).as_py()),
            "policy/staleness_max": self.version - 1 - int(pc.min(versions).as_py()),
        }
        if self.reference is not None:
            out["train/kl"] = sums["kl"] / per_token
        if self.laser_label is not None:
            out["train/laser_mse"] = sums["laser_mse"] / max(len(norms), 1)
            out["train/laser_c"] = self.laser_c
        return out

    # ---- preference optimisation (self-rewarding iterations) ------------------------------------
    def snapshot_reference(self, path: str | None = None) -> int:
        """Freeze the current weights as the reference of an iteration's preference loss (and save
        them to `path`, the iteration's snapshot)."""
        self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        self._reference_moves = True  # saved with every checkpoint, not once per run
        if path:
            self.model.save_pretrained(path)
            self.tokenizer.save_pretrained(path)
        return self.version

    def train_preference(self, pairs: pa.Table, loss: str = "dpo", params: dict | None = None,
                         nll_weight: float = 0.0) -> dict:
        """One optimizer step on preference pairs (prompt, chosen, rejected) with a loss from the
        registry (dpo, ipo, simpo), or `raft`: supervised fine-tuning on the chosen responses.
        `nll_weight` adds that times the chosen responses' NLL to a preference loss (RPO)."""
        from actors.algorithms import PREFERENCE_LOSSES
        from actors.algorithms.preference import sft_nll

        B.validate_pairs(pairs)
        n = pairs.num_rows
        prompts = self._tokenize(pairs.column("prompt").to_pylist())
        responses = self._tokenize(pairs.column("chosen").to_pylist() + pairs.column("rejected").to_pylist(), eos=True)
        table = pa.table({"prompt_ids": pa.concat_arrays([prompts, prompts]), "response_ids": responses})
        ids, mask, positions, r_ids, r_mask, p_width = self._sequences(table)
        m = r_mask.to(self.device).float()
        logp = self._token_logprobs(self.model, ids, mask, positions, r_ids, p_width)
        if loss == "raft":
            total, stats = sft_nll(logp[:n], m[:n]), {}
        else:
            if self.reference is None and loss != "simpo":
                raise RuntimeError(f"preference loss {loss!r} needs a reference: call snapshot_reference first")
            seq, lengths = (logp * m).sum(1), m.sum(1)
            ref = None
            if self.reference is not None:
                with torch.no_grad():
                    ref = (self._token_logprobs(self.reference, ids, mask, positions, r_ids, p_width) * m).sum(1)
            total, stats = PREFERENCE_LOSSES.get(loss)(
                chosen_logps=seq[:n], rejected_logps=seq[n:], chosen_lengths=lengths[:n], rejected_lengths=lengths[n:],
                ref_chosen_logps=None if ref is None else ref[:n], ref_rejected_logps=None if ref is None else ref[n:],
                **(params or {}))
            if nll_weight:
                nll = sft_nll(logp[:n], m[:n])
                total, stats = total + nll_weight * nll, {**stats, "chosen_nll": nll.detach()}
        self.optimizer.zero_grad(set_to_none=True)
        if not torch.isfinite(total):
            self.skipped_steps += 1
            log.warning("non-finite preference loss %s: step skipped", float(total))
            return {"version": self.version, "pref/step_skipped": 1.0}
        total.backward()
        grad_norm = clip_grad_norm(self.model, self.algo.grad_clip)
        self.optimizer.step()
        self.version += 1
        out = {"version": self.version, "pref/loss": total.item(), "pref/pairs": n, "train/grad_norm": float(grad_norm)}
        out.update({f"pref/{k}": float(v) for k, v in stats.items()})
        return out

    # ---- supervised warm-up ----------------------------------------------------------------------
    def sft_steps(self, batches: list[pa.Table], lr: float) -> float:
        """Several warm-up steps in one call (fewer round trips); returns the last loss. The warm-up
        runs alone, so it takes every core even where async training shares them with generators."""
        from actors.runtime import torch_threads

        with torch_threads(self.alone_threads):
            return [self.sft_step(b, lr) for b in batches][-1]["warmup/loss"]

    @torch.no_grad()
    def answer_accuracy(self, prompts: pa.Table) -> float:
        """The fraction of prompts whose reference answer + EOS greedy decoding would produce exactly:
        every answer token is the argmax given the ones before it (one teacher-forced forward pass,
        no generation). A lower bound on the verifier's greedy accuracy for answer-matching rewards,
        so the warm-up can watch its target cheaply and confirm it with a real evaluation."""
        self.model.eval()
        ids, targets = self._packed_answers(prompts)
        logits = self.model(input_ids=ids.to(self.device)).logits
        right = (logits.argmax(-1).cpu() == targets) | (targets == -100)
        self.model.train()
        return float(right.all(dim=1).float().mean())

    def _packed_answers(self, prompts: pa.Table) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompt + reference answer + EOS per row, right-padded as one sequence: the padding follows
        every real token, so causal attention needs no mask (SDPA's causal path, about 5 % faster a
        step here) and the default positions are right. Returns inputs [B, T-1] and their next-token
        targets [B, T-1], -100 outside the answers. Token ids are cached: the warm-up revisits prompts."""
        cache = self.__dict__.setdefault("_token_cache", {})
        if len(cache) > 500_000:  # a huge SFT set: bound the memory, not the speed-up
            cache.clear()
        texts = prompts.column("prompt").to_pylist() + [str(a) for a in prompts.column("answer").to_pylist()]
        missing = list({t for t in texts if t not in cache})
        if missing:
            cache.update(zip(missing, self.tokenizer(missing, add_special_tokens=False)["input_ids"]))
        n, eos = prompts.num_rows, self.tokenizer.eos_token_id
        seqs = [(cache[texts[i]], cache[texts[n + i]] + [eos]) for i in range(n)]
        width = max(len(p) + len(a) for p, a in seqs)
        ids = torch.full((n, width), self.tokenizer.pad_token_id, dtype=torch.long)
        targets = torch.full((n, width), -100, dtype=torch.long)
        for i, (p, a) in enumerate(seqs):
            ids[i, :len(p) + len(a)] = torch.tensor(p + a)
            targets[i, len(p) - 1:len(p) + len(a) - 1] = torch.tensor(a)
        return ids[:, :-1], targets[:, :-1]

    def sft_step(self, prompts: pa.Table, lr: float) -> dict[str, float]:
        """Token-mean cross-entropy on the reference answers (+ EOS) given the prompts."""
        self._warmup_optimizer(lr)
        ids, targets = self._packed_answers(prompts)
        logits = self.model(input_ids=ids.to(self.device)).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.to(self.device).flatten())
        self._sft_optimizer.zero_grad(set_to_none=True)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"warm-up loss is {float(loss)}; lower warmup.lr")
        loss.backward()
        clip_grad_norm(self.model, 1.0)
        self._sft_optimizer.step()
        return {"warmup/loss": loss.item()}

    def laser_align_steps(self, batches: list[pa.Table], lr: float, nll_weight: float) -> dict[str, float]:
        """LaSeR's self-verification warm-up, one optimizer step per batch of the policy's own
        verifier-labelled samples: MSE between r = beta * (log pi(z | x, y) - c) and the label, plus
        `nll_weight` x the NLL of the correct samples (without it the shared weights forget the task).
        c is fixed from the first batch (as in RL) when the config leaves it open."""
        from actors.runtime import torch_threads
        from actors.sampling import token_logprobs

        if self.laser_label is None:
            raise RuntimeError("laser_align_steps needs a laser reward source in the config")
        self._warmup_optimizer(lr)
        beta, key, sums = self.config.laser.beta, B.REWARD_PREFIX + self.laser_label, {"mse": 0.0, "nll": 0.0}
        with torch_threads(self.alone_threads):
            for table in batches:
                if "laser_logprob" not in table.schema.names:
                    raise B.BatchError("self-verification batches need the generators' `laser_logprob` column")
                if self.laser_c is None:  # fixed from the first batch, as in RL
                    self.laser_c = float(np.nanmean(table.column("laser_logprob").to_numpy(zero_copy_only=False)))
                label = torch.from_numpy(table.column(key).to_numpy(zero_copy_only=False).astype(np.float32))
                if torch.isnan(label).any():
                    raise B.BatchError(f"self-verification batch has rows without a {key!r} label")
                ids, mask, positions, r_ids, r_mask, p_width = self._sequences(table)
                logits, tail = self._response_logits(self.model, ids, mask, positions, p_width, after=True)
                r = beta * (torch.log_softmax(tail.float(), dim=-1)[:, self.laser_token] - self.laser_c)
                mse = ((r - label.to(self.device)) ** 2).mean()
                good = r_mask.to(self.device).float() * (label >= 0.5).float().to(self.device)[:, None]
                nll = -(token_logprobs(logits, r_ids.to(self.device)) * good).sum() / good.sum().clamp(min=1)
                loss = mse + nll_weight * nll
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"self-verification loss is {float(loss)}; lower laser.warmup_lr")
                self._sft_optimizer.zero_grad(set_to_none=True)
                loss.backward()
                clip_grad_norm(self.model, 1.0)
                self._sft_optimizer.step()
                sums["mse"] += mse.item()
                sums["nll"] += nll.item()
        n = max(len(batches), 1)
        return {"laser_warmup/mse": sums["mse"] / n, "laser_warmup/nll": sums["nll"] / n, "laser_warmup/c": self.laser_c}

    def _warmup_optimizer(self, lr: float) -> None:
        """The warm-ups' own AdamW, kept across their calls at one learning rate."""
        if getattr(self, "_sft_lr", None) != lr:
            self._sft_optimizer = adamw(self.model.parameters(), lr=lr)
            self._sft_lr = lr

    def end_warmup(self) -> None:
        self._sft_optimizer = self._sft_lr = None
        self.reset_optimizer()


LearnerActor = ray.remote(Learner)
