"""LaSeR (Yang et al. 2025, "Reinforcement learning with last-token self-rewarding"): the policy's
probability of a fixed token z right after its own response, r = beta * (log pi(z | x, y) - c),
is a self-reward that costs one extra token. GRPO trains on the verifier's reward where the verifier
labelled the prompt (`verifier.fraction`) and on the self-reward elsewhere (`aggregate.fill`), and
the learner adds an MSE loss that aligns r with the verifier's labels. Evaluation also measures how
well r separates correct from wrong responses (AUROC) and best-of-N reranking by r."""

from __future__ import annotations

from orchestrator.evaluation import greedy_accuracy, self_reward_quality
from orchestrator.recipes import Sources
from orchestrator.roles import RoleSpec
from pipelines.grpo import GRPO
from pipelines.stages.laser import LaserConfig


class Laser(GRPO):
    name = "laser"
    settings = {"laser": LaserConfig}  # its self-reward, named when its source is missing

    @classmethod
    def roles(cls, config, sources: Sources) -> dict[str, RoleSpec]:
        if not config.laser_rewards():
            raise ValueError("recipe laser needs a self-reward source, e.g. rewards: "
                             "[{name: correct, fn: integer_match}, {name: self, laser: true, weight: 0}]")
        return super().roles(config, sources)

    async def evaluate(self, ctx) -> dict:
        out = await greedy_accuracy(ctx)
        out.update(await self_reward_quality(ctx, seq=-1_000_000 - ctx.step))
        return out
