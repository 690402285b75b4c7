"""Learner actor: owns the policy and its optimizer; computes advantages and losses from the
registries, takes gradient steps and publishes versioned weights."""

from __future__ import annotations

import copy
import logging
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray
import torch

from actors import batch as B

log = logging.getLogger("coevo.learner")


class Learner:
    def __init__(self, config, model_source: str | None = None):
        import transformers

        from actors import modeling
        from actors.runtime import setup_torch

        transformers.utils.logging.disable_progress_bar()  # no "Writing model shards" bars in logs
        self.config = config
        self.algo = config.algorithm
        self.device = setup_torch(config.train.threads, config.seed, want_gpu=self.algo.num_gpus > 0)
        self.model, self.tokenizer = modeling.build(config.model, config.seed)
        if model_source:
            self.model = modeling.load_model(model_source)
        self.model.to(self.device).train()
        self.reference = None
        if self.algo.kl_coef > 0:  # frozen copy of the starting policy
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.optimizer = self._new_optimizer(self.algo.lr)
        self.skipped_steps = 0

    def _new_optimizer(self, lr: float) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=self.algo.weight_decay)

    # ---- weights -------------------------------------------------------------------------------
    def publish(self) -> dict[str, np.ndarray]:
        """Weights as numpy arrays: the object store holds them once, readers map them zero-copy."""
        return {k: v.detach().cpu().numpy() for k, v in self.model.state_dict().items()}

    def save(self, path: str, optimizer: bool = True) -> str:
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        if optimizer:
            torch.save(self.optimizer.state_dict(), out / "optimizer.pt")
        return str(out)

    def load_optimizer(self, path: str) -> None:
        self.optimizer.load_state_dict(torch.load(Path(path) / "optimizer.pt", weights_only=True))

    def reset_optimizer(self) -> None:
        """A fresh AdamW for RL after warm-up (its own learning rate, no carried-over moments)."""
        self.optimizer = self._new_optimizer(self.algo.lr)
        if self.algo.kl_coef > 0:  # the reference is the policy RL starts from
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)

    # ---- tensors -------------------------------------------------------------------------------
    def _sequences(self, table: pa.Table):
        """Left-padded prompts + right-padded responses -> ids, mask, positions, response slice."""
        pad = self.tokenizer.pad_token_id
        p_ids, p_len = B.to_padded(table.column("prompt_ids"), pad, torch.long, left=True)
        r_ids, r_len = B.to_padded(table.column("response_ids"), pad, torch.long)
        p_width, r_width = p_ids.shape[1], r_ids.shape[1]
        p_mask = torch.arange(p_width)[None, :] >= (p_width - p_len)[:, None]
        r_mask = torch.arange(r_width)[None, :] < r_len[:, None]
        ids = torch.cat([p_ids, r_ids], dim=1)
        mask = torch.cat([p_mask, r_mask], dim=1).long()
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # same positions as left-padded generation
        return ids, mask, positions, r_ids, r_mask, p_width

    def _token_logprobs(self, model, ids, mask, positions, r_ids, p_width) -> torch.Tensor:
        logits = model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                       position_ids=positions.to(self.device)).logits
        logits = logits[:, p_width - 1:-1].float()  # logits that predict each response token
        return torch.log_softmax(logits, dim=-1).gather(-1, r_ids.to(self.device).unsqueeze(-1)).squeeze(-1)

    # ---- RL step -------------------------------------------------------------------------------
    def train_step(self, *tables: pa.Table, dump_path: str | None = None) -> dict[str, float]:
        """`algorithm.mini_batches` optimizer steps on the concatenated batches (one row per sampled
        response); with more than one, later steps are off-policy by a few updates and the clipped
        ratio against `behavior_logprobs` corrects for it (PPO-style)."""
        from actors.algorithms import ADVANTAGES

        table = B.concat(list(tables))
        B.validate(table, required=[*B.CORE_FIELDS, "reward"])
        if pc.count_distinct(table.column("uid")).as_py() != table.num_rows:  # exactly-once accounting
            raise B.BatchError(f"train batch has repeated uids: {table.num_rows} rows, "
                               f"{pc.count_distinct(table.column('uid')).as_py()} distinct")
        rewards = torch.from_numpy(table.column("reward").to_numpy().astype(np.float32))
        groups = torch.from_numpy(pc.dictionary_encode(table.column("prompt_id")).combine_chunks()
                                  .indices.to_numpy().astype(np.int64))
        advantages = ADVANTAGES.get(self.algo.advantage)(rewards, groups)
        old_lp, _ = B.to_padded(table.column("behavior_logprobs"), 0.0, torch.float32)
        ids, mask, positions, r_ids, r_mask, p_width = self._sequences(table)
        data = dict(ids=ids, mask=mask, positions=positions, r_ids=r_ids, r_mask=r_mask,
                    old_lp=old_lp, adv=advantages)
        n_tokens = int(r_mask.sum())

        n = table.num_rows
        order = torch.randperm(n) if self.algo.mini_batches > 1 else torch.arange(n)
        sums = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "entropy_proxy": 0.0}
        norms, skipped = [], 0
        for rows in order.chunk(min(self.algo.mini_batches, n)):
            ok, norm = self._update(rows, data, p_width, sums)
            norms.append(norm)
            skipped += not ok
        grad_norm = torch.tensor(norms).mean()
        finite = skipped == 0

        if dump_path:
            adv_tokens = B.list_column(np.repeat(advantages.numpy(), r_mask.sum(1).numpy()),
                                       r_mask.sum(1).numpy(), pa.float32())
            B.dump_parquet(table.append_column("advantages", adv_tokens), dump_path)
        return self._metrics(table, rewards, groups, advantages, sums, n_tokens, grad_norm, finite)

    def _update(self, rows: torch.Tensor, d: dict, p_width: int, sums: dict) -> tuple[bool, float]:
        """One optimizer step on `rows`, token-mean over their response tokens, in micro-batches.
        A non-finite loss or gradient skips the step (counted, warned) instead of poisoning weights."""
        from actors.algorithms import POLICY_LOSSES
        from actors.algorithms.losses import kl_k3

        loss_fn = POLICY_LOSSES.get(self.algo.policy_loss)
        tokens = max(int(d["r_mask"][rows].sum()), 1)
        self.optimizer.zero_grad(set_to_none=True)
        part = {k: 0.0 for k in sums}
        finite = True
        for mb in rows.split(self.algo.micro_batch_size):
            m = d["r_mask"][mb].to(self.device).float()
            logp = self._token_logprobs(self.model, d["ids"][mb], d["mask"][mb], d["positions"][mb],
                                        d["r_ids"][mb], p_width)
            adv = d["adv"][mb].to(self.device)[:, None]
            pg, stats = loss_fn(logp, d["old_lp"][mb].to(self.device), adv, clip_eps=self.algo.clip_eps)
            loss = pg
            if self.reference is not None:
                with torch.no_grad():
                    ref_lp = self._token_logprobs(self.reference, d["ids"][mb], d["mask"][mb],
                                                  d["positions"][mb], d["r_ids"][mb], p_width)
                kl = kl_k3(logp, ref_lp)
                loss = loss + self.algo.kl_coef * kl
                part["kl"] += (kl.detach() * m).sum().item()
            # Each micro-batch divides by the update's token count: a token-mean over the update.
            total = (loss * m).sum() / tokens
            if not torch.isfinite(total):
                finite = False
                break
            total.backward()
            with torch.no_grad():
                part["loss"] += (loss * m).sum().item()
                part["pg_loss"] += (pg * m).sum().item()
                part["clip_frac"] += (stats["clip_frac"] * m).sum().item()
                part["entropy_proxy"] += (-logp * m).sum().item()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.algo.grad_clip)
        if finite and torch.isfinite(grad_norm):
            self.optimizer.step()
        else:
            finite = False
            self.optimizer.zero_grad(set_to_none=True)
            self.skipped_steps += 1
            log.warning("non-finite loss or gradient (loss=%s, grad_norm=%s): step skipped (%d so far)",
                        part["loss"] / tokens, float(grad_norm), self.skipped_steps)
        for k, v in part.items():
            sums[k] += v
        return finite, float(grad_norm)

    def _metrics(self, table, rewards, groups, advantages, sums, n_tokens, grad_norm, finite) -> dict:
        n_groups = int(groups.max()) + 1 if len(groups) else 0
        lo = torch.full((n_groups,), math.inf).scatter_reduce(0, groups, rewards, "amin")
        hi = torch.full((n_groups,), -math.inf).scatter_reduce(0, groups, rewards, "amax")
        out = {
            "reward/mean": float(rewards.mean()),
            "reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0,
            "train/loss": sums["loss"] / max(n_tokens, 1),
            "train/pg_loss": sums["pg_loss"] / max(n_tokens, 1),
            "train/clip_frac": sums["clip_frac"] / max(n_tokens, 1),
            "train/neg_logprob": sums["entropy_proxy"] / max(n_tokens, 1),
            "train/grad_norm": float(grad_norm),
            "train/skipped_nonfinite": float(self.skipped_steps),
            "train/step_skipped": float(not finite),
            "train/advantage_abs_mean": float(advantages.abs().mean()),
            "samples/count": table.num_rows,
            "samples/tokens": int(n_tokens + pc.sum(pc.list_value_length(table.column("prompt_ids"))).as_py()),
            "samples/response_length": n_tokens / max(table.num_rows, 1),
            "samples/truncated_frac": float(pc.mean(pc.equal(pc.cast(table.column("finish_reason"),
                                                                    pa.string()), "length")).as_py()),
            # groups whose samples all got the same reward carry no GRPO signal
            "samples/uniform_reward_groups_frac": float((lo == hi).float().mean()) if n_groups else 0.0,
            "policy/version_min": int(pc.min(table.column("policy_version")).as_py()),
        }
        if self.reference is not None:
            out["train/kl"] = sums["kl"] / max(n_tokens, 1)
        for source in B.reward_sources(table):
            out[f"reward/{source}"] = float(pc.mean(table.column(B.REWARD_PREFIX + source)).as_py() or 0.0)
        out.update({f"verify/{k}": v for k, v in B.reward_error_counts(table).items()})
        return out

    # ---- supervised warm-up ---------------------------------------------------------------------
    def sft_steps(self, batches: list[pa.Table], lr: float) -> float:
        """Several warm-up steps in one call (fewer round trips); returns the last loss."""
        return [self.sft_step(b, lr) for b in batches][-1]["warmup/loss"]

    def sft_step(self, prompts: pa.Table, lr: float) -> dict[str, float]:
        """Cross-entropy on the reference answers (+ EOS) given the prompts; prompt tokens masked."""
        if getattr(self, "_sft_lr", None) != lr:
            self._sft_optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)
            self._sft_lr = lr
        tok = self.tokenizer
        prompt_ids = tok(prompts.column("prompt").to_pylist(), add_special_tokens=False)["input_ids"]
        answers = [str(a) for a in prompts.column("answer").to_pylist()]
        answer_ids = [ids + [tok.eos_token_id] for ids in tok(answers, add_special_tokens=False)["input_ids"]]
        table = pa.table({
            "prompt_ids": pa.array(prompt_ids, pa.list_(pa.int32())),
            "response_ids": pa.array(answer_ids, pa.list_(pa.int32())),
        })
        ids, mask, positions, r_ids, r_mask, p_width = self._sequences(table)
        logp = self._token_logprobs(self.model, ids, mask, positions, r_ids, p_width)
        m = r_mask.to(self.device).float()
        loss = -(logp * m).sum() / m.sum()
        self._sft_optimizer.zero_grad(set_to_none=True)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"warm-up loss is {float(loss)}; lower warmup.lr")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self._sft_optimizer.step()
        return {"warmup/loss": loss.item()}

    def end_warmup(self) -> None:
        self._sft_optimizer = self._sft_lr = None
        self.reset_optimizer()


LearnerActor = ray.remote(Learner)
