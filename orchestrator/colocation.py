"""Colocation (`rollout.vllm_sleep_level`, docs/vllm.md): in a strict on-policy run the generators
idle while the learner trains, so where they share its GPU they sleep for the learner's step and
free their memory. Each wakes at its next weight update: the publish that ends the step, which
also loads the version the learner just made (a level-2 sleep discards the old weights)."""

from __future__ import annotations

import asyncio
import logging

from orchestrator.roles import ACTOR_ERRORS

log = logging.getLogger("coevo")


async def sleep_generators(ctx) -> bool:
    """Ask every live replica of the generator pools the channels publish to to sleep (a pool no
    channel publishes to would get no update to wake it). False if a replica cannot sleep (vLLM's
    CPU build): the loop then stops asking. A replica that died here is the pool's to restart; it
    comes back awake."""
    pools = {id(p): p for channel in ctx.channels.values() for p in channel.targets if p.spec.kind == "generator"}
    replicas = [(pool, rep) for pool in pools.values() for rep in pool.replicas if rep.alive]
    answers = await asyncio.gather(*[rep.handle.sleep.remote() for _, rep in replicas], return_exceptions=True)
    for (pool, rep), answer in zip(replicas, answers):
        if isinstance(answer, ACTOR_ERRORS):
            log.warning("role %s: replica %d died while going to sleep (%s)", pool.name, rep.index,
                        type(answer).__name__)
        elif isinstance(answer, BaseException):
            raise answer
    return False not in answers
