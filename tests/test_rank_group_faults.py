"""A rank group's faults on one small in-process Ray cluster, with a tiny gloo group of 2 ranks
(tests/pool_actors.Ranked): a rank killed while the other waits in a collective is a lost learner
(the run restarts), never a crash; a rank that hangs hits the role's timeout; a rank that raises is
a bug that ends the run. In every case no rank is left running."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import torch
import ray

from orchestrator.rank_group import RankGroup
from orchestrator.roles import RoleError, RoleSpec
from test_pool_faults import cluster, run  # noqa: F401  (the module's cluster fixture)

pytestmark = pytest.mark.slow


async def formed(timeout_s: float | None = None) -> RankGroup:
    group = RankGroup("policy_learner", RoleSpec("pool_actors:Ranked", kind="learner", replicas=2, num_cpus=0,
                                                 timeout_s=timeout_s), None)
    await group.ready()
    assert await group.call("reduce", 1.5, table=False) == 3.0  # rank 0's answer: the sum over both
    return group


def all_stopped(group: RankGroup) -> bool:
    return all(rep.dead and not rep.alive for rep in group.replicas)


def test_a_rank_killed_inside_a_collective_is_a_lost_learner(cluster) -> None:  # noqa: F811
    async def main():
        group = await formed()
        pids = await group.broadcast("ping")
        call = asyncio.ensure_future(group.call("reduce", 1.0, stall={1: 60}, table=False))
        await asyncio.sleep(2)  # rank 0 waits in the all-reduce for rank 1, which sleeps
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(RoleError, match=r"^rank 1 of the 2 ranks of role 'policy_learner' \(Ranked\) has died in "
                                            r"reduce: Worker unexpectedly exits[^.]*; every rank was stopped$") as e:
            await call
        assert e.value.lost_learner and all_stopped(group)
        group.shutdown()

    run(main())


def test_a_hung_rank_hits_the_timeout_and_a_raising_rank_ends_the_run(cluster) -> None:  # noqa: F811
    async def main():
        group = await formed(timeout_s=3)
        with pytest.raises(RoleError, match=r"reduce on its 2 ranks gave no answer within "
                                            r"roles.policy_learner.timeout_s=3s; every rank was stopped") as e:
            await group.call("reduce", 1.0, stall={1: 60}, table=False)
        assert e.value.lost_learner and all_stopped(group)
        group.shutdown()

        group = await formed()
        with pytest.raises(ray.exceptions.RayTaskError, match="rank 0 failed on purpose"):
            await group.call("reduce", 1.0, fail=0, table=False)
        assert not group.fatal.lost_learner and all_stopped(group)  # a bug: no restart
        group.shutdown()

    run(main())


def test_a_collective_that_lost_its_peer_is_told_from_a_bug() -> None:
    from orchestrator.rank_group import _peer_lost

    def raised(cause: BaseException) -> ray.exceptions.RayTaskError:
        return ray.exceptions.RayTaskError("reduce", "Traceback ...", cause)

    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:22943")
    assert _peer_lost(raised(gloo))
    assert _peer_lost(raised(torch.distributed.DistNetworkError("recv timed out")))
    assert not _peer_lost(raised(ValueError("rank 0 failed on purpose")))
    assert not _peer_lost(raised(RuntimeError("shape mismatch")))
    assert not _peer_lost(None)
