"""Weight updates between processes on one GPU through CUDA IPC handles (a learner and the generators
colocated with it), as verl, OpenRLHF, NeMo-RL, ROLL and SkyRL do when colocated: the learner
copies its weights once into one buffer on its GPU, cast to the receivers' dtype, and sends a
handle to it (bytes); a receiver on the same GPU maps that buffer and copies from it, GPU to GPU.
Nothing goes through host memory or the object store.

It is used only where both ends are on the same CUDA device of the same node (`identity` of each
matches), with one learner rank; everything else, and anything that fails here, takes the object
store (orchestrator.channels falls back replica by replica).

The buffer is a snapshot (the learner trains on while a replica copies), kept by the learner until
its next export; torch keeps a shared buffer alive while a receiver still holds it.
"""

from __future__ import annotations

import torch

ALIGN = 16  # byte offsets of tensors in the buffer, so every dtype can be viewed in place
_EXPORTED: list[torch.Tensor] = []  # the learner's latest buffer (one): a handle is only good while it lives


class WeightTransportError(RuntimeError):
    """CUDA IPC cannot carry this update (no GPU here, a GPU this process cannot see); the channel
    sends the object store's payload instead."""


def identity(actor) -> dict | None:
    """Run inside an actor (Ray's `__ray_call__`): `{"node", "gpu"}` of the CUDA device it computes
    on (the GPU's UUID: the same whatever CUDA_VISIBLE_DEVICES each process was given), or None
    on a CPU."""
    import ray

    from actors.runtime import device_of

    device = device_of(actor)
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    return {"node": ray.get_runtime_context().get_node_id(), "gpu": str(torch.cuda.get_device_properties(index).uuid)}


def colocated(learner: dict | None, replicas: dict) -> set:
    """The keys of `replicas` (key -> identity) on the learner's own GPU: the ones IPC can serve."""
    if learner is None:
        return set()
    return {key for key, where in replicas.items() if where is not None and where == learner}


def export(learner, dtype: str | None = None) -> dict:
    """Run inside a one-rank learner (`__ray_call__`): its weights as `{"version", "ipc"}`, floating-point
    tensors cast to `dtype` (the receivers' model.dtype; None: as they are), in one buffer on its GPU."""
    from torch.multiprocessing.reductions import reduce_tensor

    state = learner.full_state()
    version = int(learner.version)
    if not state:
        raise WeightTransportError("CUDA IPC: the learner has no weights to export")
    first = next(iter(state.values()))
    if first.device.type != "cuda":
        raise WeightTransportError(f"CUDA IPC needs the learner's weights on a GPU; they are on {first.device}")
    cast = getattr(torch, dtype) if dtype else None
    layout, offset = [], 0
    for name, t in state.items():
        kind = cast if cast is not None and t.is_floating_point() else t.dtype
        nbytes = t.numel() * torch.empty(0, dtype=kind).element_size()
        layout.append((name, kind, tuple(t.shape), offset))
        offset = -(-(offset + nbytes) // ALIGN) * ALIGN
    buffer = torch.empty(offset, dtype=torch.uint8, device=first.device)
    with torch.no_grad():
        for (name, kind, shape, start), t in zip(layout, state.values()):
            _view(buffer, kind, shape, start).copy_(t.detach())
    _EXPORTED[:] = [buffer]  # the previous one goes once its receivers let go of it
    torch.cuda.ipc_collect()
    gpu = str(torch.cuda.get_device_properties(first.device).uuid)
    return {"version": version, "ipc": {"handle": reduce_tensor(buffer), "layout": layout, "gpu": gpu}}


def _view(buffer: torch.Tensor, dtype: torch.dtype, shape: tuple, start: int) -> torch.Tensor:
    numel = 1
    for s in shape:
        numel *= s
    nbytes = numel * torch.empty(0, dtype=dtype).element_size()
    return buffer[start:start + nbytes].view(dtype).view(shape)


def tensors(ipc: dict) -> dict[str, torch.Tensor]:
    """Map an exported buffer in this process (on the GPU with the exporter's UUID) and return views
    of every tensor in it. The views keep the buffer mapped; drop them once copied."""
    rebuild, args = ipc["handle"]
    args = list(args)
    args[6] = local_index(ipc["gpu"])  # storage_device: this process's index of that GPU
    buffer = rebuild(*args)
    return {name: _view(buffer, dtype, shape, start) for name, dtype, shape, start in ipc["layout"]}


def local_index(uuid: str) -> int:
    """This process's CUDA index of the GPU with `uuid`."""
    if not torch.cuda.is_available():
        raise WeightTransportError("CUDA IPC: this process has no CUDA device")
    for i in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(i).uuid) == uuid:
            return i
    raise WeightTransportError(f"CUDA IPC: GPU {uuid} is not visible to this process")
