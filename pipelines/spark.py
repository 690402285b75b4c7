"""SPARK (Liu et al. 2025): policy and reward co-evolve in one model. Every RL step, the batch's
rollouts with their verifier labels also train the policy as a generative judge (the `self_judge`
objective on the same learner), and the policy's own judgment is a reward source
(`rewards: [{name: ..., judge: true}]`), next to the verifier's or in its place where the verifier
labels no prompt (`verifier.fraction` with `aggregate.fill`).

`spark.mode` picks the judging format (actors/judge_modes.py): pointwise (P(yes) after the judge
template), pairwise (which of two responses to one prompt is correct; as a reward, the win rate
within the group) or reflective (a short greedy reflection, then the yes/no verdict)."""

from __future__ import annotations

from typing import Literal, Optional

import numpy as np
from pydantic import Field, field_validator, model_validator

from orchestrator.config import Section, template_fields
from pipelines.grpo import GRPO
from pipelines.stages.judge import JudgeConfig


class SparkConfig(Section):
    """SPARK's judge training on the policy's own rollouts (actors/objectives/self_judge.py)."""
    mode: Literal["pointwise", "pairwise", "reflective"] = "pointwise"
    coef: float = Field(0.5, gt=0)  # weight of the judge's cross-entropy in every update
    per_update: int = Field(64, ge=1)  # judge examples per update, from the batch's labelled rollouts
    # and from those of the last `replay` batches (0: this batch's only); where few prompts are
    # labelled (verifier.fraction 0.1: 24 rollouts a step) one batch is too few for the judge to hold
    replay: int = Field(0, ge=0)
    threshold: float = 0.5  # a response is correct when the first verifier source gives at least this
    # pairwise: "which is correct, a or b?" -> first | second (one token each)
    pair_template: str = "{prompt}{a}|{b}?"
    first: str = "A"
    second: str = "B"
    # pairwise reward: each response meets up to 2 x opponents others of its group, both orders
    # (2 judge passes per pair: about 2 x opponents passes per response, against 1 for pointwise)
    opponents: int = Field(2, ge=1)
    # reflective: the judge continues this text greedily (its reflection), then reads the verdict
    # (judge.yes / judge.no) after the cue; here the reflection re-poses the problem, so the judge
    # writes its own answer before it judges the response
    reflect_template: str = "{prompt}{response}|{prompt}"
    verdict_cue: str = "?"
    reflect_tokens: Optional[int] = Field(None, gt=0)  # None: rollout.max_new_tokens
    eval_prompts: int = Field(64, ge=1)  # held-out prompts whose samples measure the judge (eval/judge_auroc)

    @field_validator("pair_template")
    @classmethod
    def _pair_fields(cls, v: str) -> str:
        for field in ("{prompt}", "{a}", "{b}"):
            if field not in v:
                raise ValueError(f"spark.pair_template must contain {field}, got {v!r}")
        return v

    @field_validator("reflect_template")
    @classmethod
    def _reflect_fields(cls, v: str) -> str:
        return template_fields(v, "spark.reflect_template")

    @model_validator(mode="after")
    def _distinct(self) -> "SparkConfig":
        if self.first == self.second:
            raise ValueError(f"spark.first and spark.second must differ, both are {self.first!r}")
        return self

    def cross_check(self, config) -> None:
        if not config.fn_rewards():
            raise ValueError("recipe spark labels its judge examples with a verifier reward function "
                             "(rewards[].fn); the config has none")
        if self.mode == "pairwise" and config.rollout.samples_per_prompt < 2:
            raise ValueError("spark.mode=pairwise compares responses to one prompt; rollout.samples_per_prompt "
                             f"is {config.rollout.samples_per_prompt}, it needs at least 2")
        if self.mode != "pointwise" and config.judge_rewards() and config.judge.mode != "yes_prob":
            raise ValueError(f"spark.mode={self.mode} reads the judge's verdict-token probabilities; "
                             f"judge.mode={config.judge.mode} samples numbers instead: set judge.mode=yes_prob")

    def generator_args(self, config, args: dict) -> dict:
        """The judge section's JudgingSpec in SPARK's pairwise or reflective format (spark.mode;
        pointwise: as the judge section has it)."""
        from dataclasses import replace

        from actors.judge_modes import Pairwise, Reflective

        if "judging" not in args or self.mode == "pointwise":
            return {}
        fmt = Pairwise(self.pair_template, self.first, self.second, self.opponents) if self.mode == "pairwise" \
            else Reflective(self.reflect_template, self.verdict_cue, self.reflect_tokens or config.rollout.max_new_tokens)
        return {"judging": replace(args["judging"], format=fmt)}

    def objective(self, config) -> dict:
        """The self_judge objective's options."""
        return {"name": "self_judge", **self.model_dump(exclude={"eval_prompts", "opponents"}),
                "reflect_tokens": self.reflect_tokens or config.rollout.max_new_tokens,
                "template": config.judge.template, "yes": config.judge.yes, "no": config.judge.no}


class Spark(GRPO):
    settings = {"judge": JudgeConfig, "spark": SparkConfig}  # its judge, with or without a judge reward source
    name = "spark"
    separate_judge = False  # it trains its judge inside the policy

    @classmethod
    def extra_objectives(cls, config) -> list[dict]:
        spark = getattr(config, "spark", None) or SparkConfig()
        return [spark.objective(config)]

    async def learn(self, ctx, tables: list, dump_path: str | None) -> dict:
        import asyncio

        metrics = await super().learn(ctx, tables, dump_path)
        if ctx.config.judge_rewards():  # the scored pieces (object refs; a few hundred rows)
            metrics["spark/batch_auroc"] = batch_auroc(ctx.config, list(await asyncio.gather(*tables)))
        return metrics

    async def evaluate(self, ctx) -> dict:
        """Greedy held-out accuracy, and the judge on sampled groups of held-out prompts (a pairwise
        judge needs several responses to one prompt): eval/judge_auroc, agreement and mean score."""
        from orchestrator.evaluation import greedy_accuracy, hacking, labelled_samples

        out = await greedy_accuracy(ctx)
        if not ctx.config.judge_rewards():
            return out
        prompts = ctx.prompts.eval.slice(0, ctx.config.spark.eval_prompts)
        table = await labelled_samples(ctx, prompts, -(10_000_000 + ctx.step))
        judge_pool = ctx.pools.get("judge", ctx.pools["generator"])
        judged, _ = await judge_pool.call("judge", table, versioned=True)
        out.update(judge_scores(ctx.config, [await judged], "eval/judge"))
        out.update(hacking(out, out, getattr(self, "_last_eval", None)))
        self._last_eval = out
        return out


def judge_scores(config, tables: list, prefix: str) -> dict:
    """The judge reward against the verifier's labels on the rows both scored: AUROC, agreement at 0.5
    and the mean score."""
    from actors import batch as B
    from orchestrator.evaluation import auroc, labelled_scores

    judge, label = B.REWARD_PREFIX + config.judge_rewards()[0].name, B.REWARD_PREFIX + config.accuracy_source()
    score, truth = labelled_scores(tables, judge, label)
    if not len(score):
        return {f"{prefix}_auroc": None, f"{prefix}_agreement": None, f"{prefix}_score": None}
    return {f"{prefix}_auroc": auroc(score, truth >= 0.5),
            f"{prefix}_agreement": float(np.mean((score > 0.5) == (truth >= 0.5))),
            f"{prefix}_score": float(np.mean(score))}


def batch_auroc(config, tables: list) -> float | None:
    """The judge reward's AUROC against the verifier on this batch's labelled rows."""
    return judge_scores(config, tables, "batch")["batch_auroc"]
