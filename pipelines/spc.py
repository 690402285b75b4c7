"""SPC (Chen et al. 2025, "SPC: Evolving Self-Play Critic via Adversarial Games for LLM Reasoning"):
a sneaky generator and a critic, two copies of the warm policy on two learners of their own, play an
adversarial game on the policy's verified-correct responses, and the critic is a step verifier in the
policy's reward (`rewards: [{name: critic, judge: true}]`, its P(judge.yes) read by the judge pool).

Each step, beside GRPO on the policy:
1. up to `spc.games_per_step` of the batch's verifier-confirmed correct responses (one per prompt)
   go to the sneaky generator (`spc.template`: the problem and its correct step), which samples
   `spc.variants` erroneous variants of each;
2. the verifier checks every variant: only those it confirms wrong are played; the others are
   counted by reason (`spc/invalid/*`) and get `spc.invalid_reward`;
3. the critic judges each played variant and (`spc.judge_correct`) each correct step rewritten: it
   accepts a step when P(yes) >= 0.5;
4. winner +1, loser -1 (`game_rewards`);
5. the sneaky learner takes a GRPO step on its variants (a correct step's variants are one group;
   its own credit step, `sneaky_credit`, aggregates the game reward alone), the critic learner a
   step on its expected game reward, and each publishes to its own pool.
"""

from __future__ import annotations

import asyncio
from typing import Optional

import numpy as np
import pyarrow as pa
from pydantic import Field, field_validator

from actors import batch as B
from actors.judging import render
from actors.judge_learner import labelled_items
from orchestrator.channels import Channel
from orchestrator.config import Section, template_fields
from orchestrator.credit import Credit, Outcome
from orchestrator.evaluation import auroc, labelled_scores
from orchestrator.recipes import Sources
from orchestrator.roles import RoleSpec
from pipelines.grpo import GRPO, publish
from pipelines.stages.judge import JudgeConfig

GAME = "game"  # the sneaky learner's one reward source: its game reward
SEQ0 = 10 ** 9  # sneaky requests are numbered apart from the policy's


class SpcConfig(Section):
    """SPC's adversarial game (pipelines/spc.py). The critic is the `judge: true` reward source, in a
    judge pool of its own whatever judge.shared says."""
    games_per_step: int = Field(16, ge=1)  # correct responses (one per prompt) rewritten per step
    variants: int = Field(4, ge=2)  # erroneous variants per correct response: one GRPO group
    template: str = "{prompt}{response}!{prompt}"  # what the sneaky generator reads
    # the sneaky generator's reward for a variant the verifier does not confirm wrong (null: left
    # out of its update; counted either way)
    invalid_reward: Optional[float] = -1.0
    judge_correct: bool = True  # the critic also judges the correct steps (else flagging every step wins)
    critic_lr: float = Field(1e-4, gt=0)  # the critic learner's AdamW (the paper: 2e-6 on a 7B model)
    sneaky_lr: float = Field(1e-4, gt=0)  # the sneaky learner's AdamW
    threshold: float = 0.5  # a response is correct when the accuracy source gives at least this
    # the critic also trains on up to this many of the batch's verifier-labelled policy rollouts a
    # step, correct and wrong alike (as many of each): the policy's own errors, not only the sneaky
    # generator's (the critic it rewards is then trained on the mistakes it must catch); 0: off
    policy_items: int = Field(0, ge=0)
    # and the policy items of the last `replay` steps again (0: this step's only): at verifier.fraction
    # 0.1 a step labels about 24 rollouts, too few to keep the critic from drifting
    replay: int = Field(0, ge=0)

    @field_validator("template")
    @classmethod
    def _fields(cls, v: str) -> str:
        return template_fields(v, "spc.template")

    def cross_check(self, config) -> None:
        if not config.fn_rewards():
            raise ValueError("recipe spc needs a verifier reward function (rewards[].fn): it picks the correct "
                             "responses the game starts from and confirms the sneaky variants wrong")
        judges = config.judge_rewards()
        if len(judges) != 1:
            raise ValueError(f"recipe spc needs exactly one judge reward source, the critic (e.g. {{name: critic, "
                             f"judge: true, weight: 0.5}}); rewards has {len(judges)}: {[j.name for j in judges]}")
        if config.judge.mode != "yes_prob":
            raise ValueError(f"recipe spc: judge.mode {config.judge.mode!r}; the critic's verdict is P(judge.yes), "
                             "set judge.mode: yes_prob")
        if self.replay and not self.policy_items:
            raise ValueError(f"spc.replay={self.replay} replays the policy's labelled rollouts to the critic; "
                             "spc.policy_items is 0, so there are none: set spc.policy_items (e.g. 128)")
        for role in ("critic_learner", "sneaky_learner"):
            spec = config.roles.get(role)
            if spec is not None and spec.replicas != 1:
                raise ValueError(f"roles.{role}.replicas={spec.replicas}: recipe spc trains its {role} on one rank")


def game_rewards(accepts: np.ndarray, step_correct: np.ndarray) -> np.ndarray:
    """The critic's reward for each judged step: +1 when its verdict is right (it accepts a correct
    step or flags a wrong one), -1 when not. The sneaky generator's reward for a wrong variant is
    the negative of the critic's on it: the game is zero-sum."""
    return np.where(np.asarray(accepts, bool) == np.asarray(step_correct, bool), 1.0, -1.0)


def sneaky_rewards(valid: np.ndarray, critic: np.ndarray, invalid_reward: float | None) -> np.ndarray:
    """The sneaky generator's reward per variant: minus the critic's on a played (valid) variant,
    `invalid_reward` on one that is not confirmed wrong (NaN: left out of its update)."""
    other = np.nan if invalid_reward is None else invalid_reward
    return np.where(np.asarray(valid, bool), -np.asarray(critic, np.float64), other)


def variant_status(label: np.ndarray, responses: list[str], threshold: float) -> np.ndarray:
    """Per variant: "wrong" (played), "not_wrong" (the verifier accepts it), "unverified" (the
    verifier gave no label) or "empty"."""
    label = np.asarray(label, np.float64)
    empty = np.array([r.strip() == "" for r in responses], bool)
    return np.where(empty, "empty", np.where(np.isnan(label), "unverified",
                                             np.where(label >= threshold, "not_wrong", "wrong")))


def pick_correct(table: pa.Table, label: str, threshold: float, limit: int, rng) -> list[int]:
    """Rows of up to `limit` prompts' verifier-confirmed correct responses, one per prompt, drawn at
    random (`rng`) among a prompt's correct responses."""
    if B.REWARD_PREFIX + label not in table.schema.names:
        return []
    values = table.column(B.REWARD_PREFIX + label).to_numpy(zero_copy_only=False).astype(np.float64)
    ok = ~np.isnan(values) & (values >= threshold)
    ok &= np.array([r.strip() != "" for r in table.column("response").to_pylist()], bool)
    prompts = np.asarray(table.column("prompt_id").to_pylist(), dtype=object)
    chosen = [int(rng.choice(np.nonzero(ok & (prompts == p))[0])) for p in dict.fromkeys(prompts[ok])]
    if len(chosen) > limit:
        chosen = sorted(rng.choice(chosen, size=limit, replace=False).tolist())
    return chosen


def batch_auroc(table: pa.Table, critic: str, label: str) -> float | None:
    """The critic's AUROC against the verifier on the rows the verifier labelled."""
    names = table.schema.names
    if B.REWARD_PREFIX + critic not in names or B.REWARD_PREFIX + label not in names:
        return None
    score, truth = labelled_scores([table], B.REWARD_PREFIX + critic, B.REWARD_PREFIX + label)
    return auroc(score, truth >= 0.5)


class SPC(GRPO):
    name = "spc"
    online_judge = False  # its critic learns from the game (and spc.policy_items), on a learner of its own
    settings = {"judge": JudgeConfig, "spc": SpcConfig}  # the critic is a judge (its cross_check asks for its source)

    @classmethod
    def roles(cls, config, sources: Sources) -> dict[str, RoleSpec]:
        roles = super().roles(config, sources)
        spc = getattr(config, "spc", None) or SpcConfig()
        # judge.separate: the critic starts from the judging warm-up's model, the policy from its own start
        critic = sources.learners.get("critic_learner", sources.judge or sources.policy)
        sneaky = sources.learners.get("sneaky_learner", sources.policy)
        args = cls.generator_args(config)
        roles["judge"] = RoleSpec("actors.generator:Generator", (critic,), args, kind="generator", num_cpus=0)
        roles["sneaky"] = RoleSpec("actors.generator:Generator", (sneaky,), args, kind="generator", num_cpus=0)
        roles["critic_learner"] = RoleSpec("actors.judge_learner:JudgeLearner", (critic,),
                                           {"judging": args["judging"], "lr": spc.critic_lr, "replay": spc.replay,
                                            "prefix": "critic"},
                                           kind="learner", num_cpus=0)
        roles["sneaky_learner"] = RoleSpec("actors.learner:Learner", (sneaky,),
                                           {"lr": spc.sneaky_lr, "objectives": ["policy_gradient"]},
                                           kind="learner", num_cpus=0)
        return roles

    def channels(self, ctx) -> dict:
        return {"policy": Channel("policy", ctx.pools["policy_learner"], [ctx.pools["generator"]]),
                "critic": Channel("critic", ctx.pools["critic_learner"], [ctx.pools["judge"]]),
                "sneaky": Channel("sneaky", ctx.pools["sneaky_learner"], [ctx.pools["sneaky"]])}

    async def learn(self, ctx, tables: list, dump_path: str | None) -> dict:
        policy, game = await asyncio.gather(super().learn(ctx, tables, dump_path), self.play(ctx, tables))
        return {**policy, **game}

    async def play(self, ctx, tables: list) -> dict:
        """One round of the game on this batch's correct responses; both players learn from it."""
        cfg = ctx.config
        spc, label, critic = cfg.spc, cfg.accuracy_source(), cfg.judge_rewards()[0].name
        batch = B.concat(list(await asyncio.gather(*tables)))
        out = {"judge/auroc": batch_auroc(batch, critic, label)}
        rng = np.random.default_rng([cfg.seed, ctx.step, 29])
        rows = pick_correct(batch, label, spc.threshold, spc.games_per_step, rng)
        out["spc/correct_responses"] = len(rows)
        if not rows:  # nothing verified correct this step: no game, neither player learns
            return out
        picked = batch.take(pa.array(rows))
        problems, steps = picked.column("prompt").to_pylist(), picked.column("response").to_pylist()
        prompts = pa.table({"prompt_id": picked.column("prompt_id"),
                            "prompt": [render(spc.template, p, r) for p, r in zip(problems, steps)],
                            "answer": picked.column("answer"), "problem": problems, "original": steps})
        variants, _ = await ctx.pools["sneaky"].call("generate", prompts, n=spc.variants, seq=SEQ0 + ctx.step,
                                                     versioned=True)
        scored, _ = await ctx.pools["verifier"].call("score", variants)
        scored = await scored
        responses = scored.column("response").to_pylist()
        status = variant_status(scored.column(B.REWARD_PREFIX + label).to_numpy(zero_copy_only=False),
                                responses, spc.threshold)
        valid = status == "wrong"
        played = np.nonzero(valid)[0]
        # the critic's items: every played variant, then (judge_correct) the correct steps rewritten
        source = np.arange(scored.num_rows) // spc.variants  # generate returns each prompt's samples together
        originals = list(range(len(rows))) if spc.judge_correct else []
        item_prompts = [problems[source[i]] for i in played] + [problems[j] for j in originals]
        item_steps = [responses[i] for i in played] + [steps[j] for j in originals]
        step_correct = np.array([False] * len(played) + [True] * len(originals), bool)
        out.update({"spc/variants": int(scored.num_rows), "spc/games": int(len(played))})
        out.update({f"spc/invalid/{why}": int((status == why).sum()) for why in ("not_wrong", "unverified", "empty")})
        critic_reward = np.full(scored.num_rows, np.nan)
        learning = []
        own = labelled_items(batch, label, spc.threshold, spc.policy_items, rng)
        out["spc/policy_items"] = own.num_rows
        if len(item_steps):
            items = pa.table({"prompt": item_prompts, "response": item_steps, "step_correct": step_correct})
            judged, _ = await ctx.pools["judge"].call("judge", items, versioned=True)
            judged = await judged
            p_yes = judged.column(B.REWARD_PREFIX + critic).to_numpy(zero_copy_only=False).astype(np.float64)
            accepts = np.nan_to_num(p_yes, nan=0.0) >= 0.5  # a step the critic cannot read is not accepted
            rewards = game_rewards(accepts, step_correct)
            critic_reward[played] = rewards[:len(played)]
            if len(played):  # (the policy's own rollouts are training items, not games)
                out["spc/sneaky_success_rate"] = float(np.mean(accepts[:len(played)]))
            if len(originals):
                out["spc/critic_accepts_correct"] = float(np.mean(accepts[len(played):]))
            out["spc/critic_win_rate"] = float(np.mean(rewards > 0))
            learning.append(self._learn_critic(ctx, items, own))
        elif own.num_rows:
            learning.append(self._learn_critic(ctx, None, own))
        sneaky = sneaky_rewards(valid, critic_reward, spc.invalid_reward)
        keep = ~np.isnan(sneaky)
        if keep.any():
            train = scored.filter(pa.array(keep)).append_column(
                B.REWARD_PREFIX + GAME, pa.array(sneaky[keep], pa.float32()))
            learning.append(self._learn_sneaky(ctx, train))
        for metrics in await asyncio.gather(*learning):
            out.update(metrics)
        return out

    async def _learn_critic(self, ctx, items: pa.Table | None, own: pa.Table) -> dict:
        metrics = await ctx.pools["critic_learner"].call("train_game", items, own, table=False)
        await publish(ctx, "critic", metrics["critic/version"])
        return metrics

    async def _learn_sneaky(self, ctx, table: pa.Table) -> dict:
        """The sneaky learner's credit step (its game reward only, the configured estimator), then its step."""
        table, credit = await asyncio.to_thread(sneaky_credit(ctx.config).apply, table)
        metrics = {**credit, **await ctx.pools["sneaky_learner"].call("train_step", table, table=False)}
        await publish(ctx, "sneaky", metrics["version"])
        keep = ("train/", "reward/mean", "samples/", "version")
        return {f"sneaky/{k}": v for k, v in metrics.items() if k.startswith(keep)}


# the game's reward is a win or a loss (+1 / -1), not a probability: grpo_bernoulli (GRPO for rewards
# in [0, 1]) is GRPO on any two-valued outcome, so the sneaky learner uses GRPO itself
BERNOULLI_OUTCOME = {"grpo_bernoulli": "grpo"}


def sneaky_credit(config) -> Credit:
    """The sneaky generator's reward is the game's alone (`reward.game`, weight 1), not the run's
    sources, with the run's estimator (GRPO for grpo_bernoulli); it keeps no state across steps (no
    running statistics), so the checkpoint needs none."""
    return Credit(config, aggregate={"weights": {GAME: 1.0}}, sources=[GAME],
                  advantages=Outcome(config, BERNOULLI_OUTCOME.get(config.algorithm.advantage)))
