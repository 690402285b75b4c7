"""SPARK's judge training (Liu et al. 2025, "SPARK: Synergistic Policy And Reward Co-Evolving
Framework"): the policy's own rollouts, labelled by the verifier, train the same model as a
generative judge while it trains as a policy -- a second objective on the same learner, riding along
the RL step -- and that judge (`rewards: [{name: ..., judge: true}]`) rewards the policy.

Pointwise judging: the judge prompt (judge.template, filled with the prompt and the response) is
followed by judge.yes for a response the verifier accepts, judge.no otherwise; the loss is the
cross-entropy of that token against the other, the same read-out the judge reward uses (P(yes))."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from actors import batch as B
from actors.objectives import OBJECTIVES, Objective


@OBJECTIVES.register("self_judge")
class SelfJudge(Objective):
    name = "self_judge"
    columns = ("prompt", "response")

    def __init__(self, learner, coef: float = 0.5, per_update: int = 64, threshold: float = 0.5):
        from actors.judging import single_token

        super().__init__(learner)
        config = learner.config
        fns = config.fn_rewards()
        if not fns:
            raise ValueError("the self_judge objective needs a verifier reward function (rewards[].fn) for its labels")
        if not coef > 0 or per_update < 1:
            raise ValueError(f"self_judge needs coef > 0 and per_update >= 1, got {coef!r}, {per_update!r}")
        self.coef, self.per_update, self.threshold = coef, per_update, threshold
        self.label = fns[0].name
        self.template = config.judge.template
        tok = learner.tokenizer
        self.yes = single_token(tok, config.judge.yes, "judge.yes")
        self.no = single_token(tok, config.judge.no, "judge.no")
        self.examples: tuple[list[str], np.ndarray] = ([], np.zeros(0, dtype=bool))
        self._sums = {"loss": 0.0, "right": 0.0, "count": 0.0}

    def prepare(self, table: pa.Table, data: dict) -> None:
        """This batch's judge examples: every response the verifier labelled."""
        from actors.judging import render

        column = B.REWARD_PREFIX + self.label
        if column not in table.schema.names:
            self.examples = ([], np.zeros(0, dtype=bool))
            return None
        label = table.column(column).to_numpy(zero_copy_only=False).astype(np.float64)
        keep = ~np.isnan(label)
        prompts, responses = table.column("prompt").to_pylist(), table.column("response").to_pylist()
        texts = [render(self.template, prompts[i], responses[i]) for i in np.nonzero(keep)[0]]
        self.examples = (texts, label[keep] >= self.threshold)
        return None

    def begin(self, data: dict, rows: torch.Tensor) -> None:
        """coef x the judge's cross-entropy on up to `per_update` of the batch's examples (every rank
        the same ones: the update's gradients are averaged over ranks)."""
        texts, correct = self.examples
        if not texts:
            return
        lrn = self.learner
        rng = np.random.default_rng([lrn.config.seed, lrn.version, int(rows[0]) if len(rows) else 0, 5])
        pick = rng.choice(len(texts), size=min(self.per_update, len(texts)), replace=False)
        ids = lrn.tokenizer([texts[i] for i in pick], add_special_tokens=False)["input_ids"]
        width = max(len(s) for s in ids)
        input_ids = torch.full((len(ids), width), lrn.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(input_ids)
        for i, s in enumerate(ids):  # left-padded: the judgment token follows every row's end
            input_ids[i, width - len(s):] = torch.tensor(s)
            mask[i, width - len(s):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        dev = lrn.device
        logits = lrn.model(input_ids=input_ids.to(dev), attention_mask=mask.to(dev),
                           position_ids=positions.to(dev)).logits[:, -1].float()
        pair = torch.log_softmax(logits[:, [self.yes, self.no]], dim=-1)
        target = torch.from_numpy((~correct[pick]).astype(np.int64)).to(dev)  # 0: yes, 1: no
        loss = torch.nn.functional.nll_loss(pair, target)
        (self.coef * loss).backward()
        self._sums["loss"] += float(loss.detach()) * len(pick)
        self._sums["right"] += float((pair.argmax(-1) == target).sum())
        self._sums["count"] += len(pick)

    def metrics(self, sums: dict, updates: int) -> dict:
        n = self._sums["count"]
        out = {"self_judge/loss": self._sums["loss"] / n, "self_judge/accuracy": self._sums["right"] / n} if n else {}
        self._sums = {"loss": 0.0, "right": 0.0, "count": 0.0}
        return out
