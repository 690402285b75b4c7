"""Cooper (Hong et al. 2025): the policy and a reward model trained together.

Each step the reward model scores the batch (one version for the whole batch), the policy learns
from the reward model's scores (mixed with the verifier's by the reward weights), and — in parallel —
the reward-model learner builds verifier-labelled pairs from that same batch (a correct response
against the wrong one the reward model currently scores highest), trains on them, and publishes its
new weights to the reward-model actors before they score the next batch. The verifier may label
only a fraction of the prompts (`verifier.fraction`).
"""

from __future__ import annotations

import asyncio

from orchestrator.channels import Channel
from orchestrator.recipes import Sources
from orchestrator.roles import RoleSpec
from pipelines.grpo import GRPO, publish
from pipelines.stages.reward_model import RewardModelConfig


def trained_source(config) -> str:
    """The `model:` reward source the reward-model learner trains (the first one)."""
    models = config.model_rewards()
    if not models:
        raise ValueError("recipe cooper needs a reward model among rewards, e.g. "
                         "{name: rm, model: auto} (see reward_model.warmup_steps)")
    return models[0].name


class Cooper(GRPO):
    name = "cooper"
    online_judge = False  # its learn step trains the policy and the reward model only
    settings = {"reward_model": RewardModelConfig}  # the reward model it trains, named when its source is missing

    @classmethod
    def roles(cls, config, sources: Sources) -> dict[str, RoleSpec]:
        roles = super().roles(config, sources)
        name = trained_source(config)
        start = sources.learners.get("rm_learner", sources.reward_models.get(name))
        roles["rm_learner"] = RoleSpec("actors.reward_learner:RewardLearner", (start,),
                                       {"source": name, **config.reward_model.learner_args(config)},
                                       kind="learner", num_cpus=0)
        return roles

    def channels(self, ctx) -> dict:
        channels = super().channels(ctx)
        channels["reward_model"] = Channel("reward_model", ctx.pools["rm_learner"], [ctx.pools["reward_model"]])
        return channels

    async def learn(self, ctx, tables: list, dump_path: str | None) -> dict:
        policy, rm = await asyncio.gather(
            ctx.pools["policy_learner"].call("train_step", *tables, dump_path=dump_path, table=False),
            ctx.pools["rm_learner"].call("update_from_rollouts", *tables, table=False))
        await asyncio.gather(publish(ctx, "policy", policy["version"]),
                             publish(ctx, "reward_model", rm["rm/version"]))
        return {**policy, **rm}
