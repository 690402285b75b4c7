"""SPARK (Liu et al. 2025): policy and reward co-evolve in one model. Every RL step, the batch's
rollouts with their verifier labels also train the policy as a pointwise generative judge (the
`self_judge` objective on the same learner), and the policy's own judgment is a reward source
(`rewards: [{name: ..., judge: true}]`), next to the verifier's."""

from __future__ import annotations

from pydantic import Field

from orchestrator.config import Section
from pipelines.grpo import GRPO


class SparkConfig(Section):
    """SPARK's judge training on the policy's own rollouts (actors/objectives/self_judge.py)."""
    coef: float = Field(0.5, gt=0)  # weight of the judge's cross-entropy in every update
    per_update: int = Field(64, ge=1)  # judge examples per update, from the batch's labelled rollouts
    threshold: float = 0.5  # a response is correct when the first verifier source gives at least this

    def cross_check(self, config) -> None:
        if not config.fn_rewards():
            raise ValueError("recipe spark labels its judge examples with a verifier reward function "
                             "(rewards[].fn); the config has none")


class Spark(GRPO):
    settings = {"spark": SparkConfig}
    name = "spark"

    @classmethod
    def extra_objectives(cls, config) -> list[dict]:
        spark = getattr(config, "spark", None) or SparkConfig()
        return [{"name": "self_judge", "coef": spark.coef, "per_update": spark.per_update, "threshold": spark.threshold}]
