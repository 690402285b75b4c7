"""SPARK's judge training (Liu et al. 2025, "SPARK: Synergistic Policy And Reward Co-Evolving
Framework"): the policy's own rollouts, labelled by the verifier, train the same model as a
generative judge while it trains as a policy -- a second objective on the same learner, riding along
the RL step -- and that judge (`rewards: [{name: ..., judge: true}]`) rewards the policy.

Each judge example is a text and its right verdict token, against the wrong one; the loss is the
cross-entropy of the two tokens (the read-out the judge reward uses), per `mode`:
- pointwise: judge.template filled with (prompt, response) -> judge.yes if the verifier accepts it,
  judge.no otherwise;
- pairwise: a correct and a wrong response to one prompt, in both orders (position bias),
  pair_template -> `first` when response a is the correct one, `second` otherwise;
- reflective: reflect_template, the judge's own greedy reflection (written with the current
  weights, no gradient), verdict_cue -> judge.yes / judge.no; only the verdict token is trained.
The texts are those of actors/judge_modes.py, which the judge reward reads too.

With `replay` > 0 the examples of the last `replay` batches stay in the draw beside this batch's
(their labels do not age): where the verifier labels a tenth of the prompts, one batch's few
labelled rollouts are all the judge would see per update. They are checkpointed with the learner."""

from __future__ import annotations

from collections import deque

import numpy as np
import pyarrow as pa
import torch

from actors import batch as B
from actors.objectives import OBJECTIVES, Objective

MODES = ("pointwise", "pairwise", "reflective")


@OBJECTIVES.register("self_judge")
class SelfJudge(Objective):
    name = "self_judge"
    columns = ("prompt", "response")
    rides_alone = True  # its loss is its own forward pass: it can ride a preference step too

    def __init__(self, learner, coef: float = 0.5, per_update: int = 64, threshold: float = 0.5,
                 mode: str = "pointwise", pair_template: str = "{prompt}{a}|{b}?", first: str = "A",
                 second: str = "B", reflect_template: str = "{prompt}{response}|{prompt}", verdict_cue: str = "?",
                 reflect_tokens: int = 8, template: str = "{prompt}{response}?", yes: str = "Y", no: str = "N",
                 replay: int = 0):
        """The options of recipe spark's `spark` section, and `template`, `yes`, `no`: the judge's
        (its `judge` section), which the judge reward reads too."""
        from actors.judging import single_token

        super().__init__(learner)
        config = learner.config
        fns = config.fn_rewards()
        if not fns:
            raise ValueError("the self_judge objective needs a verifier reward function (rewards[].fn) for its labels")
        if not coef > 0 or per_update < 1 or replay < 0:
            raise ValueError(f"self_judge needs coef > 0, per_update >= 1 and replay >= 0, got {coef!r}, "
                             f"{per_update!r}, {replay!r}")
        if mode not in MODES:
            raise ValueError(f"self_judge mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.coef, self.per_update, self.threshold, self.mode = coef, per_update, threshold, mode
        self.label = fns[0].name
        self.template = template
        self.pair_template, self.reflect_template, self.cue = pair_template, reflect_template, verdict_cue
        self.reflect_tokens = reflect_tokens
        tok = learner.tokenizer
        if mode == "pairwise":  # verdict tokens: (right when the first listed is correct, the other)
            self.tokens = (single_token(tok, first, "spark.first"), single_token(tok, second, "spark.second"))
        else:
            self.tokens = (single_token(tok, yes, "judge.yes"), single_token(tok, no, "judge.no"))
        # units of examples drawn together: one judged response, or a pair's two orders
        self.units: list[list[tuple[str, str, bool]]] = []
        self.past: deque[list] = deque(maxlen=replay or None)  # the last `replay` batches' units
        self.replay = replay
        self._sums = {"loss": 0.0, "right": 0.0, "count": 0.0}

    def prepare(self, table: pa.Table, data: dict) -> None:
        """This batch's judge examples, and those of the last `replay` batches."""
        current = self.examples(table)
        self.units = current + [unit for units in self.past for unit in units]
        if self.replay and current:
            self.past.append(current)
        return None

    def examples(self, table: pa.Table) -> list[list[tuple[str, str, bool]]]:
        """The batch's judge examples from every response the verifier labelled, in units."""
        from actors.judge_modes import render_pair
        from actors.judging import render

        column = B.REWARD_PREFIX + self.label
        if column not in table.schema.names:
            return []
        label = table.column(column).to_numpy(zero_copy_only=False).astype(np.float64)
        rows = np.nonzero(~np.isnan(label))[0]
        prompts, responses = table.column("prompt").to_pylist(), table.column("response").to_pylist()
        correct = label >= self.threshold
        if self.mode == "pointwise":
            return [[(render(self.template, prompts[i], responses[i]), "", bool(correct[i]))] for i in rows]
        if self.mode == "reflective":  # the reflection is written at the update, by the weights of then
            return [[(prompts[i], responses[i], bool(correct[i]))] for i in rows]
        units = []
        groups = np.asarray(table.column("group_id").to_pylist() if "group_id" in table.schema.names
                            else table.column("prompt_id").to_pylist())
        for g in dict.fromkeys(groups[rows]):
            members = rows[groups[rows] == g]
            for c in members[correct[members]]:
                for w in members[~correct[members]]:
                    p = prompts[c]
                    units.append([(render_pair(self.pair_template, p, responses[c], responses[w]), "", True),
                                  (render_pair(self.pair_template, p, responses[w], responses[c]), "", False)])
        return units

    def begin(self, data: dict, rows: torch.Tensor) -> None:
        """coef x the judge's cross-entropy on up to `per_update` of the examples (every rank
        the same ones: the update's gradients are averaged over ranks)."""
        from actors.judge_modes import reflective_texts
        from actors.judging import next_token_logits

        if not self.units:
            return
        lrn = self.learner
        rng = np.random.default_rng([lrn.config.seed, lrn.version, int(rows[0]) if len(rows) else 0, 5])
        size = len(self.units[0])
        pick = rng.choice(len(self.units), size=min(max(1, self.per_update // size), len(self.units)), replace=False)
        chosen = [example for i in pick for example in self.units[i]]
        if self.mode == "reflective":
            texts = reflective_texts(lrn.model, lrn.tokenizer, self.reflect_template, self.cue,
                                     [p for p, _, _ in chosen], [r for _, r, _ in chosen], self.reflect_tokens,
                                     lrn.device)
        else:
            texts = [t for t, _, _ in chosen]
        ids = lrn.tokenizer(texts, add_special_tokens=False)["input_ids"]
        logits = next_token_logits(lrn.model, lrn.tokenizer.pad_token_id, ids, lrn.device)
        pair = torch.log_softmax(logits[:, list(self.tokens)], dim=-1)
        target = torch.tensor([0 if right else 1 for _, _, right in chosen], device=lrn.device)  # 0: first token
        loss = torch.nn.functional.nll_loss(pair, target)
        (self.coef * loss).backward()
        self._sums["loss"] += float(loss.detach()) * len(chosen)
        self._sums["right"] += float((pair.argmax(-1) == target).sum())
        self._sums["count"] += len(chosen)

    def state_dict(self) -> dict:  # checkpointed: a resumed run replays what the killed one would have
        return {"self_judge_replay": [list(units) for units in self.past]} if self.replay else {}

    def load_state_dict(self, state: dict) -> None:
        if self.replay:
            self.past.clear()
            self.past.extend(state.get("self_judge_replay", []))

    def metrics(self, sums: dict, updates: int) -> dict:
        n = self._sums["count"]
        out = {"self_judge/loss": self._sums["loss"] / n, "self_judge/accuracy": self._sums["right"] / n,
               "self_judge/examples": n / max(updates, 1)} if n else {}
        self._sums = {"loss": 0.0, "right": 0.0, "count": 0.0}
        return out
