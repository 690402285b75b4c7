"""LaSeR (Yang et al. 2025, "Reinforcement learning with last-token self-rewarding"): the policy's
probability of a fixed token z right after its own response, r = beta * (log pi(z | x, y) - c),
is a self-reward that costs one extra token. GRPO trains on the verifier's reward where the verifier
labelled the prompt (`verifier.fraction`) and on the self-reward elsewhere (`aggregate.fill`), and
the learner adds an MSE loss that aligns r with the verifier's labels. Evaluation also measures how
well r separates correct from wrong responses (AUROC) and best-of-N reranking by r."""

from __future__ import annotations

import numpy as np

from actors import batch as B
from orchestrator.evaluation import auroc, greedy_accuracy
from orchestrator.recipes import Sources
from orchestrator.roles import RoleSpec
from pipelines.grpo import GRPO


class Laser(GRPO):
    name = "laser"

    @classmethod
    def roles(cls, config, sources: Sources) -> dict[str, RoleSpec]:
        if not config.laser_rewards():
            raise ValueError("recipe laser needs a self-reward source, e.g. rewards: "
                             "[{name: correct, fn: integer_match}, {name: self, laser: true, weight: 0}]")
        return super().roles(config, sources)

    async def evaluate(self, ctx) -> dict:
        out = await greedy_accuracy(ctx)
        cfg = ctx.config
        n = cfg.laser.best_of
        prompts = ctx.prompts.eval.slice(0, cfg.laser.eval_prompts)
        gen, ver = ctx.pools["generator"], ctx.pools["verifier"]
        table, _ = await gen.call("generate", prompts, n=n, seq=-1_000_000 - ctx.step, versioned=True)
        scored, _ = await ver.call("score", table)
        scored = await scored
        # log pi(z | x, y): the self-reward up to its positive scale and offset (rankings are the same)
        self_r = scored.column("laser_logprob").to_numpy(zero_copy_only=False)
        correct = scored.column(B.REWARD_PREFIX + cfg.accuracy_source()).fill_null(0).to_numpy(
            zero_copy_only=False) >= 0.5
        groups = B.group_index(scored)
        best, mean = [], []
        for g in np.unique(groups):
            rows = np.nonzero(groups == g)[0]
            best.append(correct[rows[np.argmax(self_r[rows])]])
            mean.append(correct[rows].mean())  # the expected accuracy of a random pick
        out.update({"eval/self_reward_auroc": auroc(self_r, correct),
                    f"eval/best_of_{n}_accuracy": float(np.mean(best)),
                    "eval/random_pick_accuracy": float(np.mean(mean)),
                    "eval/best_of_n_gain": float(np.mean(best) - np.mean(mean))})
        return out
