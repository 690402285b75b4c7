"""GRPO against verifiable rewards, optionally with reward models as extra reward sources:
generate -> verify (per piece, as soon as it is generated) -> reward models (whole batch, one
version) -> credit (aggregation, advantages: on the driver) -> learn -> publish the policy to the
generators."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import ray

from actors import batch as B
from orchestrator.channels import Channel
from orchestrator.credit import Credit, Outcome
from orchestrator.evaluation import greedy_accuracy, judge_quality, reward_model_quality
from orchestrator.judge_credit import JudgeCreditConfig, LearnedRewards
from orchestrator.label_select import choose_labelled
from orchestrator.recipes import Recipe, Sources, policy_roles
from orchestrator.reward_health import health_info
from orchestrator.roles import RoleSpec
from pipelines.laser_reward import SelfReward


class GRPO(Recipe):
    """The policy-gradient recipe the others build on. What a subclass changes is declared here, in
    one place each: `extra_objectives` (what its policy learner hosts beside the RL step and the
    warm-ups), `advantages` and `process_weight` (its credit step), `settings` (its config
    section, whose `cross_check` holds its rules)."""

    name = "grpo"
    separate_judge = True  # its judge reward reads a judge pool of its own where judge.separate asks
    online_judge = True  # and trains that judge on each step's labelled rollouts where judge.online_items asks
    selects_labels = True  # its score_piece reads verifier.select (a subclass that replaces score_piece sets False)
    settings = {"judge_credit": JudgeCreditConfig}  # how learned rewards enter its credit step

    @classmethod
    def extra_objectives(cls, config) -> list[dict]:
        """Objectives the policy learner hosts beside the default ones (riders on the RL step)."""
        return []

    @classmethod
    def objectives(cls, config) -> list:
        """The policy learner's objectives, each with its options: the RL step and the warm-ups'
        (actors.learner.DEFAULT_OBJECTIVES), LaSeR's alignment where a reward source is `laser: true`,
        then the recipe's own."""
        from actors.learner import DEFAULT_OBJECTIVES

        laser = [config.laser.objective(config)] if config.laser_rewards() else []
        return [*DEFAULT_OBJECTIVES, *laser, *cls.extra_objectives(config)]

    @classmethod
    def advantages(cls, config):
        """How the credit step estimates advantages: the configured outcome estimator."""
        return Outcome(config)

    @classmethod
    def process_weight(cls, config) -> float:
        """The coefficient of the process advantages of `token_rewards` (a verifier's dense rewards: 1)."""
        return 1.0

    @classmethod
    def credit(cls, config, sources: Sources) -> Credit:
        """Aggregation (after LaSeR's self-reward where a source is `laser: true`, and the learned
        rewards' confidence and guard where `judge_credit` asks for them: orchestrator/judge_credit.py),
        then `advantages` and the process advantages times `process_weight` (orchestrator/credit.py)."""
        rewards = [SelfReward(config, sources.policy)] if config.laser_rewards() else []
        if config.judge_credit.active:
            rewards.append(LearnedRewards(config))
        return Credit(config, advantages=cls.advantages(config), process_weight=cls.process_weight(config),
                      rewards=rewards)

    @classmethod
    def roles(cls, config, sources: Sources) -> dict[str, RoleSpec]:
        roles = policy_roles(sources, cls.generator_args(config))
        roles["policy_learner"].kwargs = {"objectives": cls.objectives(config)}
        if config.model_rewards():
            roles["reward_model"] = RoleSpec("actors.reward_model:RewardModel", (sources.reward_models,),
                                             {"template": config.reward_model.template}, kind="scorer", num_cpus=0)
        if cls.judge_learns(config):
            # a judge apart that goes on learning: a model of its own, from the judging warm-up's (or,
            # judge.init: scratch, before that warm-up: the policy's architecture, randomly initialised)
            judge = sources.learners.get("judge_learner", sources.judge)
            fresh = judge is None and config.judge.init == "scratch"
            judge = sources.policy if fresh else judge
            roles["judge"] = RoleSpec("actors.generator:Generator", (judge,), cls.generator_args(config),
                                      kind="generator", num_cpus=0)
            online = {"judging": roles["judge"].kwargs["judging"], "lr": config.judge.online_lr,
                      "replay": config.judge.online_replay, **({"fresh": True} if fresh else {})}
            roles["judge_learner"] = RoleSpec("actors.judge_learner:JudgeLearner", (judge,), online,
                                              kind="learner", num_cpus=0)
        elif config.judge_rewards() and (not config.judge.shared or config.judge.separate):
            # the policy's weights in a pool of their own; judge.separate: plus the judge vector
            apart = {"judge_vector": sources.judge_vector} if config.judge.separate else {}
            roles["judge"] = RoleSpec("actors.generator:Generator", (sources.policy,),
                                      {**cls.generator_args(config), **apart}, kind="generator", num_cpus=0)
        return roles

    def channels(self, ctx) -> dict:
        if "judge_learner" in ctx.pools:  # the judge pool follows its own learner, not the policy
            return {"policy": Channel("policy", ctx.pools["policy_learner"], [ctx.pools["generator"]]),
                    "judge": Channel("judge", ctx.pools["judge_learner"], [ctx.pools["judge"]])}
        targets = [ctx.pools[r] for r in ("generator", "judge") if r in ctx.pools]
        return {"policy": Channel("policy", ctx.pools["policy_learner"], targets)}

    async def score_piece(self, ctx, table):
        """The judge (where a reward source is `judge: true`) and the verifier. Where
        `verifier.select` spends the labels after generation (orchestrator/label_select.py), the
        piece's `labelled` column is set first, after the judge where the choice reads it."""
        cfg, out = ctx.config, {}
        select = cfg.verifier.select
        judged = False
        if cfg.judge_rewards() and select == "judge_unsure":
            table, out = await self._judge(ctx, table)
            judged = True
        if select != "random":
            table, picked = choose_labelled(await table, cfg.verifier.fraction, select, cfg.seed,
                                            B.REWARD_PREFIX + cfg.judge_rewards()[0].name if judged else None)
            table = ray.put(table)
            out.update(picked)
        table, info = await ctx.pools["verifier"].call("score", table)
        out.update({"verify_s": info["busy_s"], **{k: v for k, v in info.items() if k.startswith("seconds/")},
                    **health_info(info)})
        if cfg.judge_rewards() and not judged:  # the policy judges its own samples, at the version it holds now
            table, more = await self._judge(ctx, table)
            out.update(more)
        return table, out

    async def _judge(self, ctx, table):
        judge = ctx.pools.get("judge", ctx.pools["generator"])
        table, info = await judge.call("judge", table, versioned=True)
        return table, {"judge_s": info["busy_s"], **{k: v for k, v in info.items() if k.startswith("seconds/")}}

    async def score_batch(self, ctx, tables: list) -> list:
        """Reward models score the whole batch at one version (updates happen only between batches)."""
        if "reward_model" not in ctx.pools:
            return tables
        pool = ctx.pools["reward_model"]
        scored = await asyncio.gather(*[pool.call("score", t, versioned=True) for t in tables])
        ctx.stage_seconds = {k: sum(i.get(k, 0.0) for _, i in scored) for k in scored[0][1] if k.startswith("seconds/")}
        return [t for t, _ in scored]

    async def learn(self, ctx, tables: list, dump_path: str | None) -> dict:
        if "judge_learner" not in ctx.pools:
            return await self._learn_policy(ctx, tables, dump_path)
        policy, judge = await asyncio.gather(self._learn_policy(ctx, tables, dump_path), self._learn_judge(ctx, tables))
        return {**policy, **judge}

    async def _learn_judge(self, ctx, tables: list) -> dict:
        """judge.online_items: the judge apart takes a step on this batch's labelled rollouts (as many
        right as wrong) and publishes to its pool, which judges the next step's samples with it."""
        from actors.judge_learner import THRESHOLD, labelled_items
        from orchestrator.near_misses import with_near_misses

        cfg = ctx.config
        batch = B.concat(list(await asyncio.gather(*tables)))
        rng = np.random.default_rng([cfg.seed, ctx.step, 31])
        batch, near = await with_near_misses(ctx, batch, cfg.accuracy_source(), cfg.judge.near_misses,
                                             np.random.default_rng([cfg.seed, ctx.step, 37]))
        items = labelled_items(batch, cfg.accuracy_source(), THRESHOLD, cfg.judge.online_items, rng)
        metrics = await ctx.pools["judge_learner"].call("train_game", None, items, table=False)
        await publish(ctx, "judge", metrics["judge_learner/version"])
        return {**metrics, "judge_learner/near_misses": near} if cfg.judge.near_misses else metrics

    async def _learn_policy(self, ctx, tables: list, dump_path: str | None) -> dict:
        learner, payload = ctx.pools["policy_learner"], None
        if ctx.channels["policy"].takes_payload:  # the step and its weights in one call
            payload, metrics = await learner.call("train_step_published", *tables, dump_path=dump_path)
        else:
            metrics = await learner.call("train_step", *tables, dump_path=dump_path, table=False)
        mark = time.perf_counter()
        await publish(ctx, "policy", metrics["version"], payload)
        return {**metrics, "time/publish_s": time.perf_counter() - mark}

    async def evaluate(self, ctx) -> dict:
        responses: list = []  # the greedy responses, scored again by the judge or reward model below
        out = await greedy_accuracy(ctx, keep=responses)
        if ctx.config.judge_rewards():  # the policy judges itself: how well, and is it being gamed
            out.update(await judge_quality(ctx, out, getattr(self, "_last_eval", None), responses))
            self._last_eval = out
        elif ctx.config.model_rewards() and "reward_model" in ctx.pools:  # a reward model: the same questions
            out.update(await reward_model_quality(ctx, out, getattr(self, "_last_eval", None), responses))
            self._last_eval = out
        return out


async def publish(ctx, channel: str, version: int, payload=None) -> None:
    """Publish a learner's new version (`payload`: its weights, already exported); in strict
    on-policy mode wait until every replica holds it."""
    ctx.versions[ctx.channels[channel].learner.name] = version
    await ctx.channels[channel].publish(version, wait=ctx.config.train.max_staleness == 0, payload=payload)
