"""Self-Rewarding LM (Yuan et al. 2024): the policy samples, judges its own samples, and trains on
preference pairs it made itself, iteration after iteration — no verifier in the training loop
(the verifier only measures held-out accuracy).

Per iteration i, starting from model i:
  1. snapshot model i (the reference of this iteration's loss; saved under iterations/iter_<i>);
  2. sample `rollout.samples_per_prompt` responses for `iterations.prompts` prompts and judge them
     with model i (the judge shares the policy's weights: `rewards: [{name: ..., judge: true}]`);
  3. pair each prompt's best with its worst response (skip ties and gaps below `iterations.margin`);
     CREAM keeps or weights pairs by the consistency of this and the previous iteration's judgments;
     anchored rejection takes the rejected response from the initial model's samples;
  4. train `iterations.epochs` epochs on the pairs (DPO, IPO, SimPO or RAFT), in steps of
     `iterations.batch_pairs`; future-guided chosen re-draws the chosen responses with the model
     after the first epoch; then model i+1 starts the next iteration.
A checkpoint taken inside an iteration holds its pairs, phase and position: a resumed run continues
the same iteration.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import ray
from pydantic import Field, field_validator

from actors import batch as B
from orchestrator.batch_source import BatchSource, PairPiece
from orchestrator.config import Section, registered
from orchestrator.evaluation import greedy_accuracy, judge_quality
from orchestrator.probes import probe_mask
from orchestrator.recipes import Sources
from orchestrator.roles import RoleSpec
from pipelines.grpo import GRPO, publish
from pipelines.stages.judge import JudgeConfig


class IterationsConfig(Section):
    """Iterative preference optimisation (recipe self_rewarding; Yuan et al. 2024): per iteration,
    sample `rollout.samples_per_prompt` responses for `prompts` prompts, judge them with the policy
    itself, pair the best with the worst, train `epochs` epochs with `loss` against the iteration's
    starting model as reference, then start the next iteration from the trained model."""
    iterations: int = Field(3, ge=1)
    prompts: int = Field(256, gt=0)  # an iteration's prompts, drawn rollout.prompts_per_step at a time
    epochs: int = Field(2, ge=1)
    batch_pairs: int = Field(64, gt=0)
    loss: str = "dpo"  # a preference loss (dpo, ipo, simpo) or raft (SFT on the chosen responses)
    beta: float = Field(0.1, gt=0)  # dpo / simpo beta; ipo uses tau = beta
    margin: float = Field(0.0, ge=0)  # skip pairs whose judge scores differ by less
    # Iterative RPO (Pang et al. 2024): + nll_weight x the token-mean NLL of the chosen responses. A
    # preference loss alone can lower the likelihood of chosen and rejected alike; this keeps it.
    nll_weight: float = Field(0.0, ge=0)
    # CREAM (Wang et al. 2024): keep (filter) or weight pairs by how consistently this iteration's and
    # the previous iteration's judge rank the group's responses (Kendall's tau, mapped to [0, 1]).
    cream: Literal["none", "filter", "weight"] = "none"
    cream_threshold: float = Field(0.5, ge=0, le=1)
    # Temporal Self-Rewarding (Wang et al. 2025): rejected responses drawn from the initial model
    # (anchored rejection), chosen responses re-drawn with the model after the first epoch
    # (future-guided chosen).
    anchored_rejection: bool = False
    future_chosen: bool = False
    # where the verifier labels a prompt (verifier.fraction), its label is the response's score in
    # building pairs (the judge's breaks ties among same-label responses), and the labelled rows
    # measure the judge (iter/judge_auroc); with judge_credit.min_auroc an iteration whose judge is
    # below it on them trains on no pairs of unlabelled prompts (iter/guarded): the guard of
    # orchestrator/judge_credit.py, for a recipe without a credit step
    labels: bool = False
    # SPARK's judge loss between iterations (actors/objectives/self_judge.py): every preference step
    # also trains the policy as a judge, judge_coef x the cross-entropy of its verdict on up to
    # `judge_per_update` of the iteration's verifier-labelled samples (needs labels). Without it the
    # judge is fitted once, at the warm-up, and DPO on the shared weights wears it down iteration by
    # iteration. 0: off
    judge_coef: float = Field(0.0, ge=0)
    judge_per_update: int = Field(64, ge=1)

    def cross_check(self, config) -> None:
        if self.judge_coef and not self.labels:
            raise ValueError(f"iterations.judge_coef={self.judge_coef} trains the judge on the iteration's "
                             "verifier-labelled samples; iterations.labels is false, so there are none: set "
                             "iterations.labels=true")
        if self.judge_coef and config.judge.separate:
            raise ValueError(f"iterations.judge_coef={self.judge_coef} trains the policy as its own judge; with "
                             "judge.separate=true a model apart judges: set one of them off")

    def objective(self, config) -> dict:
        """The self_judge objective the preference step carries (judge_coef > 0)."""
        return {"name": "self_judge", "coef": self.judge_coef, "per_update": self.judge_per_update,
                "template": config.judge.template, "yes": config.judge.yes, "no": config.judge.no}

    @field_validator("loss")
    @classmethod
    def _known_loss(cls, v: str) -> str:
        from actors.algorithms import PREFERENCE_LOSSES
        if v == "raft":
            return v
        return registered(v, PREFERENCE_LOSSES)


def kendall_consistency(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall's tau between two judgments of one group's responses, mapped to [0, 1] (1: same
    order). Pairs tied in either judgment do not count; no comparable pair gives 0.5."""
    i, j = np.triu_indices(len(a), k=1)
    da, db = np.sign(a[i] - a[j]), np.sign(b[i] - b[j])
    valid = (da != 0) & (db != 0) & ~np.isnan(da) & ~np.isnan(db)
    if not valid.any():
        return 0.5
    return float((1 + np.mean(da[valid] * db[valid])) / 2)


class IterationSource(BatchSource):
    """Train batches of self-made preference pairs, iteration by iteration (see the module doc)."""

    def __init__(self, ctx, recipe, state: dict | None = None):
        state = state or {}
        self.ctx, self.recipe = ctx, recipe
        self.cfg = ctx.config.iterations
        self.iteration = state.get("iteration", 0)
        self.phase = state.get("phase", "collect")
        self.epoch, self.position = state.get("epoch", 0), state.get("position", 0)
        self.counts: Counter = Counter(state.get("counts", {}))
        self.pairs: pa.Table | None = (state.get("tables") or {}).get("pairs")
        # the iteration's verifier-labelled samples, for the judge loss (iterations.judge_coef)
        self.examples: pa.Table | None = (state.get("tables") or {}).get("examples")
        self._examples_ref = None
        self.order = self._shuffle() if self.pairs is not None else None
        self.iteration_info: dict = dict(state.get("iteration_info", {}))
        self.snapshots = Path(ctx.run_dir) / "iterations"

    def _shuffle(self) -> np.ndarray:
        rng = np.random.default_rng([self.ctx.config.seed, self.iteration, self.epoch])
        weights = (self.pairs.column("weight").to_numpy() if "weight" in self.pairs.schema.names
                   else np.ones(self.pairs.num_rows))
        # CREAM's weighting as sampling: each epoch draws pairs in proportion to their consistency
        if self.ctx.config.iterations.cream == "weight" and weights.sum() > 0:
            return rng.choice(self.pairs.num_rows, self.pairs.num_rows, replace=True, p=weights / weights.sum())
        return rng.permutation(self.pairs.num_rows)

    async def take(self) -> list[PairPiece] | None:
        while not self.ctx.stop_requested:
            if self.phase == "collect":
                if self.iteration >= self.cfg.iterations:
                    return None
                await self._collect()
                continue  # an iteration without pairs goes on to collect the next one
            if self.position >= len(self.order):
                self.epoch, self.position = self.epoch + 1, 0
                if self.epoch >= self.cfg.epochs:
                    self.iteration, self.phase, self.epoch = self.iteration + 1, "collect", 0
                    continue
                if self.cfg.future_chosen and self.epoch == 1:
                    await self._refresh_chosen()
                self.order = self._shuffle()
            idx = self.order[self.position:self.position + self.cfg.batch_pairs]
            self.position += len(idx)
            self.counts["pairs/consumed"] += len(idx)
            batch = self.pairs.take(pa.array(idx)).select(["prompt", "chosen", "rejected"])
            return [PairPiece(ray.put(batch), len(idx), {"iteration": self.iteration, "epoch": self.epoch})]
        return None

    def last_batch(self) -> bool:
        """The last iteration's last epoch has no pairs left (the next take ends the run)."""
        return (self.phase == "train" and self.iteration >= self.cfg.iterations - 1
                and self.epoch >= self.cfg.epochs - 1 and self.order is not None and self.position >= len(self.order))

    # ---- collecting pairs ----------------------------------------------------------------------------
    async def _sample_and_judge(self, prompts: pa.Table, seq0: int) -> pa.Table:
        ctx = self.ctx
        gen, judge = ctx.pools["generator"], self._judge_pool()

        async def one(i, chunk):
            table, _ = await gen.call("generate", chunk, seq=seq0 + i, versioned=True)
            judged, _ = await judge.call("judge", table, versioned=True)
            if self.cfg.labels:  # the verifier labels the prompts it labels (verifier.fraction)
                judged, _ = await ctx.pools["verifier"].call("score", judged)
            return judged

        chunks = ctx.split(prompts, max(1, prompts.num_rows // 32))
        refs = await asyncio.gather(*[one(i, c) for i, c in enumerate(chunks)])
        return B.concat(list(await asyncio.gather(*refs)))

    def _with_labels(self, samples: pa.Table, judge: np.ndarray) -> tuple[np.ndarray, dict]:
        """Scores for pairing: the verifier's label plus a 1e-3 share of the judge's score where the
        prompt is labelled (same-label responses ordered by the judge), the judge's score elsewhere,
        or NaN there when the guard is on (the judge's AUROC on the labelled rows, the probes' alone
        with verifier.probe_share, below judge_credit.min_auroc); and the iteration's judge AUROC and guard."""
        from orchestrator.evaluation import auroc

        column = B.REWARD_PREFIX + self.ctx.config.accuracy_source()
        label = samples.column(column).to_numpy(zero_copy_only=False).astype(np.float64)
        known = ~np.isnan(label) & ~np.isnan(judge)
        probe = probe_mask(samples)  # verifier.probe_share: the guard reads prompts no judge trained on
        measured = known if probe is None else known & probe
        auc = auroc(judge[measured], label[measured] >= 0.5) if measured.any() else None
        floor = self.ctx.config.judge_credit.min_auroc
        guarded = floor is not None and auc is not None and auc < floor
        scores = np.where(np.isnan(label), np.nan if guarded else judge, (label >= 0.5) + 1e-3 * np.nan_to_num(judge))
        return scores, {"iter/judge_auroc": auc, "iter/guarded": float(guarded), "iter/labelled_frac": float(known.mean())}

    async def _judge_with(self, table: pa.Table, model_dir: Path) -> np.ndarray:
        """Judge `table` with an earlier snapshot's weights, then put the current weights back."""
        judge = self._judge_pool()
        await judge.broadcast("update_weights_from", str(model_dir), judge.version)
        judged, _ = await judge.call("judge", table)
        scores = self._scores(await judged)
        await judge.set_weights(*await judge.payload())
        return scores

    def _judge_pool(self):
        """Where the policy judges: the generators, or (judge.separate) the judge pool, which adds
        the judge vector to each version it loads."""
        return self.ctx.pools.get("judge", self.ctx.pools["generator"])

    def _scores(self, table: pa.Table) -> np.ndarray:
        name = self.ctx.config.judge_rewards()[0].name
        return table.column(B.REWARD_PREFIX + name).to_numpy(zero_copy_only=False).astype(np.float64)

    async def _collect(self) -> None:
        from actors.algorithms.pairs import best_worst_pairs

        ctx, cfg = self.ctx, self.cfg
        learner = ctx.pools["policy_learner"]
        snapshot = self.snapshots / f"iter_{self.iteration}"
        await learner.call("snapshot_reference", str(snapshot), table=False)
        prompts = draw_prompts(ctx.sampler, cfg.prompts, ctx.config.rollout.prompts_per_step)
        seq0 = 10_000 * (self.iteration + 1)  # names: iteration-scoped, the same on a resumed run
        samples = await self._sample_and_judge(prompts, seq0)
        scores = self._scores(samples)
        judge_errors = int(np.isnan(scores).sum())  # the judge's unparsed verdicts, before labels or the guard
        groups = B.group_index(samples)
        guard = {}
        if cfg.labels:
            scores, guard = self._with_labels(samples, scores)
            if cfg.judge_coef:
                self.examples, self._examples_ref = labelled_rows(samples, ctx.config.fn_rewards()[0].name), None
        chosen, rejected, stats = best_worst_pairs(groups, scores, margin=cfg.margin)
        rejected_text = samples.column("response").take(pa.array(rejected, pa.int64())).to_pylist()
        if cfg.anchored_rejection:  # the worst of the initial model's samples, judged by model i
            anchor = await self._anchor_samples(prompts, seq0 + 5_000)
            a_scores, a_groups = self._scores(anchor), B.group_index(anchor)
            worst = {}
            for row in np.argsort(a_scores, kind="stable"):  # NaN sorts last: never the worst
                if not np.isnan(a_scores[row]):
                    worst.setdefault(anchor.column("prompt")[int(row)].as_py(), int(row))
            for k, row in enumerate(chosen):
                prompt = samples.column("prompt")[int(row)].as_py()
                if prompt in worst:
                    rejected_text[k] = anchor.column("response")[worst[prompt]].as_py()
        weight = np.ones(len(chosen))
        if cfg.cream != "none" and self.iteration > 0:
            previous = await self._judge_with(samples, self.snapshots / f"iter_{self.iteration - 1}")
            consistency = {g: kendall_consistency(scores[groups == g], previous[groups == g]) for g in np.unique(groups)}
            weight = np.array([consistency[groups[c]] for c in chosen])
            if cfg.cream == "filter":
                keep = weight >= cfg.cream_threshold
                chosen, rejected, weight = chosen[keep], rejected[keep], weight[keep]
                rejected_text = [r for r, k in zip(rejected_text, keep) if k]
                stats["skipped_inconsistent"] = int((~keep).sum())
        take = lambda col, idx: samples.column(col).take(pa.array(idx, pa.int64())).to_pylist()  # noqa: E731
        self.pairs = B.pair_table(take("prompt", chosen), take("response", chosen), rejected_text,
                                  extra={"weight": pa.array(weight, pa.float64()),
                                         "chosen_score": pa.array(scores[chosen]),
                                         "rejected_score": pa.array(scores[rejected])})
        self.iteration_info = {f"iter/{k}": v for k, v in stats.items()}
        self.iteration_info.update(guard)
        valid = scores[~np.isnan(scores)]
        self.iteration_info.update({"iter/index": self.iteration, "iter/judge_mean": float(valid.mean()) if len(valid) else None,
                                    "iter/judge_errors": judge_errors,
                                    "iter/margin_mean": float(np.mean(scores[chosen] - scores[rejected])) if len(chosen) else None})
        self.counts["samples/dispatched"] += samples.num_rows
        self.phase, self.epoch, self.position = "train", 0, 0
        if self.pairs.num_rows == 0:
            ctx.progress.print(f"iteration {self.iteration}: no pairs (all groups tied or below the margin)")
            self.iteration, self.phase = self.iteration + 1, "collect"
            return
        self.order = self._shuffle()
        ctx.progress.print(f"iteration {self.iteration}: {self.pairs.num_rows} pairs from {cfg.prompts} prompts "
                           f"(skipped: {stats['skipped_tie']} tied, {stats['skipped_margin']} below margin, "
                           f"{stats['skipped_unscored']} unscored)")

    async def _anchor_samples(self, prompts: pa.Table, seq0: int) -> pa.Table:
        """Samples of the initial model (iteration 0's snapshot), judged by the current model."""
        gen = self.ctx.pools["generator"]
        await gen.broadcast("update_weights_from", str(self.snapshots / "iter_0"), gen.version)

        async def one(i, chunk):
            table, _ = await gen.call("generate", chunk, seq=seq0 + i)
            return table

        chunks = self.ctx.split(prompts, max(1, prompts.num_rows // 32))
        tables = await asyncio.gather(*[one(i, c) for i, c in enumerate(chunks)])
        await gen.set_weights(*await gen.payload())
        judge = self._judge_pool()
        judged = await asyncio.gather(*[judge.call("judge", t) for t in tables])
        return B.concat(list(await asyncio.gather(*[t for t, _ in judged])))

    async def _refresh_chosen(self) -> None:
        """Future-guided chosen: re-draw each pair's chosen response with the model after epoch 1
        (the best of its new samples by the current judge), keeping the rejected one."""
        prompts = pa.table({"prompt_id": self.pairs.column("prompt"), "prompt": self.pairs.column("prompt")})
        fresh = await self._sample_and_judge(prompts, 10_000 * (self.iteration + 1) + 7_000)
        scores, groups = self._scores(fresh), B.group_index(fresh)
        best = {}
        for g in np.unique(groups):
            rows = np.nonzero(groups == g)[0]
            ok = rows[~np.isnan(scores[rows])]
            if len(ok):
                best[fresh.column("prompt")[int(rows[0])].as_py()] = fresh.column("response")[int(ok[np.argmax(scores[ok])])].as_py()
        chosen = [best.get(p, c) for p, c in zip(self.pairs.column("prompt").to_pylist(),
                                                 self.pairs.column("chosen").to_pylist())]
        self.pairs = B.replace_column(self.pairs, "chosen", pa.array(chosen, pa.string()))
        self.iteration_info["iter/chosen_refreshed"] = len(best)

    # ---- bookkeeping --------------------------------------------------------------------------------
    def accounting(self) -> dict:
        return {**self.counts, "iter/index": self.iteration}

    async def snapshot(self) -> dict:
        return {"iteration": self.iteration, "phase": self.phase, "epoch": self.epoch, "position": self.position,
                "counts": dict(self.counts), "iteration_info": self.iteration_info, "pieces": [],
                "tables": {"pairs": self.pairs, **({"examples": self.examples} if self.examples is not None else {})}
                if self.pairs is not None and self.phase == "train" else {}}

    def examples_ref(self):
        """The iteration's labelled samples in the object store (put once per iteration), or None."""
        if self.examples is None or not self.examples.num_rows:
            return None
        if self._examples_ref is None:
            self._examples_ref = ray.put(self.examples)
        return self._examples_ref


def draw_prompts(sampler, total: int, per_draw: int) -> pa.Table:
    """An iteration's `total` prompts as draws of at most `per_draw` (`rollout.prompts_per_step`), as
    the step-wise recipes draw them: with `verifier.labelled_share` each draw keeps the share, and a
    labelled pool smaller than an iteration's labelled half recurs across it (epoch after epoch, as it
    does over steps) instead of stopping the run. A prompt drawn twice gets two groups (the
    generator names groups by draw)."""
    parts, left = [], total
    while left > 0:
        parts.append(sampler.next(min(per_draw, left)))
        left -= parts[-1].num_rows
    return pa.concat_tables(parts)


def labelled_rows(samples: pa.Table, label: str) -> pa.Table:
    """The samples the verifier labelled, probes aside (`prompt`, `response` and the label's reward
    column): what the judge loss trains on."""
    column = B.REWARD_PREFIX + label
    if column not in samples.schema.names:
        return samples.slice(0, 0).select(["prompt", "response"])
    known = ~np.isnan(samples.column(column).to_numpy(zero_copy_only=False).astype(np.float64))
    probe = probe_mask(samples)  # verifier.probe_share: no judge learns from the probes
    if probe is not None:
        known &= ~probe
    return samples.filter(pa.array(known)).select(["prompt", "response", column])


class SelfRewarding(GRPO):
    name = "self_rewarding"
    separate_judge = True  # each iteration's policy judges its pairs: on the generators, or a judge pool apart
    online_judge = False  # its judge is each iteration's policy (plus the judge vector where apart)
    selects_labels = False  # its pairs' labels are the dataset's fixed subset (iterations.labels)
    settings = {"judge": JudgeConfig, "iterations": IterationsConfig}  # the policy judges its pairs

    @classmethod
    def roles(cls, config, sources: Sources) -> dict[str, RoleSpec]:
        if not config.judge_rewards():
            raise ValueError("recipe self_rewarding needs a judge reward source, e.g. rewards: "
                             "[{name: judge, judge: true}, {name: correct, fn: integer_match, weight: 0}]")
        roles = super().roles(config, sources)
        if not config.judge.separate:
            roles.pop("judge", None)  # the generators judge: one pool holds each iteration's weights
        return roles

    @classmethod
    def extra_objectives(cls, config) -> list[dict]:
        it = getattr(config, "iterations", None)
        return [it.objective(config)] if it is not None and it.judge_coef else []

    @classmethod
    def credit(cls, config, sources: Sources):
        """None: the batches are preference pairs, trained on as they are."""
        return None

    def make_source(self, ctx, state):
        self.source = IterationSource(ctx, self, state)
        return self.source

    def step_budget(self, config) -> tuple[int, bool]:
        """Its iterations end the run: each trains at most `epochs` passes over `prompts` pairs in
        steps of `batch_pairs` (fewer where pairs are skipped)."""
        it = config.iterations
        return min(config.train.max_steps, it.iterations * it.epochs * -(-it.prompts // it.batch_pairs)), True

    async def score_piece(self, ctx, table):  # pairs are built by the source, not scored per piece
        return table, {}

    async def learn(self, ctx, tables: list, dump_path: str | None) -> dict:
        cfg = ctx.config.iterations
        params = {} if cfg.loss == "raft" else {"tau": cfg.beta} if cfg.loss == "ipo" else {"beta": cfg.beta}
        metrics = await ctx.pools["policy_learner"].call("train_preference", *tables, loss=cfg.loss, params=params,
                                                         nll_weight=cfg.nll_weight, examples=self.source.examples_ref(),
                                                         table=False)
        await publish(ctx, "policy", metrics["version"])
        return {**metrics, **self.source.iteration_info, "iter/epoch": self.source.epoch}

    async def evaluate(self, ctx) -> dict:
        responses: list = []
        out = await greedy_accuracy(ctx, keep=responses)
        out.update(await judge_quality(ctx, out, getattr(self, "_last_eval", None), responses))
        self._last_eval = out
        return out
