"""PRIME (Cui et al. 2025): GRPO-style training on dense implicit process rewards combined with the
outcome reward. Per step: the implicit PRM (its own learner, initialised from the policy) updates on
the verifier's outcome labels for the batch and scores it into `token_rewards`; the policy learner
adds their leave-one-out-baselined returns (x prime.process_weight) to the outcome advantage."""

from __future__ import annotations

from orchestrator.recipes import Sources
from orchestrator.roles import RoleSpec
from pipelines.grpo import GRPO


class Prime(GRPO):
    name = "prime"

    @classmethod
    def roles(cls, config, sources: Sources) -> dict[str, RoleSpec]:
        roles = super().roles(config, sources)
        start = sources.learners.get("prm_learner", sources.policy)
        reference = sources.references.get("prm_learner", sources.policy)
        roles["prm_learner"] = RoleSpec("actors.prm_learner:ImplicitPRM", (start, reference), kind="learner",
                                        num_cpus=0)
        return roles

    async def score_batch(self, ctx, tables: list) -> list:
        tables = await super().score_batch(ctx, tables)
        table, info = await ctx.pools["prm_learner"].call("update_and_score", *tables)
        ctx.versions["prm_learner"] = info["prm/version"]
        self._prm_info = {k: v for k, v in info.items() if k != "busy_s"}
        return [table]

    async def learn(self, ctx, tables: list, dump_path: str | None) -> dict:
        return {**await super().learn(ctx, tables, dump_path), **getattr(self, "_prm_info", {})}
