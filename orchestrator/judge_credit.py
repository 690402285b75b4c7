"""Learned rewards in the credit step (issue 32): a judge's or a reward model's score enters the
advantage carrying its confidence, and not at all while it is no better than chance.

A learned source is a `judge: true`, `model:` or `laser: true` reward. Where the verifier labels a
prompt (`verifier.fraction`), the batch shows how good that source is: its scores and the labels of
the last `judge_credit.window` batches are kept, and before aggregation each learned column is

0. voted (`weighted_vote: text` or `int`): each response's value becomes its answer's weighted vote
   in its group, the sum of the source's values over the group's responses that give the same
   answer, over the group's size (a probability's: its answer's share times its mean value; an
   unbounded score's: its answer's mean score plus the log of its share). A judge's verdict and the
   group's agreement are two views of one answer, and their product orders a group's answers better
   than either (verifier-weighted majority voting: on sorting with 100 labelled prompts, the share of
   the unlabelled prompts' (right, wrong) pairs ordered right 0.86-0.90 against the judge's 0.80 and
   the vote share's 0.77-0.83), though in RL there it trained worse than the judge alone: it rewards
   the policy's most common answer (docs/benchmarks.md). The guard and the calibration below then
   read the voted values;
1. guarded (`min_auroc`): while the source's AUROC against the labels is below it, on the window or
   on this batch alone (a judge that collapses is dropped at once, not after the window has
   forgotten its good batches), its values are dropped (null: missing by design), so the recipe
   trains on its labelled-only reward, as GRPO on the labelled prompts would; it comes back once
   both recover (`learned/<s>/guard`; `learned/<s>/auroc_batch`: this batch's own AUROC);
2. calibrated (`confidence: calibrated` or `gated`): Platt scaling fitted on those labelled rows,
   so the value is the probability that the response is right (a judge's P(yes) is not one, a
   reward model's score is unbounded); until the window holds enough labelled rows of each kind to
   fit (`learned/<s>/uncalibrated` 1), a score outside [0, 1] is dropped as the guard drops one;
3. gated (`confidence: gated`): a calibrated value within `gate_band` of 0.5 (the judge unsure)
   takes its group's mean of the sure ones, so it gets no advantage from the judge;
4. flattened (`min_spread`): a group whose learned values differ by less than this (max - min) gets
   their mean on every row: group normalisation would turn that noise into unit-size advantages;
5. weighted (`fill_weight`, after the advantages): the rows the verifier did not label, whose reward
   under `aggregate.fill` is the learned source's alone, get their advantages times a number, or
   with `auroc` times 2 * AUROC - 1 on the window (1 for a perfect judge, 0 at chance: a smooth
   guard), the lowest over the learned sources, 1 until the window can measure it. Adam steps the
   same size whatever the gradient's scale, so this sets how much of the step's direction comes
   from the judge rather than the labels (`learned/fill_weight`).

With `verifier.probe_share` the window holds the probe rows alone (orchestrator/probes.py): the
guard and the calibration read the source on labelled prompts it has never trained on, and
`learned/<s>/auroc_trained` is its AUROC on the batch's other labelled rows, for the gap
(`/probe_rows`: the batch's labelled probe rows).

Metrics per source: `learned/<s>/auroc` (on the window), `/guard` (1: dropped this batch),
`/gated_frac`, `/flat_groups_frac`, `/calib_slope`, `/calib_bias`, `/uncalibrated`, and
`/pairs_ordered`: on this batch's labelled rows, the share of a group's (right, wrong) pairs the
source's raw score orders right (ties half). That is the ranking a group-relative advantage uses;
a pooled AUROC also credits a judge for telling easy prompts from hard ones."""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

import numpy as np
import pyarrow as pa
from pydantic import Field

from actors import batch as B
from orchestrator.config import Section
from orchestrator.credit import RewardColumns
from orchestrator.probes import probe_mask

MIN_PER_CLASS = 8  # labelled rows of each kind in the window before calibration or the guard act


class JudgeCreditConfig(Section):
    """How learned rewards (judge, reward model, LaSeR) enter the credit step
    (orchestrator/judge_credit.py). The defaults change nothing."""
    confidence: Literal["raw", "calibrated", "gated"] = "raw"
    gate_band: float = Field(0.15, ge=0, lt=0.5)  # gated: |P(correct) - 0.5| below this is unsure
    min_spread: float = Field(0.0, ge=0)  # groups whose learned values differ by less get no advantage from them
    # the guard: below this AUROC against the verifier (labelled rows of the window, or of this
    # batch alone) the learned source is dropped and the recipe trains on its labelled-only reward (None: never)
    min_auroc: Optional[float] = Field(None, ge=0, le=1)
    window: int = Field(4, ge=1)  # train batches whose labelled rows calibration and the guard read
    label_source: Optional[str] = None  # the verifier source (default: the accuracy source)
    # the advantages of rows the verifier did not label (their reward is the learned source's under
    # aggregate.fill) times this; `auroc`: 2 * AUROC - 1 on the window (0 at chance, 1 when perfect)
    fill_weight: Union[Literal["auroc"], Annotated[float, Field(ge=0, le=1)]] = 1.0
    # each learned value becomes its answer's weighted vote in its group: the sum of the values of the
    # group's responses giving that answer over the group's size (verifier-weighted majority voting,
    # before the guard and the calibration); an answer is the response's normalised text (`text`) or
    # its first integer (`int`). None: off
    weighted_vote: Optional[Literal["text", "int"]] = None

    @property
    def active(self) -> bool:
        return (self.confidence != "raw" or self.min_spread > 0 or self.min_auroc is not None
                or self.fill_weight != 1.0 or self.weighted_vote is not None)


def platt(scores: np.ndarray, labels: np.ndarray, l2: float = 1e-3, iters: int = 50) -> tuple[float, float]:
    """(a, b) of P(correct) = sigmoid(a * s + b), fitted by Newton's method on the log-loss with
    Platt's (1999) targets, (n+ + 1) / (n+ + 2) for the correct rows and 1 / (n- + 2) for the wrong:
    with 0/1 targets a window that the scores separate has no finite fit, Newton's slope grows without
    bound and every calibrated value saturates at 0 or 1 (measured: slopes of 1e4-3e5 on most steps of
    SPC's and Cooper's runs). The fit is on standardised scores, a small L2 term on the slope, and a
    step that does not lower the loss is halved."""
    x, truth = np.asarray(scores, np.float64), np.asarray(labels, np.float64) >= 0.5
    n_pos, n_neg = int(truth.sum()), int((~truth).sum())
    y = np.where(truth, (n_pos + 1) / (n_pos + 2), 1 / (n_neg + 2))
    mu, sd = float(x.mean()), float(x.std()) or 1.0
    z = (x - mu) / sd

    def loss(a: float, b: float) -> float:
        t = a * z + b
        return float(np.sum(np.logaddexp(0, t) - y * t) + 0.5 * l2 * a * a)

    a, b = 1.0, 0.0
    for _ in range(iters):
        p = 1 / (1 + np.exp(-(a * z + b)))
        w = p * (1 - p) + 1e-12
        grad = np.array([np.sum((p - y) * z) + l2 * a, np.sum(p - y)])
        hess = np.array([[np.sum(w * z * z) + l2, np.sum(w * z)], [np.sum(w * z), np.sum(w)]])
        try:
            step = np.linalg.solve(hess, grad)
        except np.linalg.LinAlgError:
            break
        t, current = 1.0, loss(a, b)
        while t > 1e-6 and loss(a - t * step[0], b - t * step[1]) > current:
            t /= 2
        a, b = a - t * step[0], b - t * step[1]
        if np.abs(t * step).max() < 1e-8:
            break
    return float(a / sd), float(b - a * mu / sd)  # a * z + b on the scores' own scale


def probabilities(values: np.ndarray) -> bool:
    """Whether every non-null value lies in [0, 1] (a judge's P(yes); not a reward model's score)."""
    return bool(np.all(np.isnan(values) | ((values >= 0) & (values <= 1))))


def to_logit(scores: np.ndarray, bounded: bool) -> np.ndarray:
    """A probability's log-odds (clipped), or the score itself where it is not a probability."""
    if not bounded:
        return scores
    p = np.clip(scores, 1e-4, 1 - 1e-4)
    return np.log(p / (1 - p))


def group_flatten(values: np.ndarray, groups: np.ndarray, min_spread: float) -> tuple[np.ndarray, float]:
    """Groups whose non-null values span less than `min_spread` take their mean on every non-null row;
    the values and the share of groups flattened."""
    out, flat, seen = values.copy(), 0, 0
    for g in np.unique(groups):
        rows = np.nonzero((groups == g) & ~np.isnan(values))[0]
        if len(rows) < 2:
            continue
        seen += 1
        if values[rows].max() - values[rows].min() < min_spread:
            out[rows] = values[rows].mean()
            flat += 1
    return out, flat / seen if seen else 0.0


def gate_unsure(values: np.ndarray, groups: np.ndarray, band: float) -> tuple[np.ndarray, float]:
    """Values within `band` of 0.5 take the mean of their group's sure values (0.5 where none is
    sure): the judge's doubt gives no advantage. The values and the share of rows gated."""
    unsure = ~np.isnan(values) & (np.abs(values - 0.5) < band)
    out = values.copy()
    for g in np.unique(groups[unsure]):
        rows = groups == g
        sure = rows & ~np.isnan(values) & ~unsure
        out[rows & unsure] = values[sure].mean() if sure.any() else 0.5
    n = int((~np.isnan(values)).sum())
    return out, float(unsure.sum() / n) if n else 0.0


def weighted_vote(values: np.ndarray, groups: np.ndarray, answers: list, bounded: bool) -> np.ndarray:
    """Each non-null value replaced by its answer's weighted vote in its group (module doc, step 0):
    with probabilities, the sum of the values of the group's responses giving the same answer over
    the group's size; with unbounded scores, their mean plus the log of the answer's share. A
    response without an answer (None) is an answer of its own. Null values stay null and do not
    count in the group's size."""
    out = values.copy()
    keys = [("", i) if a is None else (a,) for i, a in enumerate(answers)]
    for g in np.unique(groups):
        rows = np.nonzero((groups == g) & ~np.isnan(values))[0]
        if not len(rows):
            continue
        same: dict = {}
        for i in rows:
            same.setdefault(keys[i], []).append(i)
        for members in same.values():
            total = float(values[members].sum())
            share = len(members) / len(rows)
            out[members] = total / len(rows) if bounded else total / len(members) + np.log(share)
    return out


def _auroc_enough(score: np.ndarray, positive: np.ndarray) -> Optional[float]:
    from orchestrator.evaluation import auroc

    return auroc(score, positive) if min(int(positive.sum()), int((~positive).sum())) >= MIN_PER_CLASS else None


class LearnedRewards(RewardColumns):
    """The credit step's treatment of learned reward columns (see the module doc); its window of
    labelled (score, label) rows and the guard's state are checkpointed with the loop."""

    name = "learned_rewards"

    def __init__(self, config):
        self.cfg: JudgeCreditConfig = config.judge_credit
        self.sources = [r.name for r in (*config.judge_rewards(), *config.model_rewards(), *config.laser_rewards())]
        self.label = self.cfg.label_source or config.accuracy_source()
        self.history: dict[str, list[list[list[float]]]] = {s: [] for s in self.sources}  # [batch][score, label]
        self.guarded: dict[str, bool] = {s: False for s in self.sources}
        self._metrics: dict = {}
        self._fill_weight = 1.0

    def _window(self, source: str) -> tuple[np.ndarray, np.ndarray]:
        rows = [r for batch in self.history[source] for r in batch]
        if not rows:
            return np.zeros(0), np.zeros(0)
        arr = np.asarray(rows, np.float64)
        return arr[:, 0], arr[:, 1]

    def __call__(self, table: pa.Table) -> pa.Table:
        from orchestrator.evaluation import auroc, rank_quality

        names = table.schema.names
        if B.REWARD_PREFIX + self.label not in names:
            raise B.BatchError(f"judge_credit reads the verifier's labels from `{B.REWARD_PREFIX}{self.label}`; the "
                               f"batch has {names}")
        label = table.column(B.REWARD_PREFIX + self.label).to_numpy(zero_copy_only=False).astype(np.float64)
        groups = B.group_index(table)
        probe = probe_mask(table)  # verifier.probe_share: measure on the prompts no judge trains on
        self._metrics, trust = {}, []
        answers = self._answers(table) if self.cfg.weighted_vote is not None else None
        for s in self.sources:
            col = B.REWARD_PREFIX + s
            if col not in names:
                continue
            values = table.column(col).to_numpy(zero_copy_only=False).astype(np.float64)
            if self.cfg.weighted_vote is not None:
                values = weighted_vote(values, groups, answers, probabilities(values))
            both = ~np.isnan(values) & ~np.isnan(label)
            measured = both if probe is None else both & probe
            self.history[s] = (self.history[s] + [np.stack([values[measured], label[measured] >= 0.5], 1).tolist()])[-self.cfg.window:]
            score, truth = self._window(s)
            positive = truth >= 0.5
            enough = min(int(positive.sum()), int((~positive).sum())) >= MIN_PER_CLASS
            auc = auroc(score, positive) if enough else None
            if auc is not None:
                trust.append(min(1.0, max(0.0, 2 * auc - 1)))
            now = np.asarray(self.history[s][-1], np.float64).reshape(-1, 2)
            now_pos = now[:, 1] >= 0.5
            now_auc = _auroc_enough(now[:, 0], now_pos)
            m = {"auroc": auc, "auroc_batch": now_auc,
                 "pairs_ordered": rank_quality(values[both], label[both] >= 0.5, groups[both])["pairs_ordered"]
                 if both.any() else None}
            if probe is not None:  # the same batch's rows the judge may have trained on, for the gap
                m["auroc_trained"] = _auroc_enough(values[both & ~probe], label[both & ~probe] >= 0.5)
                m["probe_rows"] = float(measured.sum())
            if self.cfg.min_auroc is not None and auc is not None:
                self.guarded[s] = min(a for a in (auc, now_auc) if a is not None) < self.cfg.min_auroc
            m["guard"] = float(self.guarded[s]) if self.cfg.min_auroc is not None else None
            if self.guarded[s]:
                values = np.full_like(values, np.nan)
            elif self.cfg.confidence != "raw" and enough:
                bounded = probabilities(score)
                a, b = platt(to_logit(score, bounded), truth)
                values = 1 / (1 + np.exp(-(a * to_logit(values, bounded) + b)))
                m.update(calib_slope=a, calib_bias=b, uncalibrated=0.0)
                if self.cfg.confidence == "gated":
                    values, m["gated_frac"] = gate_unsure(values, groups, self.cfg.gate_band)
            elif self.cfg.confidence != "raw":
                # too few labelled rows to calibrate yet: a probability (a judge's P(yes)) enters as
                # it is; a score that is not one (a reward model's, LaSeR's) waits, since beside the
                # verifier's 0/1 it would set the advantage's scale by its units alone
                m["uncalibrated"] = 1.0
                if not probabilities(values):
                    values = np.full_like(values, np.nan)
            if self.cfg.min_spread > 0 and not self.guarded[s]:
                values, m["flat_groups_frac"] = group_flatten(values, groups, self.cfg.min_spread)
            table = B.replace_column(table, col, pa.array(values.astype(np.float32), pa.float32(), mask=np.isnan(values)))
            self._metrics.update({f"learned/{s}/{k}": v for k, v in m.items() if v is not None})
        if self.cfg.fill_weight == "auroc":
            self._fill_weight = min(trust) if trust else 1.0
        else:
            self._fill_weight = float(self.cfg.fill_weight)
        if self.cfg.fill_weight != 1.0:
            self._metrics["learned/fill_weight"] = self._fill_weight
        return table

    def _answers(self, table: pa.Table) -> list:
        from actors.rewards.label_free import extract_answer

        return [extract_answer(r or "", self.cfg.weighted_vote) for r in table.column("response").to_pylist()]

    def advantage_scale(self, table: pa.Table) -> Optional[np.ndarray]:
        """`fill_weight` on the rows the verifier did not label, 1 on the others (None: all 1)."""
        if self.cfg.fill_weight == 1.0:
            return None
        label = table.column(B.REWARD_PREFIX + self.label).to_numpy(zero_copy_only=False).astype(np.float64)
        return np.where(np.isnan(label), self._fill_weight, 1.0).astype(np.float32)

    def metrics(self) -> dict:
        return dict(self._metrics)

    def state_dict(self) -> dict:
        return {"history": self.history, "guarded": self.guarded}

    def load_state_dict(self, state: dict) -> None:
        self.history.update({k: v for k, v in state.get("history", {}).items() if k in self.history})
        self.guarded.update({k: bool(v) for k, v in state.get("guarded", {}).items() if k in self.guarded})
