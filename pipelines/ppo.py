"""PPO with a critic (Schulman et al. 2017; as in verl and OpenRLHF): a `critic` learner -- a value
head on the policy's architecture, started from the policy's weights, with its own optimizer and
value clipping -- values every response token of a batch at one version; the credit step turns
the outcome reward and those values into per-token GAE advantages (algorithm.advantage: gae) and
returns; the policy trains on the advantages while the critic trains on the returns. Generation
and verification are GRPO's."""

from __future__ import annotations

import asyncio
from typing import Optional

from pydantic import Field

from orchestrator.config import Section
from orchestrator.credit import GAE
from orchestrator.recipes import Sources
from orchestrator.roles import RoleSpec
from pipelines.grpo import GRPO


class PPOConfig(Section):
    """PPO's critic and GAE (docs/recipes.md)."""
    gamma: float = Field(1.0, ge=0, le=1)  # discount per token
    lam: float = Field(0.95, ge=0, le=1)  # GAE's lambda
    critic_lr: Optional[float] = Field(None, gt=0)  # None: algorithm.lr
    value_clip: float = Field(0.2, gt=0)  # a new value stays within this of the value at sampling
    whiten_advantages: bool = True  # normalise the advantages over the batch's tokens


class PPO(GRPO):
    settings = {"ppo": PPOConfig}
    name = "ppo"

    @classmethod
    def roles(cls, config, sources: Sources) -> dict[str, RoleSpec]:
        roles = super().roles(config, sources)
        ppo = getattr(config, "ppo", None) or PPOConfig()
        start = sources.learners.get("critic", sources.policy)
        roles["critic"] = RoleSpec("actors.learner:Learner", (start,), kind="learner", num_cpus=0,
                                   kwargs={"objectives": [{"name": "value", "clip_eps": ppo.value_clip}],
                                           "lr": ppo.critic_lr, "reference": False})
        return roles

    @classmethod
    def advantages(cls, config) -> GAE:
        """The credit step runs GAE on the critic's values; the batch gains the critic's `returns`."""
        ppo = config.ppo
        return GAE(ppo.gamma, ppo.lam, ppo.whiten_advantages)

    async def score_batch(self, ctx, tables: list) -> list:
        """The critic values the whole batch at one version (it trains only between batches)."""
        tables = await super().score_batch(ctx, tables)
        valued = [await ctx.pools["critic"].call("call_objective", "value", "values_of", t) for t in tables]
        return [t for t, _ in valued]

    async def learn(self, ctx, tables: list, dump_path: str | None) -> dict:
        """The policy on the GAE advantages and the critic on the returns, at once (both come from
        the credit step)."""
        policy, critic = await asyncio.gather(
            super().learn(ctx, tables, dump_path),
            ctx.pools["critic"].call("call_objective", "value", "step", *tables, table=False))
        ctx.versions["critic"] = critic.pop("version")
        critic["critic/grad_norm"] = critic.pop("train/grad_norm")
        return {**policy, **critic, "critic/version": ctx.versions["critic"]}
