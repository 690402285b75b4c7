"""CUDA IPC weight updates between a learner and the replicas on its own GPU (actors/weight_ipc.py,
orchestrator/channels.py): chosen only where both ends report the same node and GPU, asked only
where the roles have GPUs, and falling back to the object store replica by replica, then for good.
On a CPU the IPC export itself cannot run: the fallback is what the channel tests see (on a fake
one-GPU cluster, with the actors' GPU identities stubbed). The `gpu` test runs the real transfer
between two processes on one GPU."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import ray
import torch

from actors import modeling, weight_ipc
from actors.weight_ipc import WeightTransportError
from actors.weights import export_state, inference_copy, load_state, payload_state
from orchestrator.channels import Channel
from orchestrator.config import WeightsConfig
from orchestrator.roles import Pool, RoleSpec

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}
GPU0 = {"node": "n1", "gpu": "GPU-0000"}


def test_only_replicas_on_the_learners_own_gpu_are_chosen() -> None:
    replicas = {("generator", 0): dict(GPU0), ("generator", 1): {"node": "n1", "gpu": "GPU-1111"},
                ("generator", 2): {"node": "n2", "gpu": "GPU-0000"}, ("judge", 0): None}
    assert weight_ipc.colocated(dict(GPU0), replicas) == {("generator", 0)}
    assert weight_ipc.colocated(None, replicas) == set()  # a learner on the CPU
    assert weight_ipc.colocated(dict(GPU0), {("judge", 0): None}) == set()


def test_without_a_gpu_the_export_and_the_mapping_say_why() -> None:
    learner = SimpleNamespace(full_state=lambda: modeling.tiny_model(modeling.char_tokenizer(), **TINY).state_dict(),
                              version=3)
    with pytest.raises(WeightTransportError, match="needs the learner's weights on a GPU; they are on cpu"):
        weight_ipc.export(learner, "bfloat16")
    if not torch.cuda.is_available():
        with pytest.raises(WeightTransportError, match="this process has no CUDA device"):
            weight_ipc.tensors({"handle": (None, [0] * 15), "layout": [], "gpu": "GPU-0000"})
        assert weight_ipc.identity(SimpleNamespace(device="cuda")) is None
    assert weight_ipc.identity(SimpleNamespace(device="cpu")) is None
    payload = export_state(learner.full_state(), 3)
    assert payload_state(payload) is payload["state"]


# ---- the channel on a fake cluster with one GPU ----------------------------------------------------
@pytest.fixture(scope="module")
def one_gpu():
    from orchestrator import cluster
    cluster.connect(SimpleNamespace(address=None, num_cpus=2, num_gpus=1, dashboard=False))
    yield
    ray.shutdown()


def pools(gpus: float, replicas: int = 2):
    config = SimpleNamespace(model=SimpleNamespace(dtype="auto"), weights=WeightsConfig())
    learner = Pool("policy_learner", RoleSpec("pool_actors:TinyLearner", kind="learner", num_cpus=0, num_gpus=gpus),
                   config)
    generators = Pool("generator", RoleSpec("pool_actors:TinyReplica", kind="generator", num_cpus=0, replicas=replicas,
                                            num_gpus=gpus / replicas), config)
    return learner, generators


def where(answer):
    """A stand-in for weight_ipc.identity, run in each actor (cloudpickled by value)."""
    return lambda actor: answer


async def publish_steps(channel: Channel, learner: Pool, generators: Pool, steps: int) -> list:
    await asyncio.gather(learner.ready(), generators.ready())
    seen = []
    for _ in range(steps):
        version = await learner.call("step", table=False)
        await channel.publish(version)
        seen.append((channel.takes_payload, channel.ipc_publishes, generators.own_fallbacks,
                     sorted(await generators.broadcast("checksum"))))
    learner.shutdown()
    generators.shutdown()
    return seen


@pytest.mark.slow
def test_colocated_replicas_try_ipc_then_fall_back_to_the_object_store_for_good(one_gpu) -> None:
    learner, generators = pools(0.45)
    channel = Channel("policy", learner, [generators])
    channel._identify = where(dict(GPU0))  # every actor "on GPU 0"; their weights are on the CPU, so the export fails
    seen = asyncio.run(asyncio.wait_for(publish_steps(channel, learner, generators, 3), 180))
    # step 1: both replicas tried IPC, both fell back; from step 2 the channel sends no IPC at all
    assert [s[1] for s in seen] == [1, 1, 1] and [s[2] for s in seen] == [2, 2, 2] and channel.ipc_broken
    assert [s[0] for s in seen] == [False, True, True]  # every replica on IPC: the step's payload is not needed
    for version, (_, _, _, sums) in enumerate(seen, start=1):
        assert [v for v, _ in sums] == [version, version]  # every replica holds each version
        assert sums[0][1] == pytest.approx(sums[1][1])


@pytest.mark.slow
def test_replicas_on_another_gpu_or_roles_on_the_cpu_never_try_ipc(one_gpu) -> None:
    learner, generators = pools(0.45)
    channel = Channel("policy", learner, [generators])
    other = {"node": "n1", "gpu": "GPU-1111"}
    channel._identify = lambda actor: dict(GPU0) if type(actor).__name__ == "TinyLearner" else other
    seen = asyncio.run(asyncio.wait_for(publish_steps(channel, learner, generators, 2), 180))
    assert [s[1] for s in seen] == [0, 0] and [s[2] for s in seen] == [0, 0] and not channel.ipc_broken
    assert channel._ipc_members is not None and channel._ipc_colocated == set()

    learner, generators = pools(0)  # a CPU run: no actor is even asked where it is

    def refuse(actor):
        raise AssertionError("asked for a GPU identity on a CPU run")

    channel = Channel("policy", learner, [generators])
    channel._identify = refuse
    seen = asyncio.run(asyncio.wait_for(publish_steps(channel, learner, generators, 2), 180))
    assert [s[1] for s in seen] == [0, 0] and channel._ipc_members is None
    assert [v for v, _ in seen[-1][3]] == [2, 2]
    off = Channel("policy", *pools(0.45))
    off.settings = WeightsConfig(cuda_ipc=False)
    assert not off._ipc_possible()


# ---- the real transfer, two processes on one GPU ---------------------------------------------------
def _receive(queue, payload, version) -> None:
    tok = modeling.char_tokenizer()
    model = inference_copy(modeling.tiny_model(tok, **TINY, seed=9), torch.bfloat16).to("cuda")
    load_state(model, payload, version, where="receiver")
    # as bytes: CPU tensors put on a queue travel as shared file descriptors that vanish with this
    # process (the parent then read EOF on the H200 when this child exited first)
    import io
    buffer = io.BytesIO()
    torch.save({k: v.float().cpu() for k, v in model.state_dict().items()}, buffer)
    queue.put(buffer.getvalue())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_colocated_process_loads_the_learners_weights_over_cuda_ipc() -> None:
    import torch.multiprocessing as mp

    tok = modeling.char_tokenizer()
    master = modeling.tiny_model(tok, **TINY, seed=1).to("cuda")
    learner = SimpleNamespace(full_state=master.state_dict, version=4, device="cuda")
    payload = weight_ipc.export(learner, "bfloat16")
    assert payload["version"] == 4 and {d for _, d, _, _ in payload["ipc"]["layout"]} == {torch.bfloat16}
    context = mp.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_receive, args=(queue, payload, 4))
    child.start()
    import io
    got = torch.load(io.BytesIO(queue.get(timeout=120)), weights_only=True)
    child.join(timeout=60)
    assert child.exitcode == 0
    for name, value in master.state_dict().items():
        assert torch.equal(got[name], value.to(torch.bfloat16).float().cpu()), name
