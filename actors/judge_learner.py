"""A judge trained while RL runs: a model of its own whose verdict on a response is P(yes) against
P(no) after the judge template (what a judge pool reads: its JudgingSpec), trained on judged items
(`prompt`, `response`, `step_correct`). SPC's critic is one (its items: the game's variants and the
policy's labelled rollouts); a GRPO-family judge apart with `judge.online_items` is another (its
items: each step's verifier-labelled rollouts, `labelled_items`)."""

from __future__ import annotations

from collections import deque

import numpy as np
import pyarrow as pa
import torch

from actors import batch as B
from actors.judging import JudgingSpec, render, single_token, verdict_logprobs
from actors.learner import Learner

THRESHOLD = B.CORRECT_AT  # a rollout whose verifier reward is at least this is a correct one


def labelled_items(table: pa.Table, label: str, threshold: float, limit: int, rng) -> pa.Table:
    """Up to `limit` of the batch's verifier-labelled, non-empty rollouts as judged items (`prompt`,
    `response`, `step_correct`), as many correct as wrong (none where one kind is missing)."""
    empty = pa.table({"prompt": pa.array([], pa.string()), "response": pa.array([], pa.string()),
                      "step_correct": pa.array([], pa.bool_())})
    if limit == 0 or B.REWARD_PREFIX + label not in table.schema.names:
        return empty
    values = table.column(B.REWARD_PREFIX + label).to_numpy(zero_copy_only=False).astype(np.float64)
    responses = table.column("response").to_pylist()
    ok = ~np.isnan(values) & np.array([r.strip() != "" for r in responses], bool)
    good, bad = np.nonzero(ok & (values >= threshold))[0], np.nonzero(ok & (values < threshold))[0]
    n = min(len(good), len(bad), limit // 2)
    if n == 0:
        return empty
    rows = np.concatenate([rng.choice(good, n, replace=False), rng.choice(bad, n, replace=False)])
    prompts = table.column("prompt").to_pylist()
    return pa.table({"prompt": [prompts[i] for i in rows], "response": [responses[i] for i in rows],
                     "step_correct": pa.array([True] * n + [False] * n, pa.bool_())})


class JudgeLearner(Learner):
    """Trains on the expected reward of its verdict under the two-way distribution, sum over verdicts
    v of pi(v | item) R(v) = s (2 P(yes) - 1) with s = +1 for a correct item and -1 for a wrong one:
    the exact policy gradient of its one-token verdict (SPC's game reward), which GRPO on sampled
    verdicts would estimate. The two kinds of item weigh half each, whatever their counts. Metrics
    are named `<prefix>/...` (SPC: critic)."""

    def __init__(self, config, model_source: str | None = None, role: dict | None = None, *,
                 judging: JudgingSpec, lr: float | None = None, replay: int = 0, prefix: str = "judge_learner",
                 fresh: bool = False):
        """`judging`: the judge pool's read-out (its template and yes/no tokens), from the recipe.
        `fresh`: the model's architecture randomly initialised (`judge.init: scratch`)."""
        super().__init__(config, model_source, role, objectives=[], lr=lr, reference=False, fresh=fresh)
        self.template = judging.template
        self.yes = single_token(self.tokenizer, judging.yes, "judge.yes")
        self.no = single_token(self.tokenizer, judging.no, "judge.no")
        self.replay, self.prefix = replay, prefix
        self.past: deque[pa.Table] = deque(maxlen=replay or None)  # the last `replay` steps' labelled items

    def extra_state(self) -> dict:  # checkpointed: a resumed run replays what the killed one would have
        return {**super().extra_state(), "judge_replay": list(self.past)}

    def load_extra_state(self, state: dict) -> None:
        super().load_extra_state(state)
        self.past.clear()
        if self.replay:  # (checkpoints written before the rename hold them as spc_replay)
            self.past.extend(state.get("judge_replay", state.get("spc_replay", [])))

    def _judged(self, table: pa.Table) -> tuple[list[str], np.ndarray]:
        """Judged items as the judge reads them (the template filled) and whether each is correct."""
        texts = [render(self.template, q, r) for q, r in
                 zip(table.column("prompt").to_pylist(), table.column("response").to_pylist())]
        return texts, np.asarray(table.column("step_correct").to_pylist(), bool)

    def verdict_steps(self, batches: list[pa.Table], lr: float) -> float:
        """Supervised steps on judged items (the judging warm-up of a judge from scratch): the
        cross-entropy of the verifier's verdict under the two-way distribution P(yes) : P(no), with
        the warm-ups' own AdamW at `lr`; returns the last step's loss."""
        from actors.runtime import torch_threads

        optimizer, loss = self.warmup_optimizer(lr), float("nan")
        with torch_threads(self.alone_threads):
            for table in batches:
                texts, correct = self._judged(table)
                target = torch.from_numpy(np.where(correct, 0, 1))
                optimizer.zero_grad(set_to_none=True)
                total = 0.0
                for start in range(0, len(texts), self.algo.micro_batch_size):
                    rows = slice(start, start + self.algo.micro_batch_size)
                    pair = verdict_logprobs(self.model, self.tokenizer, texts[rows], self.yes, self.no, self.device)
                    part = torch.nn.functional.nll_loss(pair, target[rows].to(self.device), reduction="sum") / len(texts)
                    part.backward()
                    total += float(part.detach())
                self.clip_grads(self.algo.grad_clip)
                optimizer.step()
                loss = total
        return loss

    def train_game(self, table: pa.Table | None, own: pa.Table | None = None) -> dict[str, float]:
        """One optimizer step on the judged items: `table` (SPC: the game's), `own` (the policy's
        labelled rollouts) and the `own` of the last `replay` steps."""
        p = self.prefix
        replayed = list(self.past)
        if self.replay and own is not None and own.num_rows:
            self.past.append(own)
        parts = [t for t in (table, own, *replayed) if t is not None and t.num_rows]
        if not parts:
            return {f"{p}/version": self.version, f"{p}/steps_judged": 0}
        table = pa.concat_tables(parts)
        texts, correct = self._judged(table)
        sign = torch.from_numpy(np.where(correct, 1.0, -1.0)).float()
        counts = {True: int(correct.sum()), False: int((~correct).sum())}
        kinds = sum(1 for n in counts.values() if n)
        weight = torch.tensor([1.0 / (kinds * counts[bool(c)]) for c in correct]).float()
        self.optimizer.zero_grad(set_to_none=True)
        expected, right = 0.0, 0
        for start in range(0, len(texts), self.algo.micro_batch_size):
            rows = slice(start, start + self.algo.micro_batch_size)
            pair = verdict_logprobs(self.model, self.tokenizer, texts[rows], self.yes, self.no, self.device)
            value = sign[rows].to(self.device) * (2 * pair[:, 0].exp() - 1)  # expected reward per item
            (-(weight[rows].to(self.device) * value).sum()).backward()
            expected += float((weight[rows].to(self.device) * value).sum().detach())
            right += int(((pair[:, 0] >= pair[:, 1]).cpu().numpy() == correct[rows]).sum())
        self.clip_grads(self.algo.grad_clip)
        self.optimizer.step()
        self.version += 1
        return {f"{p}/version": self.version, f"{p}/expected_reward": expected,
                f"{p}/accuracy_before": right / len(texts), f"{p}/steps_judged": len(texts),
                f"{p}/replayed": sum(t.num_rows for t in replayed)}
