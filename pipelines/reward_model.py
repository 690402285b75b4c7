"""Train a scalar reward model with the Bradley-Terry loss.

Pairs come from a file (`reward_model.pairs_path`: prompt, chosen, rejected) or, by default, from
the policy's own samples: the generators sample the warm policy, the verifier labels the samples,
and within each prompt a correct response is paired with a wrong one. Held-out pairwise accuracy is
measured on pairs from the held-out prompts (or the file's held-out split). The result loads with
`AutoModelForSequenceClassification.from_pretrained(<run>/checkpoints/final/rm_learner)`.
"""

from __future__ import annotations

import asyncio

from orchestrator.pair_source import PairSource, load_pair_splits
from orchestrator.recipes import Recipe, Sources
from orchestrator.reward_health import health_info
from orchestrator.roles import RoleSpec
from pipelines.stages.reward_model import RewardModelConfig


class RewardModelTraining(Recipe):
    name = "reward_model"
    settings = {"reward_model": RewardModelConfig}  # its own, with or without a `model:` reward source
    policy = False  # the policy is not trained; it only samples (from the warm-up) when pairs are built
    learns_rewards = True  # from the verifier's labels (verifier.probe_share holds some out)

    @classmethod
    def from_file(cls, config) -> bool:
        return config.reward_model.pairs_path is not None

    @classmethod
    def needs_warm_policy(cls, config) -> bool:
        # pairs from a file still start the reward model from the warm policy unless `init` names one
        return config.reward_model.init is None or not cls.from_file(config)

    @classmethod
    def roles(cls, config, sources: Sources) -> dict[str, RoleSpec]:
        start = sources.learners.get("rm_learner") or config.reward_model.init or sources.policy
        roles = {"rm_learner": RoleSpec("actors.reward_learner:RewardLearner", (start,),
                                        config.reward_model.learner_args(config), kind="learner", num_cpus=1)}
        if not cls.from_file(config):
            roles["generator"] = RoleSpec("actors.generator:Generator", (sources.policy,), cls.generator_args(config),
                                          kind="generator", num_cpus=1)
            roles["verifier"] = RoleSpec("actors.verifier:Verifier", kind="verifier", num_cpus=0)
        return roles

    def make_source(self, ctx, state):
        if self.from_file(ctx.config):
            train, held_out = load_pair_splits(ctx.config.reward_model, ctx.config.seed)
            self._held_out = held_out
            return PairSource(ctx, train, state)
        return super().make_source(ctx, state)

    async def score_piece(self, ctx, table):
        table, info = await ctx.pools["verifier"].call("score", table)
        return table, {"verify_s": info["busy_s"], **health_info(info)}

    async def prepare(self, ctx) -> None:
        """Held-out pairs: the file's split, or pairs built from samples of the held-out prompts."""
        learner = ctx.pools["rm_learner"]
        if self.from_file(ctx.config):
            if not hasattr(self, "_held_out"):
                self._held_out = load_pair_splits(ctx.config.reward_model, ctx.config.seed)[1]
            await learner.call("set_eval_pairs", self._held_out, table=False)
            return
        gen, ver = ctx.pools["generator"], ctx.pools["verifier"]

        async def sample(i, chunk):  # negative seqs: held-out samples never share a name with training ones
            table, _ = await gen.call("generate", chunk, seq=-1 - i)
            scored, _ = await ver.call("score", table)
            return scored

        chunks = ctx.split(ctx.prompts.eval, len(gen.replicas))
        tables = await asyncio.gather(*[sample(i, c) for i, c in enumerate(chunks)])
        await learner.call("set_eval_pairs_from_rollouts", *tables, table=False)

    async def learn(self, ctx, tables: list, dump_path: str | None) -> dict:
        learner = ctx.pools["rm_learner"]
        if self.from_file(ctx.config):
            out = await learner.call("train_pairs", *tables, table=False)
        else:
            out = await learner.call("update_from_rollouts", *tables, table=False)
        ctx.versions["rm_learner"] = out["rm/version"]
        return out

    async def evaluate(self, ctx) -> dict:
        return {k.replace("rm/eval_", "eval/"): v for k, v in
                (await ctx.pools["rm_learner"].call("evaluate_pairs", table=False)).items()}
