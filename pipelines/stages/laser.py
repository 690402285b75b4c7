"""LaSeR's self-verification warm-up (`laser.warmup_steps`). A 1M-parameter policy does not rank its
own samples by r out of the box, and RL's MSE on a quarter of the prompts teaches it too slowly
(docs/benchmarks.md, "Self-rewarding recipes"). So before RL the policy is trained on pairs of a correct and a
wrong sample of one training prompt, labelled by the verifier: MSE between r and the label, plus a
small NLL on the correct samples. The samples are re-drawn from the policy being trained every
`laser.warmup_resample` steps: trained on a fixed earlier sampler's errors, r learns to catch those
and not the policy's own (measured: best-of-8 no better than a random pick). Cached like the SFT
warm-up; the verifier labels the warm-up's samples, as it labels a quarter of the prompts in RL."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal, Optional

import numpy as np
import pyarrow as pa
from pydantic import Field

from actors import batch as B
from orchestrator.channels import Channel
from orchestrator.config import Section
from orchestrator.evaluation import greedy_accuracy, labelled_samples, self_reward_quality
from orchestrator.probes import trainable_labelled
from orchestrator.stage_cache import fmt, save_stage, stage_path
from orchestrator.stages import StageProgress, stop_if_requested
from pipelines.laser_reward import save_c, with_offset
from pipelines.stages import PolicyWarmup


class LaserConfig(Section):
    """LaSeR (Yang et al. 2025, last-token self-rewarding): the self-reward of a response is
    r = beta * (log pi(token | prompt, response) - c), read at the cost of one extra token; the
    learner adds mse_weight * (r - verifier reward)^2 where the verifier labelled the sample, and the
    self-reward stands in for the verifier where it did not (`aggregate.fill`)."""
    token: str = "Y"
    beta: float = Field(0.25, gt=0)
    # None: c is the mean log pi(token | x, y) of the first train batch (so r starts near 0), kept
    # for the run; beta * -c must exceed the verifier's top reward for r to be able to reach it
    c: Optional[float] = None
    mse_weight: float = Field(1.0, ge=0)
    # weight the MSE so correct and wrong labelled samples count half each (class re-weighting)
    balance: bool = False
    label_source: Optional[str] = None  # the verifier source r is aligned with (default: the first fn)
    best_of: int = Field(8, ge=1)  # evaluation: best-of-N by self-reward against a random pick
    eval_prompts: int = Field(100, gt=0)
    # Self-verification warm-up before RL (0 steps: none; cached like the SFT warm-up): MSE on r plus
    # warmup_nll x the NLL of the correct samples, on pairs of a correct and a wrong sample of one
    # training prompt drawn from the policy itself and re-drawn every warmup_resample steps (r must
    # learn the errors of the sampler it will rank, not of an earlier one).
    warmup_steps: int = Field(0, ge=0)
    warmup_lr: float = Field(5e-4, gt=0)
    warmup_nll: float = Field(0.05, ge=0)
    # whose NLL: the correct samples' (it also teaches the task from the labels) or every sample's,
    # each kind weighed by its share of the draw, not of the half-correct pairs (label-blind: it only
    # holds the policy where it was, as the judging warm-ups' `warmup_task: own`)
    warmup_nll_on: Literal["correct", "all"] = "correct"
    warmup_pairs: int = Field(64, gt=0)  # pairs per step
    warmup_resample: int = Field(100, gt=0)
    warmup_prompts: int = Field(2048, gt=0)

    def generator_args(self, config, args: dict) -> dict:
        """The generators return LaSeR's `laser_logprob` (their `laser` role argument) where a reward
        source is `laser: true`."""
        from actors.laser import LaserSpec

        return {"laser": LaserSpec(self.token)} if config.laser_rewards() else {}

    def objective(self, config) -> dict:
        """The policy learner's laser_align objective with these settings (actors/objectives/laser_align.py)."""
        return {"name": "laser_align", "token": self.token, "beta": self.beta, "mse_weight": self.mse_weight,
                "balance": self.balance, "label": config.label_source(self)}

    def cross_check(self, config) -> None:
        if config.laser_rewards() and self.warmup_steps and config.verifier.fraction == 0:
            raise ValueError(f"laser.warmup_steps={self.warmup_steps} trains on verifier-labelled "
                             "prompts, but verifier.fraction=0 labels none: raise it or set laser.warmup_steps=0")

MARKER = "laser_warmup.json"
_EVAL_SEQ = -3_000_000  # request numbers of the warm-up's own samples, apart from the run's
_CHUNK = 25  # optimizer steps per learner call: progress (and a stop) between them


def cache_path(config, source: str | None) -> Path:
    laser = config.laser.model_dump(include={k for k in config.laser.model_dump() if k.startswith("warmup")}
                                    | {"token", "beta", "c"})
    if laser["warmup_nll_on"] == "all":  # weighed by the draw's mix since 2026-11-28: no older cache hits
        laser["warmup_nll_all"] = "draw_share"
    return stage_path(config, "laser", source, config.label_source(config.laser), {"laser": laser})


def pair_indices(label: np.ndarray, groups: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per prompt with both kinds: the rows of its correct and of its wrong samples."""
    out = []
    for g in np.unique(groups):
        rows = np.nonzero(groups == g)[0]
        good, bad = rows[label[rows] >= 0.5], rows[label[rows] < 0.5]
        if len(good) and len(bad):
            out.append((good, bad))
    return out


def pair_batch(table: pa.Table, pairs: list, n: int, rng: np.random.Generator) -> pa.Table:
    """n pairs (fewer if fewer prompts have both kinds): a random correct and a random wrong sample
    of each of n distinct prompts, as rows [correct..., wrong...]."""
    pick = rng.choice(len(pairs), min(n, len(pairs)), replace=False)
    idx = [rng.choice(pairs[i][k]) for k in (0, 1) for i in pick]
    return table.take(pa.array(idx, pa.int64()))


async def warm_up(ctx, out_dir: Path) -> dict:
    """Align r on the policy's own labelled samples; save the policy (with its c) to `out_dir`."""
    cfg, laser = ctx.config, ctx.config.laser
    learner = ctx.pools["policy_learner"]
    channel = Channel("policy", learner, [ctx.pools["generator"]])
    key = B.REWARD_PREFIX + cfg.label_source(cfg.laser)
    rng = np.random.default_rng([cfg.seed, 23])
    started = time.perf_counter()
    await channel.publish(0)
    before = await self_reward_quality(ctx, seq=_EVAL_SEQ)
    ctx.progress.print(f"self-verification warm-up: on {laser.best_of} fresh samples of each of "
                       f"{laser.eval_prompts} held-out prompts, before: {_quality(before)}")
    prompts = trainable_labelled(ctx.prompts.train)  # labelled (verifier.fraction), not probes
    prompts = prompts.slice(0, min(laser.warmup_prompts, prompts.num_rows))
    if prompts.num_rows == 0:
        raise ValueError(f"laser.warmup_steps={laser.warmup_steps} needs verifier-labelled training prompts; "
                         f"verifier.fraction={cfg.verifier.fraction} labels none of {ctx.prompts.train.num_rows}")
    progress = StageProgress(
        ctx, "self-verification warm-up", laser.warmup_steps,
        budget=f"{laser.warmup_steps} steps (laser.warmup_steps) of {laser.warmup_pairs} (correct, wrong) pairs of the "
               f"policy's own samples of {prompts.num_rows} verifier-labelled training prompts, re-drawn every "
               f"{laser.warmup_resample} steps; cached, so later runs with the same settings skip it")
    steps, stats, drawn, samples, pairs, c, drawn_accuracy = 0, {}, [], None, [], laser.c, None
    while steps < laser.warmup_steps:
        stop_if_requested(ctx, "self-verification warm-up", steps)
        fresh = await labelled_samples(ctx, prompts, _EVAL_SEQ - 1000 * (steps + 1))
        label = fresh.column(key).to_numpy(zero_copy_only=False).astype(np.float64)
        fresh_pairs = pair_indices(label, B.group_index(fresh))  # unlabelled (NaN) rows join neither side
        accuracy = float(np.mean(label[~np.isnan(label)] >= 0.5))
        if fresh_pairs:
            samples, pairs, drawn_accuracy = fresh, fresh_pairs, accuracy
            drawn.append(len(pairs))
        elif not pairs:
            hint = ("a stronger warm start (warmup.target_accuracy)" if accuracy < 0.5 else
                    "more varied samples (rollout.temperature, rollout.samples_per_prompt)")
            raise RuntimeError(
                f"self-verification warm-up: none of {prompts.num_rows} labelled training prompts has both a "
                f"correct and a wrong sample (sample accuracy {accuracy:.3f}); try {hint} or more prompts "
                "(laser.warmup_prompts), or set laser.warmup_steps=0")
        else:
            ctx.progress.print(f"self-verification warm-up: step {steps}: no prompt has both a correct and a wrong "
                               f"sample (sample accuracy {accuracy:.3f}); training on the previous draw")
        if len(pairs) < laser.warmup_pairs and len(drawn) == 1:
            ctx.progress.print(f"self-verification warm-up: only {len(pairs)} prompts have a correct and a wrong "
                               f"sample: batches of {len(pairs)} pairs instead of laser.warmup_pairs={laser.warmup_pairs}")
        n = min(laser.warmup_resample, laser.warmup_steps - steps)
        batches = [pair_batch(samples, pairs, laser.warmup_pairs, rng) for _ in range(n)]
        if c is None:  # fixed from the first batch when laser.c leaves it open, as in RL
            c = float(np.nanmean(batches[0].column("laser_logprob").to_numpy(zero_copy_only=False)))
        batches = [with_offset(b, c) for b in batches]
        stats = {}
        for i in range(0, n, _CHUNK):  # one optimizer across the chunks: the same steps, progress between them
            part = await learner.call("call_objective", "laser_align", "align_steps", batches[i:i + _CHUNK],
                                      laser.warmup_lr, laser.warmup_nll, laser.warmup_nll_on, drawn_accuracy,
                                      table=False)
            chunk = len(batches[i:i + _CHUNK])
            stats = {k: stats.get(k, 0.0) + v * chunk / n for k, v in part.items()}  # the block's means
            progress.update(steps + i + chunk, f"mse {part['laser_warmup/mse']:.3f}, nll {part['laser_warmup/nll']:.3f}")
        stats["laser_warmup/c"] = c
        steps += n
        await channel.publish(0)  # the next samples come from the policy as trained so far
        ctx.progress.print(f"self-verification warm-up: step {steps}/{laser.warmup_steps}, mse "
                           f"{stats['laser_warmup/mse']:.3f}, nll {stats['laser_warmup/nll']:.3f} (this draw: "
                           f"{len(fresh_pairs)} prompts with pairs, sample accuracy {accuracy:.3f})")
    progress.done()
    await learner.call("end_warmup", table=False)
    after = await self_reward_quality(ctx, seq=_EVAL_SEQ)
    accuracy = (await greedy_accuracy(ctx))["eval/accuracy"]
    ctx.progress.print(f"self-verification warm-up: after {steps} steps: {_quality(after)}; "
                       f"held-out greedy accuracy {accuracy:.3f}")
    info = {"laser_warmup/steps": steps, "laser_warmup/pairs_min": min(drawn, default=0),
            **{f"laser_warmup/{k[5:]}_before": v for k, v in before.items()},
            **{f"laser_warmup/{k[5:]}_after": v for k, v in after.items()},
            **stats, "laser_warmup/accuracy_after": accuracy, "laser_warmup/time_s": time.perf_counter() - started}
    if laser.c is None and c is not None:  # a c learned from the data: the RL run from this model keeps it
        save_c(out_dir, c)
    return await save_stage(learner, out_dir, MARKER, info)


def _quality(q: dict) -> str:
    key, best = next((k, v) for k, v in q.items() if k.startswith("eval/best_of_") and k.endswith("_accuracy"))
    n = key.removeprefix("eval/best_of_").removesuffix("_accuracy")
    return (f"AUROC {fmt(q['eval/self_reward_auroc'])}, pairs ordered {fmt(q['eval/self_reward_pairs_ordered'])}, "
            f"best-of-{n} {best:.3f} vs random pick {q['eval/random_pick_accuracy']:.3f}")


class LaserWarmup(PolicyWarmup):
    name, label, marker = "laser_warmup", "self-verification warm-up", MARKER
    key, work = staticmethod(cache_path), staticmethod(warm_up)
    settings = {"laser": LaserConfig}
    rewards = ("laser",)  # its section only where a reward source is `laser:`

    def enabled(self, config, recipe) -> bool:
        return bool(config.laser_rewards() and config.laser.warmup_steps)
