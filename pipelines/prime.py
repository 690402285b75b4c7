"""PRIME (Cui et al. 2025): GRPO-style training on dense implicit process rewards combined with the
outcome reward. Per step: the implicit PRM (its own learner, initialised from the policy) updates on
the verifier's outcome labels for the batch and scores it into `token_rewards`; the credit step adds their
leave-one-out-baselined returns (x prime.process_weight) to the outcome advantage."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from orchestrator.config import Section
from orchestrator.recipes import Sources
from orchestrator.roles import RoleSpec
from pipelines.grpo import GRPO
from pipelines.stages.reward_model import RewardModelConfig


class PrimeConfig(Section):
    """PRIME (Cui et al. 2025): implicit process rewards beta * log(pi_phi / pi_ref) per token."""
    beta: float = Field(0.05, gt=0)
    lr: float = Field(1e-4, gt=0)  # of the implicit PRM (a causal LM initialised from the policy)
    process_weight: float = Field(1.0, ge=0)  # dense advantage coefficient
    label_source: Optional[str] = None  # verifier source giving outcome labels (default: first fn)


class Prime(GRPO):
    # reward_model.label_threshold labels its implicit PRM's outcomes, with or without a `model:` source
    settings = {"prime": PrimeConfig, "reward_model": RewardModelConfig}
    name = "prime"

    @classmethod
    def roles(cls, config, sources: Sources) -> dict[str, RoleSpec]:
        roles = super().roles(config, sources)
        start = sources.learners.get("prm_learner", sources.policy)
        reference = sources.references.get("prm_learner", sources.policy)
        prime = config.prime
        roles["prm_learner"] = RoleSpec("actors.prm_learner:ImplicitPRM", (start, reference),
                                        {"beta": prime.beta, "lr": prime.lr, "label": config.label_source(prime),
                                         "threshold": config.reward_model.label_threshold}, kind="learner", num_cpus=0)
        return roles

    @classmethod
    def process_weight(cls, config) -> float:
        """The credit step adds the implicit process rewards' advantages times prime.process_weight."""
        return config.prime.process_weight

    async def score_batch(self, ctx, tables: list) -> list:
        tables = await super().score_batch(ctx, tables)
        table, info = await ctx.pools["prm_learner"].call("update_and_score", *tables)
        ctx.versions["prm_learner"] = info["prm/version"]
        self._prm_info = {k: v for k, v in info.items() if k != "busy_s"}
        return [table]

    async def learn(self, ctx, tables: list, dump_path: str | None) -> dict:
        return {**await super().learn(ctx, tables, dump_path), **getattr(self, "_prm_info", {})}
