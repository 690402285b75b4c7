"""LaSeR's self-verification warm-up (`laser.warmup_steps`). A 1M-parameter policy does not rank its
own samples by r out of the box, and RL's MSE on a quarter of the prompts teaches it too slowly
(README, "Self-rewarding recipes"). So before RL the policy is trained on pairs of a correct and a
wrong sample of one training prompt, labelled by the verifier: MSE between r and the label, plus a
small NLL on the correct samples. The samples are re-drawn from the policy being trained every
`laser.warmup_resample` steps: trained on a fixed earlier sampler's errors, r learns to catch those
and not the policy's own (measured: best-of-8 no better than a random pick). Cached like the SFT
warm-up; the verifier labels the warm-up's samples, as it labels a quarter of the prompts in RL."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from actors import batch as B
from orchestrator.channels import Channel
from orchestrator.judge_warmup import labelled_samples
from orchestrator.warmup import cache_key

MARKER = "laser_warmup.json"
_EVAL_SEQ = -3_000_000  # request numbers of the warm-up's own samples, apart from the run's


def cache_path(config) -> Path:
    laser = config.laser.model_dump(include={k for k in config.laser.model_dump() if k.startswith("warmup")}
                                    | {"token", "beta", "c"})
    return (Path(config.warmup.cache_dir).expanduser().parent / "laser" /
            cache_key(config, {"laser": laser, "kind": "laser", "rollout": config.rollout.model_dump(),
                               "label": config.label_source(config.laser)}))


def cached_laser(config) -> tuple[Path | None, dict]:
    path = cache_path(config)
    if config.warmup.cache and (path / MARKER).is_file():
        return path, json.loads((path / MARKER).read_text())
    return None, {}


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


async def laser_warm_up(ctx, fallback_dir: Path) -> dict:
    from orchestrator.evaluation import greedy_accuracy, self_reward_quality

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
    prompts = ctx.prompts.train
    if "labelled" in prompts.schema.names:  # only the prompts the verifier labels (verifier.fraction)
        prompts = prompts.filter(prompts.column("labelled"))
    prompts = prompts.slice(0, min(laser.warmup_prompts, prompts.num_rows))
    steps, stats, drawn = 0, {}, []
    while steps < laser.warmup_steps:
        samples = await labelled_samples(ctx, prompts, _EVAL_SEQ - 1000 * (steps + 1))
        label = samples.column(key).to_numpy(zero_copy_only=False).astype(np.float64)
        pairs = pair_indices(label, B.group_index(samples))  # unlabelled (NaN) rows join neither side
        drawn.append(len(pairs))
        if not pairs:
            raise RuntimeError(f"self-verification warm-up: none of {prompts.num_rows} training prompts has both "
                               f"a correct and a wrong sample at step {steps}; nothing to align r with")
        n = min(laser.warmup_resample, laser.warmup_steps - steps)
        batches = [pair_batch(samples, pairs, laser.warmup_pairs, rng) for _ in range(n)]
        stats = await learner.call("laser_align_steps", batches, laser.warmup_lr, laser.warmup_nll, table=False)
        steps += n
        await channel.publish(0)  # the next samples come from the policy as trained so far
        ctx.progress.print(f"self-verification warm-up: step {steps}/{laser.warmup_steps}, mse "
                           f"{stats['laser_warmup/mse']:.3f}, nll {stats['laser_warmup/nll']:.3f}, "
                           f"sample accuracy {float(np.mean(label[~np.isnan(label)] >= 0.5)):.3f}")
    await learner.call("end_warmup", table=False)
    after = await self_reward_quality(ctx, seq=_EVAL_SEQ)
    accuracy = (await greedy_accuracy(ctx))["eval/accuracy"]
    ctx.progress.print(f"self-verification warm-up: after {steps} steps: {_quality(after)}; "
                       f"held-out greedy accuracy {accuracy:.3f}")
    info = {"laser_warmup/steps": steps, "laser_warmup/pairs_min": min(drawn, default=0),
            **{f"laser_warmup/{k[5:]}_before": v for k, v in before.items()},
            **{f"laser_warmup/{k[5:]}_after": v for k, v in after.items()},
            **stats, "laser_warmup/accuracy_after": accuracy, "laser_warmup/time_s": time.perf_counter() - started}
    path = cache_path(cfg) if cfg.warmup.cache else Path(fallback_dir)
    await learner.call("save", str(path), False, table=False)
    (path / MARKER).write_text(json.dumps(info))
    return {**info, "path": str(path)}


def _quality(q: dict) -> str:
    best = next(v for k, v in q.items() if k.startswith("eval/best_of_") and k.endswith("_accuracy"))
    return (f"AUROC {_fmt(q['eval/self_reward_auroc'])}, pairs ordered {_fmt(q['eval/self_reward_pairs_ordered'])}, "
            f"best-of-N {best:.3f} vs random pick {q['eval/random_pick_accuracy']:.3f}")


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"
