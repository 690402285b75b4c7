"""Building a run's pools from its roles: a learner with several replicas is a rank group
(orchestrator.rank_group), every other role a pool of independent replicas (orchestrator.roles)."""

from __future__ import annotations

import asyncio

import ray

from orchestrator.rank_group import RankGroup
from orchestrator.roles import Pool, RoleError, RoleSpec, resolve


def build_pools(recipe_roles: dict[str, RoleSpec], config) -> dict[str, Pool]:
    pools = {}
    for name, spec in recipe_roles.items():
        spec = resolve(spec, config.roles.get(name), config)
        pools[name] = (RankGroup if spec.learner and spec.replicas > 1 else Pool)(name, spec, config)
    return pools


async def ready(pools: dict) -> None:
    """Every replica constructed; a constructor that fails is reported by role."""
    async def one(name: str, pool) -> None:
        try:
            await pool.ready()
        except ray.exceptions.RayActorError as e:
            oom = getattr(pool, "_out_of_memory", None)
            if oom is not None and oom("__init__", e):
                raise pool.fatal from None
            raise RoleError(f"role {name!r}: {startup_error(e)}") from None

    await asyncio.gather(*[one(name, p) for name, p in pools.items()])


def startup_error(e: BaseException) -> str:
    import re

    text = str(e)
    init = re.search(r"ray::(\w+)\.__init__", text) or re.search(r"class_name: (\w+)", text)
    cause = text.strip().splitlines()[-1]
    return f"{f'the {init.group(1)} actor' if init else 'its actor'} failed to start: {cause}"
