"""Collective weight transport over gloo on 127.0.0.1: exact copies in buckets, never a partial
version, mismatched models refused by name."""

from __future__ import annotations

import multiprocessing as mp
import threading

import pytest
import torch

from actors.weight_transport import Endpoint, Link, WeightTransportError, layout
from actors.weights import WeightMismatchError


class Net(torch.nn.Module):
    """Mixed dtypes and odd sizes, so packing and alignment are exercised."""

    def __init__(self, width: int = 33, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.a = torch.nn.Linear(width, 17)
        self.b = torch.nn.Parameter(torch.randn(5, 3, generator=g).to(torch.bfloat16))
        self.register_buffer("steps", torch.tensor([seed, 7, 11], dtype=torch.int64))
        with torch.no_grad():
            self.a.weight.copy_(torch.randn(17, width, generator=g))
            self.a.bias.copy_(torch.randn(17, generator=g))


def _link(port: int, world: int, group: str = "g1", bucket_mb: float = 1e-3, timeout_s: float = 20.0) -> Link:
    return Link("policy", group, "127.0.0.1", port, world, "gloo", timeout_s, bucket_mb)


def _receive_all(link: Link, models: list, version: int) -> list:
    """Each model's receiver in its own thread (every rank blocks in the collective)."""
    errors: list = [None] * len(models)

    def one(i):
        try:
            Endpoint().receive(link, i + 1, models[i], version, where=f"replica {i}")
        except Exception as e:  # noqa: BLE001  (handed back to the test)
            errors[i] = e
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(models))]
    for t in threads:
        t.start()
    return threads, errors


def test_broadcast_in_buckets_equals_the_sender_exactly():
    source, targets = Net(seed=1), [Net(seed=2), Net(seed=3)]
    state = source.state_dict()
    entries, sizes = layout(state, 1e-3)  # 1 KiB buckets: the 33x17 fp32 weight alone needs 3
    assert len(sizes) >= 3 and max(e.bucket for e in entries) == len(sizes) - 1
    sender = Endpoint()
    port = sender.open("policy", "g1", "127.0.0.1", 20.0)
    link = _link(port, 3)
    threads, errors = _receive_all(link, targets, version=4)
    sender.send(link, state, 4)
    for t in threads:
        t.join()
    assert errors == [None, None]
    for target in targets:
        for name, value in target.state_dict().items():
            assert value.dtype == state[name].dtype and torch.equal(value, state[name]), name


def test_mismatched_model_is_refused_naming_the_tensor():
    source, target = Net(width=33), Net(width=34, seed=5)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    sender = Endpoint()
    link = _link(sender.open("policy", "g1", "127.0.0.1", 20.0), 2)
    threads, errors = _receive_all(link, [target], version=1)
    sender.send(link, source.state_dict(), 1)  # the receiver drains every bucket before refusing
    threads[0].join()
    assert isinstance(errors[0], WeightMismatchError)
    assert "a.weight: shape (17, 33) != (17, 34)" in str(errors[0]) and "nothing was loaded" in str(errors[0])
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())


def test_a_header_of_another_version_is_refused():
    source, target = Net(seed=1), Net(seed=2)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    sender = Endpoint()
    link = _link(sender.open("policy", "g1", "127.0.0.1", 20.0), 2)
    threads, errors = _receive_all(link, [target], version=3)
    sender.send(link, source.state_dict(), 2)
    threads[0].join()
    assert "says version 2 but was sent as version 3" in str(errors[0])
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())


def _dying_sender(port_queue, link_fields):
    """Opens the store, sends the header and the first bucket, then dies without a word."""
    import os

    from actors.weight_transport import Sender, host_store

    store = host_store("127.0.0.1", 20.0)
    port_queue.put(store.port)
    link = Link(**{**link_fields, "port": store.port})
    steps = Sender(link, store).steps(Net(seed=9).state_dict(), 5)
    next(steps), next(steps)  # header, bucket 0
    os._exit(1)


def test_a_sender_that_dies_mid_broadcast_installs_nothing():
    target = Net(seed=2)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    fields = dict(channel="policy", group="g9", host="127.0.0.1", port=0, world_size=2, backend="gloo",
                  timeout_s=20.0, bucket_mb=1e-3)
    ctx = mp.get_context("spawn")
    ports = ctx.Queue()
    proc = ctx.Process(target=_dying_sender, args=(ports, fields))
    proc.start()
    link = Link(**{**fields, "port": ports.get(timeout=60)})
    with pytest.raises(WeightTransportError, match=r"version 5 \(group g9, rank 1\): the broadcast broke after "
                                                    r"the header and 1 of \d+ buckets.*nothing was installed"):
        Endpoint().receive(link, 1, target, 5, where="generator")
    proc.join(timeout=30)
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())


def test_nccl_on_roles_without_gpus_is_refused_naming_them():
    from types import SimpleNamespace

    from orchestrator.channels import Channel
    from orchestrator.config import WeightsConfig
    from orchestrator.roles import RoleError

    def pool(name, gpus):
        return SimpleNamespace(name=name, spec=SimpleNamespace(num_gpus=gpus),
                               transport=WeightsConfig(transport="collective", backend="nccl"))
    channel = Channel("policy", pool("policy_learner", 1), [pool("generator", 0)])
    with pytest.raises(RoleError, match=r"weights.backend=nccl needs a GPU .* roles \['generator'\] have num_gpus=0"):
        channel.backend()
    channel.settings = WeightsConfig(transport="collective", backend="auto")
    assert channel.backend() == "gloo"


def _dying_receiver(link: Link):
    """Joins as rank 2, takes the header, then dies without a word."""
    import os

    from actors.weight_transport import Receiver

    receiver = Receiver(link, 2)
    n = torch.zeros(1, dtype=torch.int64)
    receiver.pg.broadcast(n, 0).wait()
    receiver.pg.broadcast(torch.empty(int(n.item()), dtype=torch.uint8), 0).wait()
    os._exit(1)


def test_a_receiver_that_dies_mid_broadcast_fails_the_sender_not_at_the_timeout():
    source, survivor = Net(seed=1), Net(seed=2)
    sender = Endpoint()
    link = _link(sender.open("policy", "g1", "127.0.0.1", 60.0), 3, timeout_s=60.0)
    proc = mp.get_context("spawn").Process(target=_dying_receiver, args=(link,))
    proc.start()
    threads, errors = _receive_all(link, [survivor], version=6)  # rank 1
    with pytest.raises(WeightTransportError, match=r"version 6 \(group g1\): the broadcast broke after") as e:
        sender.send(link, source.state_dict(), 6)
    assert "Timed out" not in str(e.value)  # the dead peer's closed socket, not the 60 s timeout
    threads[0].join()
    proc.join(timeout=30)
    assert "policy" not in sender.senders  # the broken group was dropped; the next publish forms a new one


def test_a_replica_that_never_joins_costs_the_join_deadline_not_the_broadcast_timeout():
    """World of 3, rank 2 never comes (its replica died before joining): the sender and the replica
    that did join both fail within weights.join_timeout_s, naming the missing rank, and nothing is
    installed; without the join barrier both wait in gloo's rendezvous for the 60 s timeout."""
    import time

    from actors.weight_transport import JoinTimeout

    source, survivor = Net(seed=1), Net(seed=2)
    before = {k: v.clone() for k, v in survivor.state_dict().items()}
    sender = Endpoint()
    link = Link("policy", "g1", "127.0.0.1", sender.open("policy", "g1", "127.0.0.1", 60.0), 3, "gloo", 60.0, 1e-3,
                join_timeout_s=1.5)
    threads, errors = _receive_all(link, [survivor], version=3)  # rank 1 joins; rank 2 never does
    started = time.monotonic()
    with pytest.raises(JoinTimeout, match=r"rank\(s\) \[2\] of 3 did not join within weights.join_timeout_s=1.5s"):
        sender.send(link, source.state_dict(), 3)
    threads[0].join(timeout=30)
    assert time.monotonic() - started < 10
    assert isinstance(errors[0], JoinTimeout) and "[2]" in str(errors[0])
    assert all(torch.equal(v, before[k]) for k, v in survivor.state_dict().items())
