"""DPH-RL (Li et al. 2025): GRPO plus a rehearsal of the initial policy's own samples under a
mass-covering f-divergence (forward KL or Jensen-Shannon), which keeps the diversity (pass@k) that
reverse-KL or no-KL RL loses. Before the first step, the generators (still at the initial weights)
sample `dph.prompts` training prompts `dph.samples` times; those the verifier accepts (or all,
`dph.keep: all`) become the rehearsal set, with their log-probs: no reference model runs online.
The set is checkpointed with the learner, so a resumed run keeps the initial policy's samples."""

from __future__ import annotations

import asyncio
from typing import Literal

import numpy as np
import pyarrow as pa
from pydantic import Field

from orchestrator.config import Section
from pipelines.grpo import GRPO


class DPHConfig(Section):
    """DPH-RL's rehearsal (actors/objectives/rehearsal.py)."""
    divergence: Literal["forward_kl", "js"] = "js"
    coef: float = Field(0.1, gt=0)  # weight of the rehearsal divergence in every update
    batch: int = Field(32, ge=1)  # rehearsal samples per update
    prompts: int = Field(64, ge=1)  # training prompts the initial policy samples for the set
    samples: int = Field(4, ge=1)  # samples per prompt
    keep: Literal["correct", "all"] = "correct"  # which samples enter the set
    threshold: float = 1.0  # a sample is correct when the first verifier source gives at least this

    def cross_check(self, config) -> None:
        if self.keep == "correct" and not config.fn_rewards():
            raise ValueError("dph.keep=correct needs a verifier reward function (rewards[].fn) to tell correct "
                             "samples; or set dph.keep=all")


class DPH(GRPO):
    settings = {"dph": DPHConfig}
    name = "dph"

    @classmethod
    def extra_objectives(cls, config) -> list[dict]:
        dph = getattr(config, "dph", None) or DPHConfig()
        return [{"name": "rehearsal", "divergence": dph.divergence, "coef": dph.coef, "batch": dph.batch}]

    async def prepare(self, ctx) -> None:
        """The rehearsal set, drawn once from the initial policy (a resumed run has it already)."""
        await super().prepare(ctx)
        learner = ctx.pools["policy_learner"]
        if await learner.call("call_objective", "rehearsal", "size", table=False):
            return
        cfg, gen, ver = ctx.config.dph, ctx.pools["generator"], ctx.pools["verifier"]
        train = ctx.prompts.train
        pick = np.random.default_rng([ctx.config.seed, 7]).choice(train.num_rows, min(cfg.prompts, train.num_rows),
                                                                  replace=False)
        prompts = train.take(pa.array(np.sort(pick)))

        async def sample(i, chunk):  # negative seqs: never the names of training samples
            table, _ = await gen.call("generate", chunk, n=cfg.samples, seq=-1000 - i)
            scored, _ = await ver.call("score", table)
            return await scored

        tables = await asyncio.gather(*[sample(i, c) for i, c in enumerate(ctx.split(prompts, len(gen.replicas)))])
        table = pa.concat_tables(tables)
        if cfg.keep == "correct":
            source = ctx.config.fn_rewards()[0].name
            score = table.column(f"reward.{source}").to_numpy(zero_copy_only=False).astype(np.float64)
            table = table.filter(pa.array(np.nan_to_num(score, nan=-np.inf) >= cfg.threshold))
        size = await learner.call("call_objective", "rehearsal", "set", table, table=False)
        ctx.progress.print(f"dph: rehearsal set of {size} samples from the initial policy "
                           f"({cfg.prompts} prompts x {cfg.samples}, keep {cfg.keep}, {cfg.divergence})")
