"""Which roles get GPUs (`roles.<name>.num_gpus: auto`, the default), and where they landed.

On a cluster whose resources include GPUs when the run starts, every replica of a role that runs a
model (generators and judges, learners, reward models: orchestrator.roles.MODEL_KINDS) asks for a
GPU: a whole one each where there are enough, else an equal share of one (two roles on one GPU:
0.45 each). A number in `roles.<name>.num_gpus` (or a recipe's) is used as given, and what it takes
is left to it. A learner with several ranks gets whole GPUs or none: NCCL cannot put two ranks of a
group on one device. On a CPU-only cluster nothing changes (and nothing is printed).

Ray's GPU fractions are logical: they decide where an actor runs, not how much memory it may use;
the roles sharing a GPU share its memory (orchestrator.memory checks that their models fit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from orchestrator.roles import AUTO, MODEL_KINDS, RoleSpec, resolve

SHARE = 0.9  # of a GPU that its auto roles split (0.45 each for two): room for explicit fractional asks


@dataclass
class Plan:
    gpus: dict[str, float] = field(default_factory=dict)  # auto role -> GPUs per replica
    notes: list[str] = field(default_factory=list)  # why an auto role stays on the CPU where GPUs exist
    cluster_gpus: float = 0.0

    def assign(self, roles: dict[str, RoleSpec]) -> dict[str, RoleSpec]:
        """The recipe's role specs with the planned GPUs where they said auto."""
        return {name: RoleSpec(**{**spec.__dict__, "num_gpus": self.gpus[name]})
                if spec.num_gpus == AUTO and name in self.gpus else spec for name, spec in roles.items()}


def cuda_usable() -> bool:
    """Whether torch in this process can use a CUDA device: on a GPU machine with torch's CPU build,
    Ray still counts the GPUs, but no actor could use them."""
    import torch

    return torch.cuda.is_available()


def make_plan(config, roles: dict[str, RoleSpec], resources: dict, cuda_ok: bool = True) -> Plan:
    """GPUs per replica for the roles that say auto (in the config and in the recipe), from the
    cluster's `resources` (ray.cluster_resources()). `cuda_ok`: whether the GPUs are usable (an
    embedded cluster: this process's torch; a joined cluster's workers are taken at Ray's word)."""
    total = float(resources.get("GPU", 0) or 0)
    auto: dict[str, tuple[RoleSpec, int]] = {}
    taken = 0.0
    for name, spec in roles.items():
        ask = _asked(config, name, spec)
        count = resolve(spec, config.roles.get(name) if config is not None else None, config).max_replicas
        if ask != AUTO:
            taken += float(ask) * count
        elif spec.kind in MODEL_KINDS:
            auto[name] = (spec, count)
    plan = Plan(gpus={name: 0.0 for name in auto}, cluster_gpus=total)
    if not auto or total <= 0:
        return plan
    if not cuda_ok:
        import torch

        plan.notes.append(f"Ray counts {total:g} GPU(s), but this torch ({torch.__version__}) cannot use CUDA: "
                          "every role stays on the CPU (install torch's CUDA build, or set ray.num_gpus=0 to say so)")
        return plan
    free = max(0.0, total - taken)
    whole = math.floor(free + 1e-9)
    singles = {}
    for name, (spec, count) in auto.items():  # ranks of one group: a GPU each, or the CPU
        if spec.kind == "learner" and count > 1:
            if whole >= count:
                plan.gpus[name], whole, free = 1.0, whole - count, free - count
            else:
                plan.notes.append(f"roles.{name}: its {count} ranks need a GPU each (NCCL puts no two ranks on "
                                  f"one), and {whole} whole GPU(s) are free: it stays on the CPU "
                                  f"(set roles.{name}.num_gpus, or fewer replicas)")
        else:
            singles[name] = count
    units = sum(singles.values())
    if not units:
        return plan
    if units <= whole:
        share = 1.0
    elif whole >= 1:
        share = _floor(SHARE / math.ceil(units / whole))
    else:
        share = _floor(SHARE * free / units)
    for name in singles:
        plan.gpus[name] = share
    if share <= 0:
        plan.notes.append(f"roles {sorted(singles)}: the explicit GPU asks leave no room on the cluster's "
                          f"{total:g} GPU(s): they stay on the CPU")
    return plan


def _asked(config, name: str, spec: RoleSpec):
    override = config.roles.get(name) if config is not None else None
    if override is not None and "num_gpus" in override.model_fields_set and override.num_gpus != AUTO:
        return override.num_gpus
    return spec.num_gpus


def _floor(x: float) -> float:
    return math.floor(x * 100 + 1e-9) / 100


# ---- where the replicas landed ---------------------------------------------------------------------
def where(actor) -> dict:
    """Run inside a replica (Ray's `__ray_call__`): its torch device, Ray's GPU ids and its node."""
    import ray

    from actors.runtime import device_of

    return {"device": device_of(actor), "gpus": [str(g) for g in ray.get_gpu_ids()],
            "node": ray.util.get_node_ip_address()}


async def landed(pools: dict, seen: set) -> str | None:
    """`placement: generator -> GPU 0 (0.45), policy_learner -> GPU 0 (0.45), verifier -> CPU`: where
    the replicas of the pools not reported yet run; None where no pool asked for a GPU."""
    import asyncio

    new = {name: pool for name, pool in pools.items() if name not in seen}
    seen.update(new)
    if not any(pool.spec.num_gpus for pool in new.values()):
        return None
    names = list(new)
    reports = await asyncio.gather(*[asyncio.gather(*[r.handle.__ray_call__.remote(where)
                                                      for r in new[n].replicas if r.alive]) for n in names])
    nodes = {r["node"] for rs in reports for r in rs}
    parts = [describe(name, new[name].spec.num_gpus, rs, len(nodes) > 1) for name, rs in zip(names, reports)]
    return "placement: " + ", ".join(parts)


def describe(name: str, num_gpus: float, reports: list[dict], nodes: bool = False) -> str:
    """One role's placement, e.g. `generator -> GPU 0 (0.45)` or `generator x4 -> GPUs 0,1 (0.45 each)`."""
    count = f" x{len(reports)}" if len(reports) > 1 else ""
    gpus = sorted({g for r in reports for g in r["gpus"]}, key=lambda g: (len(g), g))
    where_ = ", ".join(sorted({r["node"] for r in reports})) if nodes else ""
    at = f" on {where_}" if where_ else ""
    if not gpus:
        devices = sorted({r["device"] for r in reports})
        return f"{name}{count} -> {'/'.join(d.upper() if d == 'cpu' else d for d in devices)}{at}"
    share = f" ({num_gpus:g}{' each' if count else ''})"
    return f"{name}{count} -> GPU{'s' if len(gpus) > 1 else ''} {','.join(gpus)}{share}{at}"
