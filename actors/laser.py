"""LaSeR's self-reward on the generator's side (Yang et al. 2025, last-token self-rewarding): with
each sample a generator returns log pi(z | prompt, response) of the verification token z, as the
`laser_logprob` column, at the cost of one extra token. The credit step turns it into the
self-reward beta * (. - c) (pipelines/laser_reward.py); the learner aligns it with the verifier
(actors/objectives/laser_align.py). A generator does this only with a `LaserSpec`, a role argument its
recipe builds from the config's laser section."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from actors.judging import single_token

COLUMN = "laser_logprob"


@dataclass(frozen=True)
class LaserSpec:
    token: str  # z (laser.token): one token for the generator's tokenizer

    def token_id(self, tokenizer) -> int:
        return single_token(tokenizer, self.token, "laser.token")


def columns(next_logprobs: np.ndarray | None) -> dict:
    """The rollout table's LaSeR column, where the backend was asked for the token after each response."""
    return {} if next_logprobs is None else {COLUMN: pa.array(next_logprobs, pa.float32())}
