"""Weight channels: explicit edges from a learner to the pools that host its model.

Policy learner -> generators (and a judge); reward-model learner -> reward-model scorers. Each learner
counts its own versions; a channel publishes the learner's weights once to the object store and sends
that one payload to every replica of every target pool (all or nothing per replica: actors.weights).
"""

from __future__ import annotations

from orchestrator.roles import Pool


class Channel:
    def __init__(self, name: str, learner: Pool, targets: list[Pool], method: str = "publish"):
        self.name, self.learner, self.targets, self.method = name, learner, targets, method
        self.version = 0  # the learner version last published
        self.publishes = 0

    async def publish(self, version: int, wait: bool = True) -> None:
        """Publish the learner's weights at `version`. With `wait`, return once every replica holds
        them (strict on-policy); otherwise replicas take them between their requests."""
        # every rank of the learner takes part (a sharded model is gathered); the payload is not fetched
        payload, _ = await self.learner.call(self.method + "_parts")
        for pool in self.targets:
            await pool.set_weights(version, payload, wait=wait)
        self.version = version
        self.publishes += 1

    def lag(self, learner_version: int) -> int:
        """Versions the most out-of-date replica of this channel's targets is behind the learner."""
        return max((pool.lag(learner_version) for pool in self.targets), default=0)
