"""The judging warm-up: a small model cannot judge out of the box, so before a self-rewarding run
the warm policy is fine-tuned to answer the judge prompt — `judge.yes` for responses the verifier
marks correct, `judge.no` for wrong ones — on its own samples of the training prompts, optionally
mixed with the task's SFT data (`judge.warmup_task_fraction`) (Self-Rewarding LM's evaluation
fine-tuning, with verifier labels standing in for human ones). Judge-verifier agreement on held-out samples is
measured before and after. Cached like the SFT warm-up; the verifier is used only here and for
held-out accuracy, never in the self-rewarding training loop."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Literal, Optional

import numpy as np
import pyarrow as pa
from pydantic import Field, field_validator, model_validator

from actors import batch as B
from orchestrator.channels import Channel
from orchestrator.config import Section, template_fields
from orchestrator.data import PromptSampler
from orchestrator.evaluation import labelled_samples
from orchestrator.near_misses import with_near_misses
from orchestrator.probes import probes_note, trainable_labelled
from orchestrator.stage_cache import fmt, save_stage, stage_path
from orchestrator.stages import StageProgress, stop_if_requested
from pipelines.stages import PolicyWarmup


class JudgeConfig(Section):
    """The policy judging its own samples (`rewards: [{name: ..., judge: true}]`): the probability
    of the `yes` token after a judge prompt, or numbers parsed from k sampled judgments."""
    template: str = "{prompt}{response}?"
    mode: Literal["yes_prob", "sampled"] = "yes_prob"
    yes: str = "Y"
    no: str = "N"
    samples: int = Field(4, ge=1)  # sampled mode: judgments per response
    max_new_tokens: int = Field(4, gt=0)  # sampled mode
    pattern: str = r"-?\d+(?:\.\d+)?"  # sampled mode: the score in a judgment
    scale: float = Field(1.0, gt=0)  # sampled mode: parsed score / scale
    shared: bool = True  # on the generator replicas; false: a separate judge pool on the policy channel
    # A small model cannot judge out of the box: SFT on verifier-labelled samples of the warm policy
    # (judge prompt -> yes/no), as Self-Rewarding LM's evaluation fine-tuning; cached like the warm-up.
    warmup_steps: int = Field(0, ge=0)
    warmup_lr: float = Field(1e-3, gt=0)
    warmup_batch_size: int = Field(128, gt=0)
    # share of each judging warm-up batch that repeats the task's own SFT data: without it the
    # judge format overwrites the task (measured: held-out accuracy 0.66 -> 0.00 after 300 steps)
    warmup_task_fraction: float = Field(0.5, ge=0, lt=1)
    # re-draw the judged samples from the policy being fine-tuned every this many steps (None: drawn
    # once from the warm policy, whose errors the task data then trains away)
    warmup_resample: Optional[int] = Field(None, gt=0)
    # sampled answers per labelled prompt the judge examples come from (None: rollout.samples_per_prompt).
    # Where labelled prompts are few, more answers to each give the judge more of the check to learn
    # and fewer passes over the same examples
    warmup_samples: Optional[int] = Field(None, gt=0)
    # what the task share repeats: `answers`, the task's reference answers (every training prompt's);
    # `own`, the warm policy's own greedy answers to the training prompts, right or wrong: a rehearsal
    # that keeps the task where it was without teaching it (no label the verifier did not give; the
    # scarce-label comparisons use it, so the judge's warm-up does not do the RL's job); `own_samples`,
    # the warm policy's sampled answers (`warmup_task_samples` a prompt, the rollout's temperature):
    # fine-tuning on them keeps the policy's distribution, where greedy answers collapse it (measured on
    # sorting: distinct answers in a group of 8 fell from 4.6 to 2.4 after the `own` warm-up);
    # `distill`, the same samples, each token trained towards the warm policy's whole next-token
    # distribution (the KL from a frozen copy of it, held for the warm-up) rather than the one token
    # sampled: the rehearsal without its sampling noise
    warmup_task: Literal["answers", "own", "own_samples", "distill"] = "answers"
    # own_samples, distill: sampled answers per training prompt
    warmup_task_samples: int = Field(4, gt=0)
    # a judge apart from the policy: the judging warm-up trains a copy, and what it changed (the judge
    # vector, actors/judge_vector.py) is added to each policy version in a judge pool of its own; the
    # policy starts RL where the warm-up found it (measured on sorting: the shared warm-up cost the
    # policy 0.02-0.075 of held-out accuracy and half its distinct answers). A recipe whose judge is
    # trained inside the policy (spark) refuses it
    separate: bool = False
    # a judge apart that goes on learning (judge.separate only): a model of its own, started from the
    # judging warm-up's, that trains each step on up to this many of the batch's verifier-labelled
    # rollouts, as many right as wrong (actors/judge_learner.py; SPC's critic update), and judges the
    # next step with what it learned; the judge vector is then not used. 0: the judge apart is fixed
    # (the current policy plus the warm-up's change)
    online_items: int = Field(0, ge=0)
    # that judge's AdamW (measured on sorting: level with 1e-4 over seeds 0-5, +0.011 above it at a
    # tenth labelled on seeds 0-2)
    online_lr: float = Field(3e-4, gt=0)
    # and the labelled items of the last `online_replay` steps again (few are labelled a step)
    online_replay: int = Field(0, ge=0)
    # where the judge apart that learns (online_items) starts: `policy`, the judging warm-up fine-tunes
    # a copy of the warm policy; `scratch`, the policy's architecture randomly initialised (seeded),
    # which the judging warm-up trains on the verdicts alone (judge.warmup_task* do not apply: nothing
    # samples from it, so there is no task to keep).
    # Measured on sorting (benchmarks/results/probes.md, judge-prompts*): on 7,000 labelled prompts'
    # samples held-out AUROC 0.88 from scratch (0.97 from another random init) against 0.84 started
    # from the policy; on 100-400 prompts the two are level (0.70-0.72 on 100, 0.82-0.84 on 400)
    init: Literal["policy", "scratch"] = "policy"
    # verifier-labelled near misses (orchestrator/near_misses.py): up to this many one-character edits
    # of each answer the verifier marked correct, scored by the verifier on the same labelled prompts;
    # the wrong ones join the judge's wrong examples, in the judging warm-up and (online_items) in the
    # judge learner's items. 0: the judge sees the policy's own errors only
    near_misses: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _separate(self):
        if self.separate and not self.warmup_steps:
            raise ValueError("judge.separate: true needs a judging warm-up (judge.warmup_steps > 0): the judge "
                             "apart is what the warm-up changed")
        if self.online_items and not self.separate:
            raise ValueError(f"judge.online_items={self.online_items} trains a judge apart from the policy; set "
                             "judge.separate: true as well (a judge inside the policy learns with it: recipe spark)")
        if self.near_misses and not (self.warmup_steps or self.online_items):
            raise ValueError(f"judge.near_misses={self.near_misses} adds examples to the judge's training, and nothing "
                             "trains the judge: set judge.warmup_steps (a judging warm-up) or judge.online_items")
        if self.init == "scratch":
            if not self.online_items:
                raise ValueError("judge.init: scratch trains a judge of its own from random weights, which only a "
                                 "judge apart that learns has: set judge.separate: true and judge.online_items "
                                 "(e.g. 128)")
            if self.mode == "sampled":
                raise ValueError("judge.init: scratch trains a one-token verdict (judge.yes against judge.no) into "
                                 "random weights, which cannot write the numbers judge.mode: sampled parses; use "
                                 "judge.mode: yes_prob")
        if self.online_replay and not self.online_items:
            raise ValueError(f"judge.online_replay={self.online_replay} replays the labelled items the judge apart "
                             "learns from, and judge.online_items is 0: set judge.online_items (e.g. 128)")
        return self

    @field_validator("template")
    @classmethod
    def _fields(cls, v: str) -> str:
        return template_fields(v, "judge.template")

    def cross_check(self, config) -> None:
        from orchestrator.recipes import RECIPES

        if self.separate and not RECIPES.get(config.recipe).separate_judge:
            raise ValueError(f"judge.separate: recipe {config.recipe!r} trains or reads its judge inside the policy "
                             "itself; a judge apart works with the recipes that can judge in a pool of their own "
                             "(grpo's family with a judge reward, spc, self_rewarding)")
        if self.online_items and not RECIPES.get(config.recipe).online_judge:
            raise ValueError(f"judge.online_items: recipe {config.recipe!r} does not train a judge apart while it runs "
                             "(spc trains its critic with spc.policy_items); it works with grpo's family")
        if self.warmup_task == "distill" and self.warmup_steps and config.learner.strategy == "fsdp2":
            raise ValueError("judge.warmup_task: distill holds a whole frozen copy of the policy for the judging "
                             "warm-up, which learner.strategy=fsdp2 does not; use own_samples there")
        if self.init == "scratch" and config.learner.lora is not None:
            raise ValueError("judge.init: scratch with learner.lora: adapters on randomly initialised weights "
                             "cannot learn a judge; train it whole (unset learner.lora) or use judge.init: policy")
        if self.separate and config.rollout.backend != "hf":
            raise ValueError(f"judge.separate: true with rollout.backend={config.rollout.backend!r}: the judge pool adds "
                             "the judge vector to each version it loads, which only the hf backend does here")

    def generator_args(self, config, args: dict) -> dict:
        """A generator judges (its `judging` role argument) where a reward source is `judge: true`."""
        from actors.judging import JudgingSpec

        judges = tuple(r.name for r in config.judge_rewards())
        if not judges:
            return {}
        return {"judging": JudgingSpec(judges, **self.model_dump(include={
            "template", "mode", "yes", "no", "samples", "max_new_tokens", "pattern", "scale"}))}

MARKER = "judge_warmup.json"
TASK_SHARE = {"answers": "reference answers", "own": "the warm policy's greedy answers",
              "own_samples": "the warm policy's sampled answers",
              "distill": "the warm policy's sampled answers, distilled from it"}
APART = ("judge.separate: that was the judge's copy; the policy starts RL where it was, and a judge pool judges "
         "with it plus the warm-up's change")
ONLINE = ("judge.separate: that was the judge's copy; the policy starts RL where it was, and the judge goes on "
          "from it, learning from each step's labelled rollouts (judge.online_items)")


SCRATCH = ("judge.init: scratch: a judge of its own from random weights; the policy starts RL where it was, and "
           "the judge goes on learning from each step's labelled rollouts (judge.online_items)")


def apart(judge: JudgeConfig) -> str:
    return SCRATCH if judge.init == "scratch" else ONLINE if judge.online_items else APART


def cache_path(config, source: str | None) -> Path:
    # `separate` and `online_*` do not change the warm-up (only where its result goes and what follows
    # it); warmup_task_samples is in the key only where it is used, warmup_samples and near_misses
    # only where set, so keys made before they existed still hit
    unused = {"separate", "online_items", "online_lr", "online_replay"} | ({"warmup_task_samples"} if config.judge.warmup_task in ("answers", "own") else set()) \
        | ({"warmup_samples"} if config.judge.warmup_samples is None else set()) \
        | ({"near_misses"} if not config.judge.near_misses else set()) \
        | ({"init"} if config.judge.init == "policy" else {"warmup_task", "warmup_task_fraction", "warmup_task_samples"})
    return stage_path(config, "judges", source, config.accuracy_source(),
                      {"judge": config.judge.model_dump(exclude=unused)})


def judge_rows(table: pa.Table, config, rng: np.random.Generator) -> pa.Table:
    """SFT rows (prompt = judge prompt, answer = yes/no) with as many of each label."""
    from actors.judging import render

    label = table.column(B.REWARD_PREFIX + config.accuracy_source()).to_numpy(zero_copy_only=False)
    ok = ~np.isnan(label) & (table.column("response").to_numpy(zero_copy_only=False) != "")
    good, bad = np.nonzero(ok & (label >= B.CORRECT_AT))[0], np.nonzero(ok & (label < B.CORRECT_AT))[0]
    n = min(len(good), len(bad))
    if n == 0:
        raise RuntimeError("judging warm-up: the warm policy's samples are all correct or all wrong; "
                           "nothing to learn the judge format from")
    idx = np.concatenate([rng.choice(good, n, replace=False), rng.choice(bad, n, replace=False)])
    prompts, responses = table.column("prompt").to_pylist(), table.column("response").to_pylist()
    return pa.table({"prompt": [render(config.judge.template, prompts[i], responses[i]) for i in idx],
                     "answer": [config.judge.yes if label[i] >= B.CORRECT_AT else config.judge.no for i in idx]})


def labelled_prompts(train: pa.Table, limit: int) -> pa.Table:
    """Up to `limit` training prompts the verifier labels (all of them where it labels every prompt),
    probes aside: the judge learns only from labels the run has (`verifier.fraction`) and never from
    the prompts that measure it (`verifier.probe_share`, orchestrator/probes.py)."""
    train = trainable_labelled(train)
    if train.num_rows == 0:
        raise RuntimeError("judging warm-up: verifier.fraction labels none of the training prompts; raise it "
                           "or set judge.warmup_steps=0")
    return train.slice(0, min(limit, train.num_rows))


async def task_rows(ctx, kind: str, limit: int = 2048, samples: int = 4) -> pa.Table:
    """The task share's SFT rows (prompt, answer): the reference answers, or the current policy's
    answers to up to `limit` training prompts: greedy (`own`) or `samples` sampled ones (`own_samples`;
    `distill` marks them so, a `distill` column the SFT objective reads)."""
    train = ctx.prompts.train
    if kind == "answers":
        return train.select(["prompt", "answer"])
    prompts = train.slice(0, min(limit, train.num_rows)).select(["prompt_id", "prompt"])
    gen = ctx.pools["generator"]
    how = {"greedy": True} if kind == "own" else {"n": samples}
    parts = await asyncio.gather(*[gen.call("generate", chunk, seq=-7000 - i, versioned=True, **how)
                                   for i, chunk in enumerate(ctx.split(prompts, max(1, prompts.num_rows // 256)))])
    table = B.concat(list(await asyncio.gather(*[t for t, _ in parts])))
    answers = table.column("response").to_pylist()
    keep = [i for i, a in enumerate(answers) if a]
    rows = pa.table({"prompt": table.column("prompt").take(pa.array(keep)),
                     "answer": pa.array([answers[i] for i in keep], pa.string())})
    return marked(rows, True) if kind == "distill" else rows


def marked(rows: pa.Table, distill: bool) -> pa.Table:
    """`rows` with the SFT objective's `distill` column (the distilled task share beside judge rows)."""
    return rows.append_column(B.DISTILL, pa.array([distill] * rows.num_rows, pa.bool_()))


async def agreement(ctx, held_out: pa.Table, pool: str = "generator") -> tuple[float, float | None]:
    """How often the judge (P(yes) > 0.5) agrees with the verifier on held-out samples, and the
    AUROC of its score against the verifier's labels (agreement alone flatters a judge that says
    "no" to everything when most samples are wrong). `pool`: where the judge is."""
    from orchestrator.evaluation import auroc

    judge = ctx.pools[pool]
    table, _ = await judge.call("judge", held_out, versioned=True)
    table = await table
    name = ctx.config.judge_rewards()[0].name
    score = table.column(B.REWARD_PREFIX + name).to_numpy(zero_copy_only=False)
    label = table.column(B.REWARD_PREFIX + ctx.config.accuracy_source()).to_numpy(zero_copy_only=False)
    ok = ~np.isnan(score) & ~np.isnan(label)
    agree = float(np.mean((score[ok] > 0.5) == (label[ok] >= 0.5))) if ok.any() else float("nan")
    return agree, auroc(score[ok], label[ok] >= 0.5)


def examples_note(ctx, examples: int, answers: int, prompts: pa.Table, near: int) -> str:
    """What the judging warm-up learns from, for its opening line."""
    return (f"{examples} balanced judge examples from {answers} answers to {prompts.num_rows} labelled prompts"
            + probes_note(ctx.prompts.train)
            + (f" and {near} near misses of the right ones (judge.near_misses)" if ctx.config.judge.near_misses else ""))


def drawn(judge: JudgeConfig) -> str:
    return (f"re-drawn from the policy every {judge.warmup_resample} steps" if judge.warmup_resample
            else "drawn once from the warm policy")


async def finish(ctx, progress, learner, channel, held_out: pa.Table, pool: str = "generator") -> tuple:
    """The warm-up's end: its optimizer dropped, the judge published to `pool`, whose agreement and
    AUROC on the held-out samples it returns."""
    progress.done()
    await learner.call("end_warmup", table=False)
    await channel.publish(0)
    return await agreement(ctx, held_out, pool)


async def warm_up(ctx, out_dir: Path) -> dict:
    """Fine-tune the policy in `ctx` into a judge; save it to `out_dir`; return the info."""
    cfg, judge = ctx.config, ctx.config.judge
    learner = ctx.pools["policy_learner"]
    channel = Channel("policy", learner, [ctx.pools["generator"]])
    start = time.perf_counter()
    rng = np.random.default_rng([cfg.seed, 17])
    await channel.publish(0)
    judged_prompts = labelled_prompts(ctx.prompts.train, 1024)

    async def draw(seq: int) -> tuple[pa.Table, int]:  # the policy's labelled samples, and near misses of them
        samples = await labelled_samples(ctx, judged_prompts, seq, judge.warmup_samples)
        return await with_near_misses(ctx, samples, cfg.accuracy_source(), judge.near_misses, rng)

    train, near = await draw(-1000)
    held_out = await labelled_samples(ctx, ctx.prompts.eval, -5000)
    rows = judge_rows(train, cfg, rng)
    before, auc_before = await agreement(ctx, held_out)
    ctx.progress.print(f"judging warm-up: {examples_note(ctx, rows.num_rows, train.num_rows - near, judged_prompts, near)}"
                       f"; on held-out samples the judge agrees with the verifier {before:.3f} (AUROC "
                       f"{fmt(auc_before)}) before")
    tasks = PromptSampler(await task_rows(ctx, judge.warmup_task, samples=judge.warmup_task_samples),
                          seed=cfg.seed + 2)
    judged = PromptSampler(rows, seed=cfg.seed + 3)
    n_task = int(judge.warmup_batch_size * judge.warmup_task_fraction)
    judge_batch = (lambda t: marked(t, False)) if judge.warmup_task == "distill" and n_task else (lambda t: t)
    steps, block, loss = 0, judge.warmup_resample or 25, float("nan")
    progress = StageProgress(
        ctx, "judging warm-up", judge.warmup_steps,
        budget=f"{judge.warmup_steps} SFT steps (judge.warmup_steps) of {judge.warmup_batch_size} examples, "
               f"{judge.warmup_task_fraction:.0%} of them the task's own ({TASK_SHARE[judge.warmup_task]}), "
               f"the rest judge examples of the policy's samples ({drawn(judge)}); cached, so later runs with the "
               "same settings skip it")
    while steps < judge.warmup_steps:
        stop_if_requested(ctx, "judging warm-up", steps)
        if judge.warmup_resample and steps:  # judge the errors of the policy as trained so far
            await channel.publish(0)
            train, near = await draw(-100_000 - 100 * steps)
            try:
                rows = judge_rows(train, cfg, rng)
                judged = PromptSampler(rows, seed=cfg.seed + 3 + steps)
            except RuntimeError:  # the policy got every sample right (or wrong): keep the last examples
                ctx.progress.print(f"judging warm-up: step {steps}: the policy's samples are all correct or all "
                                   "wrong; training on the previous draw's examples")
        n_judge = min(judge.warmup_batch_size - n_task, judged.table.num_rows)
        n = min(block, judge.warmup_steps - steps)
        batches = [pa.concat_tables([judge_batch(judged.next(n_judge))] + ([tasks.next(n_task)] if n_task else []))
                   for _ in range(n)]
        loss = await learner.call("sft_steps", batches, judge.warmup_lr, table=False)
        steps += n
        progress.update(steps, f"loss {loss:.3f}")
    after, auc_after = await finish(ctx, progress, learner, channel, held_out)
    # what the judge will see: fresh samples of the policy it has become
    own, auc_own = await agreement(ctx, await labelled_samples(ctx, ctx.prompts.eval, -6000))
    from orchestrator.evaluation import greedy_accuracy
    accuracy = (await greedy_accuracy(ctx))["eval/accuracy"]
    # examples: of the last draw
    info = {"judge_warmup/steps": steps, "judge_warmup/examples": rows.num_rows, "judge_warmup/loss": loss,
            "judge_warmup/near_misses": near,
            "judge_warmup/agreement_before": before, "judge_warmup/agreement_after": after,
            "judge_warmup/auroc_before": auc_before, "judge_warmup/auroc_after": auc_after,
            "judge_warmup/agreement_own_samples": own, "judge_warmup/auroc_own_samples": auc_own,
            "judge_warmup/accuracy_after": accuracy, "judge_warmup/time_s": time.perf_counter() - start}
    ctx.progress.print(f"judging warm-up: agreement {before:.3f} -> {after:.3f}, AUROC {fmt(auc_before)} -> "
                       f"{fmt(auc_after)} after {steps} steps (on the fine-tuned policy's own samples: "
                       f"{own:.3f}, AUROC {fmt(auc_own)}); held-out task accuracy {accuracy:.3f}"
                       + (f"; {apart(judge)}" if judge.separate else ""))
    return await save_stage(learner, out_dir, MARKER, info)


SCRATCH_ROLES = ("generator", "verifier", "judge_learner", "judge")


async def warm_up_scratch(ctx, out_dir: Path) -> dict:
    """`judge.init: scratch`: train the judge learner (the policy's architecture, randomly initialised)
    on the verdicts of the warm policy's labelled samples, re-drawn every `warmup_resample` steps
    (fresh samples of the same labelled prompts: the policy does not change here); save it to
    `out_dir`; return the info. The generators keep the policy; the judge pool reads the judge."""
    from actors.judge_learner import THRESHOLD, labelled_items

    cfg, judge = ctx.config, ctx.config.judge
    learner = ctx.pools["judge_learner"]
    channel = Channel("judge", learner, [ctx.pools["judge"]])
    start = time.perf_counter()
    rng = np.random.default_rng([cfg.seed, 17])
    judged_prompts = labelled_prompts(ctx.prompts.train, 1024)

    async def draw(seq: int) -> tuple[pa.Table, pa.Table, int]:  # balanced items, the answers drawn, near misses
        samples, near = await with_near_misses(ctx, await labelled_samples(ctx, judged_prompts, seq, judge.warmup_samples),
                                               cfg.accuracy_source(), judge.near_misses, rng)
        return labelled_items(samples, cfg.accuracy_source(), THRESHOLD, samples.num_rows, rng), samples, near

    items, samples, near = await draw(-1000)
    if items.num_rows == 0:
        raise RuntimeError("judging warm-up: the warm policy's samples are all correct or all wrong; "
                           "nothing to learn the judge from")
    held_out = await labelled_samples(ctx, ctx.prompts.eval, -5000)
    await channel.publish(0)
    before, auc_before = await agreement(ctx, held_out, "judge")
    ctx.progress.print(f"judging warm-up (judge.init: scratch): "
                       f"{examples_note(ctx, items.num_rows, samples.num_rows - near, judged_prompts, near)}; on "
                       f"held-out samples the untrained judge agrees with the verifier {before:.3f} (AUROC "
                       f"{fmt(auc_before)})")
    judged = PromptSampler(items, seed=cfg.seed + 3)
    steps, block, loss = 0, judge.warmup_resample or 25, float("nan")
    progress = StageProgress(
        ctx, "judging warm-up", judge.warmup_steps,
        budget=f"{judge.warmup_steps} steps (judge.warmup_steps) of {judge.warmup_batch_size} verdicts on the "
               f"policy's samples ({drawn(judge)}) for a judge from random weights (no task share: judge.warmup_task* "
               "do not apply); cached, so later runs with the same settings skip it")
    while steps < judge.warmup_steps:
        stop_if_requested(ctx, "judging warm-up", steps)
        if judge.warmup_resample and steps:  # a pool's failure propagates; one-sided samples keep the last draw
            fresh, fresh_samples, fresh_near = await draw(-100_000 - 100 * steps)
            if fresh.num_rows:
                items, samples, near = fresh, fresh_samples, fresh_near
                judged = PromptSampler(items, seed=cfg.seed + 3 + steps)
            else:
                ctx.progress.print(f"judging warm-up: step {steps}: the policy's samples are all correct or all "
                                   "wrong; training on the previous draw's examples")
        n = min(block, judge.warmup_steps - steps)
        batches = [judged.next(min(judge.warmup_batch_size, items.num_rows)) for _ in range(n)]
        loss = await learner.call("verdict_steps", batches, judge.warmup_lr, table=False)
        steps += n
        progress.update(steps, f"loss {loss:.3f}")
    after, auc_after = await finish(ctx, progress, learner, channel, held_out, "judge")
    info = {"judge_warmup/steps": steps, "judge_warmup/examples": items.num_rows, "judge_warmup/loss": loss,
            "judge_warmup/near_misses": near, "judge_warmup/init": "scratch",
            "judge_warmup/agreement_before": before, "judge_warmup/agreement_after": after,
            "judge_warmup/auroc_before": auc_before, "judge_warmup/auroc_after": auc_after,
            # what the judge will see: the policy's samples, and the policy did not change
            "judge_warmup/agreement_own_samples": after, "judge_warmup/auroc_own_samples": auc_after,
            "judge_warmup/time_s": time.perf_counter() - start}
    ctx.progress.print(f"judging warm-up: agreement {before:.3f} -> {after:.3f}, AUROC {fmt(auc_before)} -> "
                       f"{fmt(auc_after)} after {steps} steps on held-out samples; {SCRATCH}")
    return await save_stage(learner, out_dir, MARKER, info)


async def warm_up_any(ctx, out_dir: Path) -> dict:
    return await (warm_up_scratch if ctx.config.judge.init == "scratch" else warm_up)(ctx, out_dir)


class JudgeWarmup(PolicyWarmup):
    name, label, marker = "judge_warmup", "judging warm-up", MARKER
    key, work = staticmethod(cache_path), staticmethod(warm_up_any)
    settings = {"judge": JudgeConfig}
    rewards = ("judge",)  # its section only where a reward source is `judge:`

    def enabled(self, config, recipe) -> bool:
        return bool(config.judge_rewards() and config.judge.warmup_steps)

    def cached_message(self, config, path: Path, info: dict) -> str:
        text = super().cached_message(config, path, info)
        return f"{text}; {apart(config.judge)}" if config.judge.separate else text

    def borrowed(self, config) -> tuple[str, ...]:
        """From scratch it trains the judge learner, reading samples from the generators (untouched)."""
        return SCRATCH_ROLES if config.judge.init == "scratch" else self.borrows

    def hands_on(self, config) -> bool:
        # from scratch: the generators still hold the policy, the judge pools the trained judge
        return config.judge.init == "scratch" or not config.judge.separate

    def policy_accuracy(self, info: dict) -> float | None:
        return None if info.get("judge_warmup/separate") else super().policy_accuracy(info)

    def apply(self, config, sources, out_dir: Path | None, info: dict) -> dict:
        """Shared (the default): the policy goes on from the judge-warmed model. Separate: the policy
        stays where it was; the judge vector (judged - start) is written beside the cached model, or
        (judge.online_items) a judge learner starts from that model."""
        if not config.judge.separate:
            return super().apply(config, sources, out_dir, info)
        from actors import judge_vector

        sources.judge = str(out_dir)
        info["judge_warmup/separate"] = True  # policy_accuracy: the RL loop does not start from it
        if config.judge.online_items:  # a judge learner goes on from the judge-warmed model itself
            return info
        base = sources.policy or config.model.path  # the warm-up's start: a stage's output, or the model as given
        if base is None:
            raise ValueError("judge.separate: the policy has no model directory to measure the judge vector from "
                             "(set model.path or enable the SFT warm-up)")
        vector = Path(out_dir) / "judge_vector"
        if not (vector / judge_vector.FILE).is_file():
            judge_vector.write(Path(base).expanduser(), out_dir, vector)
        sources.judge_vector = str(vector)
        return info
