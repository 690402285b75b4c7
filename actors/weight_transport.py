"""Collective weight transport: the learner broadcasts a version to every replica of a channel's
target pools over its own process group (docs/weights.md).

The group is stateless in torch's sense: a `TCPStore` hosted by the sender (rank 0) and a
`ProcessGroupGloo`/`ProcessGroupNCCL` built directly on it, as vLLM's `StatelessProcessGroup` does,
so the default torch.distributed group stays free for the learner's own ranks. One group per
channel epoch; a new epoch (new store, new port) replaces it when the membership changes.

A version goes as a pickled header (version, layout: names, dtypes, shapes, byte offsets) and then
the tensors packed as raw bytes into buckets of `bucket_mb`. A receiver stages every bucket and
checks and installs only once all of them have arrived: a broken broadcast installs nothing.
"""

from __future__ import annotations

import datetime
import pickle
from dataclasses import dataclass

import torch

from actors.weights import WeightMismatchError, check_state

ALIGN = 16  # byte offsets of tensors in a bucket, so every dtype can be viewed in place


class WeightTransportError(RuntimeError):
    """A collective broadcast of weights broke (a peer died, the group timed out); nothing was installed."""


class JoinTimeout(WeightTransportError):
    """A new group did not form: a member did not arrive within `Link.join_timeout_s`."""


@dataclass(frozen=True)
class Link:
    """What every member needs to join one epoch of a channel's group."""
    channel: str
    group: str  # unique per epoch: the store prefix
    host: str
    port: int
    world_size: int
    backend: str = "gloo"
    timeout_s: float = 300.0  # one broadcast
    bucket_mb: float = 256.0
    join_timeout_s: float = 30.0  # every member arriving to form the group (a replica that never does)


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: torch.dtype
    shape: tuple
    bucket: int
    offset: int  # bytes into the bucket

    @property
    def nbytes(self) -> int:
        return _numel(self.shape) * torch.empty(0, dtype=self.dtype).element_size()


def _numel(shape: tuple) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def layout(state: dict[str, torch.Tensor], bucket_mb: float) -> tuple[list[Entry], list[int]]:
    """Tensors in state-dict order, packed into buckets of at most `bucket_mb` (a larger tensor gets
    a bucket of its own). Returns the entries and each bucket's size in bytes."""
    limit = max(1, int(bucket_mb * 2**20))
    entries, sizes, used = [], [], limit  # `used == limit`: the first tensor opens a bucket
    for name, t in state.items():
        nbytes = t.numel() * t.element_size()
        start = -(-used // ALIGN) * ALIGN
        if start + nbytes > limit and used > 0:
            sizes.append(0)
            start = 0
        entries.append(Entry(name, t.dtype, tuple(t.shape), len(sizes) - 1, start))
        used = start + nbytes
        sizes[-1] = used
    return entries, sizes


def host_store(link_host: str, timeout_s: float):
    """The sender's rendezvous store on a free port (port 0: the OS picks, no race for it)."""
    from torch.distributed import TCPStore

    return TCPStore(link_host, 0, None, is_master=True, wait_for_workers=False,
                    timeout=datetime.timedelta(seconds=timeout_s))


def _join(store, link: Link, rank: int) -> None:
    """Announce this member and wait for the others, at most `link.join_timeout_s`: a member that
    never arrives (its replica died before joining) fails the group at once for everyone, rather than
    at the broadcast's timeout inside the process group's own rendezvous."""
    import time

    keys = [f"joined/{r}" for r in range(link.world_size)]
    store.set(keys[rank], "1")
    deadline = time.monotonic() + link.join_timeout_s
    while True:
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        if not missing:
            return
        if time.monotonic() >= deadline:
            raise JoinTimeout(
                f"channel {link.channel!r}: weight group {link.group} not formed: rank(s) {missing} of "
                f"{link.world_size} did not join within weights.join_timeout_s={link.join_timeout_s:g}s")
        time.sleep(0.05)


def _group(link: Link, rank: int, store=None, bind: str | None = None):
    """This member's process group of `link`, through the sender's store (rank 0 passes its own),
    once every member has joined (`_join`)."""
    from torch.distributed import PrefixStore, TCPStore

    timeout = datetime.timedelta(seconds=link.timeout_s)
    if store is None:
        store = TCPStore(link.host, link.port, None, is_master=False,
                         timeout=datetime.timedelta(seconds=min(link.timeout_s, link.join_timeout_s)))
    prefixed = PrefixStore(link.group, store)
    _join(prefixed, link, rank)
    if link.backend == "nccl":
        from torch.distributed.distributed_c10d import ProcessGroupNCCL

        options = ProcessGroupNCCL.Options()
        options._timeout = timeout
        return store, ProcessGroupNCCL(prefixed, rank, link.world_size, options)
    from torch.distributed import ProcessGroupGloo

    options = ProcessGroupGloo._Options()
    options._timeout = timeout
    options._devices = [ProcessGroupGloo.create_device(hostname=bind or link.host)]
    return store, ProcessGroupGloo(prefixed, rank, link.world_size, options)


def _broadcast(pg, tensor: torch.Tensor) -> None:
    pg.broadcast(tensor, 0).wait()


class Sender:
    """Rank 0 of one epoch: hosts the store and broadcasts versions."""

    def __init__(self, link: Link, store, device: str = "cpu"):
        self.link, self.device = link, device
        self.store, self.pg = _group(link, 0, store=store, bind=link.host)
        self.buffer = torch.empty(0, dtype=torch.uint8, device=device)

    def send(self, state: dict[str, torch.Tensor], version: int) -> int:
        """Broadcast `state` as `version`; returns the bytes sent to each receiver."""
        done = "nothing"
        try:
            for step in self.steps(state, version):
                done = step
            return sum(layout(state, self.link.bucket_mb)[1])
        except RuntimeError as e:
            error = WeightTransportError(
                f"collective weights version {version} (group {self.link.group}): the broadcast broke after "
                f"{'bucket ' if isinstance(done, int) else ''}{done}: {str(e).splitlines()[0]}")
        _close(self)
        raise error

    def steps(self, state: dict[str, torch.Tensor], version: int):
        """The broadcast one message at a time (yields after the header and after each bucket)."""
        entries, sizes = layout(state, self.link.bucket_mb)
        header = pickle.dumps({"version": int(version), "group": self.link.group, "entries": entries,
                               "sizes": sizes})
        _broadcast(self.pg, torch.tensor([len(header)], dtype=torch.int64, device=self.device))
        _broadcast(self.pg, torch.frombuffer(bytearray(header), dtype=torch.uint8).to(self.device))
        yield "header"
        by_bucket: dict[int, list[Entry]] = {}
        for e in entries:
            by_bucket.setdefault(e.bucket, []).append(e)
        for b, size in enumerate(sizes):
            members = by_bucket.get(b, [])
            tensor = state[members[0].name].detach() if len(members) == 1 else None
            if tensor is not None and tensor.is_contiguous() and tensor.device.type == torch.device(self.device).type:
                buf = tensor.reshape(-1).view(torch.uint8)  # a tensor alone in its bucket goes as it is
            else:
                if self.buffer.numel() < size:  # one packing buffer, kept: each broadcast completes before the next
                    self.buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
                buf = self.buffer[:size]
                for e in members:
                    src = state[e.name].detach().contiguous().reshape(-1)
                    buf[e.offset:e.offset + e.nbytes].view(e.dtype).copy_(src)
            _broadcast(self.pg, buf)
            yield b


class Receiver:
    """One replica's membership of one epoch: stages a whole version, then installs it."""

    def __init__(self, link: Link, rank: int, device: str = "cpu", bind: str | None = None):
        self.link, self.rank, self.device = link, rank, device
        self.store, self.pg = _group(link, rank, bind=bind)
        self.staging: list[torch.Tensor] = []

    def receive(self, model: torch.nn.Module, version: int, where: str = "model") -> None:
        """Take one broadcast and install it in `model`, all or nothing."""
        header, views = self._stage(version)
        if header["version"] != version:
            raise WeightMismatchError(f"collective weight update for the {where} says version {header['version']} "
                                      f"but was sent as version {version} (group {self.link.group}); "
                                      "nothing was loaded")
        check_state(model, views, where)
        with torch.no_grad():
            model.load_state_dict(views, strict=True)

    def _stage(self, version: int) -> tuple[dict, dict[str, torch.Tensor]]:
        done = "no message"
        try:
            n = torch.zeros(1, dtype=torch.int64, device=self.device)
            _broadcast(self.pg, n)
            raw = torch.empty(int(n.item()), dtype=torch.uint8, device=self.device)
            _broadcast(self.pg, raw)
            header = pickle.loads(raw.cpu().numpy().tobytes())
            sizes = header["sizes"]
            if [t.numel() for t in self.staging] != sizes:  # reused while the layout stays the same
                self.staging = [torch.empty(s, dtype=torch.uint8, device=self.device) for s in sizes]
            done = f"the header and 0 of {len(sizes)} buckets"
            for b, buf in enumerate(self.staging):
                _broadcast(self.pg, buf)
                done = f"the header and {b + 1} of {len(sizes)} buckets"
            views = {e.name: self.staging[e.bucket][e.offset:e.offset + e.nbytes].view(e.dtype).view(e.shape)
                     for e in header["entries"]}
            return header, views
        except RuntimeError as e:
            error = WeightTransportError(
                f"collective weights version {version} (group {self.link.group}, rank {self.rank}): the broadcast "
                f"broke after {done}: {str(e).splitlines()[0]}; nothing was installed")
        _close(self)
        raise error


def _close(member) -> None:
    """Drop a broken group at once: its destructor closes the sockets, so every peer still waiting in
    the broadcast fails now instead of at the timeout (abort() and shutdown() leave them open)."""
    import gc

    member.pg = None
    member.staging = member.buffer = None
    gc.collect()


class Endpoint:
    """The per-actor side: the current epoch's sender or receiver of each channel (a new epoch drops
    the old group, so a learner and its replicas hold one group per channel)."""

    def __init__(self):
        self.senders: dict[str, Sender] = {}
        self.stores: dict[str, tuple[str, object]] = {}  # channel -> (group, its store)
        self.receivers: dict[str, Receiver] = {}

    def open(self, channel: str, group: str, host: str, timeout_s: float) -> int:
        """Host the store of a new epoch (`group`) of `channel`; returns its port."""
        self.senders.pop(channel, None)
        store = host_store(host, timeout_s)
        self.stores[channel] = (group, store)
        return store.port

    def send(self, link: Link, state: dict[str, torch.Tensor], version: int, device: str = "cpu") -> int:
        sender = self.senders.get(link.channel)
        if sender is None or sender.link.group != link.group:
            group, store = self.stores.get(link.channel, (None, None))
            if group != link.group:
                raise WeightTransportError(f"channel {link.channel!r}: weight group {link.group} is not open on this "
                                           f"sender (its newest is {group}); a new epoch is needed")
            sender = self.senders[link.channel] = _formed(lambda: Sender(link, store, device), link, 0)
        try:
            return sender.send(state, version)
        except WeightTransportError:
            self.senders.pop(link.channel, None)  # closed; a new epoch forms the next group
            raise

    def receive(self, link: Link, rank: int, model: torch.nn.Module, version: int, where: str,
                device: str = "cpu", bind: str | None = None, join: bool = True) -> None:
        """`join`: the group is new and this member forms it with the others; otherwise it must
        already be a member (a process restarted since the group formed is not, and says so at
        once rather than waiting for a rendezvous nobody else is in)."""
        receiver = self.receivers.get(link.channel)
        if receiver is None or receiver.link.group != link.group:
            if not join:
                raise WeightTransportError(f"channel {link.channel!r}: rank {rank} is not a member of weight group "
                                           f"{link.group} (restarted since it formed?); a new epoch is needed")
            self.receivers.pop(link.channel, None)
            receiver = self.receivers[link.channel] = _formed(lambda: Receiver(link, rank, device, bind), link, rank)
        try:
            receiver.receive(model, version, where)
        except WeightTransportError:
            self.receivers.pop(link.channel, None)  # closed; a new epoch forms the next group
            raise


def _formed(make, link: Link, rank: int):
    """A member of a new group, or a clear error when the others do not all arrive in time."""
    try:
        return make()
    except WeightTransportError:
        raise
    except RuntimeError as e:
        raise WeightTransportError(
            f"channel {link.channel!r}: rank {rank} could not form weight group {link.group} "
            f"({link.world_size} members, {link.backend}, rendezvous {link.host}:{link.port}, "
            f"timeout {link.timeout_s:g}s): {str(e).splitlines()[0]}") from None


def node_ip() -> str:
    """This process's address for the group: Ray's node address inside a Ray worker, else loopback."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001  (outside Ray: a plain process in a test)
        pass
    return "127.0.0.1"
