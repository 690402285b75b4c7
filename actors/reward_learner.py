"""Reward-model learner actor: trains a scalar reward model with the Bradley-Terry loss on
preference pairs (Arrow tables: prompt, chosen, rejected), from a file or built from the policy's
own rollouts labelled by a verifier (Cooper), and reports held-out pairwise accuracy."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray
import torch

from actors import batch as B
from actors.reward_model import render, score_ids
from actors.trainable import Trainable, adamw


@dataclass(frozen=True)
class RewardModelSpec:
    """A reward-model learner's settings: a role argument its recipe builds from the reward_model
    section (pipelines/stages/reward_model.py), so the learner reads no recipe section."""
    template: str  # the text the reward model reads: {prompt}, {response}, {answer}
    lr: float
    weight_decay: float
    margin: float  # Bradley-Terry margin
    batch_pairs: int  # pairs per optimizer step
    update_every: int  # one update every k rollout batches
    pair_selection: str  # hardest / random
    pairs_per_group: int
    label: str | None  # the verifier source whose labels build pairs from rollouts
    label_threshold: float  # a response is correct when its label reward is at least this
    eval_pairs: int  # held-out pairs when no eval file is given


class RewardLearner(Trainable):
    def __init__(self, config, model_source: str, role: dict | None = None, source: str = "rm", *,
                 spec: RewardModelSpec):
        """`source`: the reward source it trains; `spec`: its settings (its recipe's role argument)."""
        from actors import modeling

        self._setup(config, role, seed_offset=11)
        self.rm = spec
        self.source = source  # the reward source this learner trains (column reward.<source>)
        self.label_source = spec.label
        if model_source is None:  # warm-up off and no reward_model.init: a freshly initialised body
            import tempfile
            with tempfile.TemporaryDirectory() as tmp:
                self.model, self.tokenizer = modeling.fresh_reward_model(config.model, config.seed, tmp)
        else:
            self.model, self.tokenizer = modeling.load_reward_model(model_source, seed=config.seed)
        self.model.to(self.device).train()
        self._engine_setup()
        self.optimizer = adamw(self.model.parameters(), lr=self.rm.lr, weight_decay=self.rm.weight_decay)
        self.rng = np.random.default_rng([config.seed, 11])
        self.eval_pairs: pa.Table | None = None
        self.batches = 0  # rollout batches seen (update_every counts these)

    # ---- scoring -----------------------------------------------------------------------------------
    def _scores(self, texts: list[str]) -> torch.Tensor:
        ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        return score_ids(self.model, ids, self.tokenizer.pad_token_id, self.device)

    def _pair_texts(self, pairs: pa.Table) -> tuple[list[str], list[str]]:
        prompts = pairs.column("prompt").to_pylist()
        answers = pairs.column("answer").cast(pa.string()).to_pylist() if "answer" in pairs.schema.names else None
        chosen = [render(self.rm.template, p, c, answers[i] if answers else None)
                  for i, (p, c) in enumerate(zip(prompts, pairs.column("chosen").to_pylist()))]
        rejected = [render(self.rm.template, p, r, answers[i] if answers else None)
                    for i, (p, r) in enumerate(zip(prompts, pairs.column("rejected").to_pylist()))]
        return chosen, rejected

    # ---- training ----------------------------------------------------------------------------------
    def train_pairs(self, pairs: pa.Table) -> dict[str, float]:
        """Bradley-Terry steps over `pairs` in batches of `reward_model.batch_pairs`; one version."""
        from actors.algorithms.preference import bradley_terry

        B.validate_pairs(pairs)
        losses, accs, steps = [], [], 0
        order = self.rng.permutation(pairs.num_rows)
        ranks = self.ranks
        for start in range(0, pairs.num_rows, self.rm.batch_pairs):
            chunk = pairs.take(pa.array(order[start:start + self.rm.batch_pairs]))
            own = ranks.split(chunk.num_rows)  # this rank's pairs (every rank: the whole chunk at 1 rank)
            real = len(own) > 0
            if not real and not ranks.sharded:
                own = torch.zeros(0, dtype=torch.long)
            elif not real:  # fsdp2: a zero-weight pair keeps the collectives in step
                own = torch.zeros(1, dtype=torch.long)
            self.optimizer.zero_grad(set_to_none=True)
            sums = {"loss": 0.0, "right": 0.0}
            if len(own):
                chosen, rejected = self._pair_texts(chunk.take(pa.array(own.numpy())))
                scores = self._scores(chosen + rejected)
                loss, stats = bradley_terry(scores[:len(chosen)], scores[len(chosen):], margin=self.rm.margin)
                # the chunk's mean over every rank's pairs, times the world size (gradients are averaged)
                weight = len(own) / chunk.num_rows if real else 0.0
                (loss * weight * ranks.world_size).backward()
                sums = {"loss": loss.item() * weight, "right": float(stats["accuracy"]) * len(own) * real}
            sums = ranks.sum(sums)
            if not np.isfinite(sums["loss"]):
                raise FloatingPointError(f"reward-model loss is {sums['loss']}; lower reward_model.lr")
            self.clip_grads(1.0)
            self.optimizer.step()
            losses.append(sums["loss"])
            accs.append(sums["right"] / chunk.num_rows)
            steps += 1
        if steps:
            self.version += 1
        return {"rm/version": self.version, "rm/loss": float(np.mean(losses)) if losses else None,
                "rm/train_pair_accuracy": float(np.mean(accs)) if accs else None,
                "rm/pairs": pairs.num_rows, "rm/optimizer_steps": steps}

    def pairs_from_rollouts(self, table: pa.Table, selection: str) -> tuple[pa.Table, dict]:
        """Verifier-labelled pairs from one rollout batch (Cooper): within a prompt group, a correct
        response against a wrong one; `hardest` takes the wrong one the reward model scores highest."""
        from actors.algorithms.pairs import labelled_pairs

        label = table.column(B.REWARD_PREFIX + self.label_source).to_numpy(zero_copy_only=False).astype(np.float64)
        correct = np.where(np.isnan(label), np.nan, (label >= self.rm.label_threshold).astype(np.float64))
        scores = self.current_scores(table) if selection == "hardest" else None
        chosen, rejected, stats = labelled_pairs(B.group_index(table), correct, scores, selection=selection,
                                                 pairs_per_group=self.rm.pairs_per_group, rng=self.rng)
        extra = {}
        if "answer" in table.schema.names:
            extra["answer"] = table.column("answer").cast(pa.string()).take(pa.array(chosen, pa.int64()))
        take = lambda name, idx: table.column(name).take(pa.array(idx, pa.int64())).to_pylist()  # noqa: E731
        pairs = B.pair_table(take("prompt", chosen), take("response", chosen), take("response", rejected), extra)
        return pairs, stats

    def current_scores(self, table: pa.Table) -> np.ndarray:
        """The reward model's scores of a batch: its `reward.<source>` column where the reward-model
        actors scored it at this version, else computed here (also where the credit step dropped
        every value: orchestrator/judge_credit.py's guard, while the model is at chance)."""
        column = B.REWARD_PREFIX + self.source
        if column in table.schema.names:
            scores = table.column(column).to_numpy(zero_copy_only=False).astype(np.float64)
            if not np.isnan(scores).all():
                return scores
        with torch.no_grad():
            return self._scores(self._rollout_texts(table)).cpu().numpy().astype(np.float64)

    def _rollout_texts(self, table: pa.Table) -> list[str]:
        answers = table.column("answer").cast(pa.string()).to_pylist() if "answer" in table.schema.names else None
        return [render(self.rm.template, p, r, answers[i] if answers else None) for i, (p, r) in
                enumerate(zip(table.column("prompt").to_pylist(), table.column("response").to_pylist()))]

    def update_from_rollouts(self, *tables: pa.Table, selection: str | None = None, train: bool = True) -> dict:
        """One co-evolution step: measure the reward model on this fresh batch (before it learns from
        it), build verifier-labelled pairs, and train on them every `update_every` batches."""
        table = B.concat(list(tables))
        out = self._agreement(table)
        pairs, stats = self.pairs_from_rollouts(table, selection or self.rm.pair_selection)
        out.update({f"rm/{k}": v for k, v in stats.items()})
        self.batches += 1
        if train and pairs.num_rows and self.batches % self.rm.update_every == 0:
            out.update(self.train_pairs(pairs))
        out["rm/version"] = self.version
        return out

    def _agreement(self, table: pa.Table) -> dict:
        """How the reward model's current scores order this batch's verifier-labelled responses:
        the fraction of (correct, wrong) pairs within a group it ranks correctly (before any update)."""
        label_col = B.REWARD_PREFIX + self.label_source
        if label_col not in table.schema.names:
            return {}
        scores = self.current_scores(table)
        label = table.column(label_col).to_numpy(zero_copy_only=False).astype(np.float64)
        groups = B.group_index(table)
        right = total = 0
        for g in np.unique(groups):
            idx = np.nonzero(groups == g)[0]
            ok = ~np.isnan(label[idx]) & ~np.isnan(scores[idx])
            good = scores[idx][ok & (label[idx] >= self.rm.label_threshold)]
            bad = scores[idx][ok & (label[idx] < self.rm.label_threshold)]
            if len(good) and len(bad):
                right += int((good[:, None] > bad[None, :]).sum())
                total += len(good) * len(bad)
        versions = pc.unique(table.column("reward_model_version")).to_pylist() \
            if "reward_model_version" in table.schema.names else []
        out = {"rm/batch_pair_accuracy": right / total if total else None, "rm/batch_labelled_pairs": total}
        if versions:
            out["rm/scored_version"] = versions[0]
        return out

    # ---- evaluation --------------------------------------------------------------------------------
    def set_eval_pairs(self, pairs: pa.Table) -> int:
        B.validate_pairs(pairs, where="held-out pairs")
        self.eval_pairs = pairs
        return pairs.num_rows

    def set_eval_pairs_from_rollouts(self, *tables: pa.Table) -> int:
        """Held-out pairs from samples of the held-out prompts: random correct/wrong pairs."""
        pairs, _ = self.pairs_from_rollouts(B.concat(list(tables)), "random")
        return self.set_eval_pairs(pairs.slice(0, self.rm.eval_pairs))

    def evaluate_pairs(self, pairs: pa.Table | None = None) -> dict[str, float]:
        """Held-out pairwise accuracy: the fraction of pairs where chosen scores above rejected."""
        from actors.algorithms.preference import bradley_terry

        pairs = pairs if pairs is not None else self.eval_pairs
        if pairs is None or pairs.num_rows == 0:
            return {}
        self.model.eval()
        right, losses = 0, []
        with torch.no_grad():
            for start in range(0, pairs.num_rows, self.rm.batch_pairs):
                chosen, rejected = self._pair_texts(pairs.slice(start, self.rm.batch_pairs))
                scores = self._scores(chosen + rejected)
                loss, _ = bradley_terry(scores[:len(chosen)], scores[len(chosen):])
                right += int((scores[:len(chosen)] > scores[len(chosen):]).sum())
                losses.append(float(loss) * len(chosen))
        self.model.train()
        return {"rm/eval_pair_accuracy": right / pairs.num_rows, "rm/eval_loss": sum(losses) / pairs.num_rows,
                "rm/eval_pairs": pairs.num_rows}

    def extra_state(self) -> dict:
        return {"batches": self.batches, "rng": self.rng.bit_generator.state}

    def load_extra_state(self, state: dict) -> None:
        self.batches = state.get("batches", 0)
        if "rng" in state:
            self.rng.bit_generator.state = state["rng"]


RewardLearnerActor = ray.remote(RewardLearner)
