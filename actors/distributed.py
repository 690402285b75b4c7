"""A learner's place in its role's `torch.distributed` group: N Ray actors, one rank each.

Every rank is sent the whole batch (one object-store copy on the node) and computes the same
advantages, normalisers and mini-batch order from it; each then runs forward/backward on its own
share of the rows, cut by whole prompt groups (a group's rows share one prompt forward). Losses are
divided by the update's global token count and multiplied by the world size, so the averaged
gradient equals one rank's gradient on the whole batch (docs/learners.md).

Strategies:
- `ddp`: every rank holds the whole model; gradients are all-reduced once per optimizer update, in
  buckets, before clipping. (torch's DistributedDataParallel wrapper syncs inside every backward and
  refuses a second forward before it, which coevo's shared-prompt forward does on every micro-batch.)
- `fsdp2`: `torch.distributed.fsdp.fully_shard` on every decoder layer and the root; parameters,
  gradients and optimizer state are sharded. Every forward is a collective, so ranks run the same
  number of micro-batches: a rank with fewer runs a zero-weight one ("ghost").

World size 1 does none of this: no process group, every method a no-op.
"""

from __future__ import annotations

import datetime
import logging
import socket

import torch
import torch.distributed as dist

log = logging.getLogger("coevo.learner")
BUCKET_BYTES = 32 * 2**20  # gradient all-reduce bucket (ddp)
STRATEGIES = ("ddp", "fsdp2")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def node_address() -> str:
    import ray

    return ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"


class Ranks:
    """This process's rank; with world size 1 every method is a no-op."""

    def __init__(self, rank: int = 0, world_size: int = 1, strategy: str = "ddp"):
        if strategy not in STRATEGIES:
            raise ValueError(f"learner.strategy {strategy!r} is not one of {list(STRATEGIES)}")
        self.rank, self.world_size, self.strategy = rank, world_size, strategy
        self.group = None

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def sharded(self) -> bool:
        """Parameters are DTensor shards (fsdp2): forwards and norms are collectives."""
        return self.distributed and self.strategy == "fsdp2"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ---- the group ---------------------------------------------------------------------------------
    def init(self, address: str, port: int, backend: str, timeout_s: float) -> None:
        dist.init_process_group(backend, init_method=f"tcp://{address}:{port}", rank=self.rank,
                                world_size=self.world_size, timeout=datetime.timedelta(seconds=timeout_s))
        self.group = dist.group.WORLD

    def close(self) -> None:
        if self.group is not None and dist.is_initialized():
            dist.destroy_process_group()
            self.group = None

    def wrap(self, model: torch.nn.Module, device: str, mixed_precision: str | None = None,
             cpu_offload: bool = False) -> torch.nn.Module:
        """fsdp2: shard every block HF lists as unsplittable (the decoder layers), then the root."""
        if not self.sharded:
            return model
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh("cuda" if device.startswith("cuda") else "cpu", (self.world_size,))
        kwargs = {"mesh": mesh}
        if mixed_precision:
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[mixed_precision]
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        if cpu_offload:
            kwargs["offload_policy"] = CPUOffloadPolicy()
        blocks = set(getattr(model, "_no_split_modules", None) or [])
        for module in model.modules():
            if type(module).__name__ in blocks:
                fully_shard(module, **kwargs)
        fully_shard(model, **kwargs)
        return model

    # ---- splitting the work ------------------------------------------------------------------------
    def shard(self, rows: torch.Tensor, groups: torch.Tensor, cost: torch.Tensor) -> torch.Tensor:
        """This rank's share of `rows`: whole groups (by `groups[rows]`), balanced by `cost` (tokens)
        with the longest-first greedy rule. Every rank computes the same assignment."""
        if not self.distributed or len(rows) == 0:
            return rows
        keys, inverse = torch.unique(groups[rows], return_inverse=True)
        load = torch.zeros(len(keys), dtype=torch.float64).index_add_(0, inverse, cost[rows].double())
        owner = torch.empty(len(keys), dtype=torch.long)
        totals = [0.0] * self.world_size
        for g in sorted(range(len(keys)), key=lambda g: (-float(load[g]), g)):
            r = min(range(self.world_size), key=lambda r: (totals[r], r))
            owner[g] = r
            totals[r] += float(load[g])
        return rows[owner[inverse] == self.rank]

    def split(self, n: int) -> torch.Tensor:
        """This rank's share of `n` independent items (pairs: no groups): every world_size-th one."""
        return torch.arange(self.rank, n, self.world_size) if self.distributed else torch.arange(n)

    def micro_batches(self, rows: torch.Tensor | list[torch.Tensor], size: int | None,
                      pool: torch.Tensor) -> list[tuple[torch.Tensor, bool]]:
        """`rows` in micro-batches of `size` (or `rows` already cut into micro-batches, with `size`
        None: actors.packing), as (indices, real). Under fsdp2 every rank runs as many as the rank
        with the most; the extra ones are one row of `pool` (the update's rows), run with weight 0 so
        the collectives line up."""
        if size is None:
            parts = [(mb, True) for mb in rows]
        else:
            parts = [(mb, True) for mb in (rows.split(size) if len(rows) else ())]
        if self.sharded:
            most = int(self.max(len(parts)))
            parts += [(pool[:1], False)] * (most - len(parts))
        return parts

    # ---- reductions --------------------------------------------------------------------------------
    def _reduce(self, values: list[float], op) -> list[float]:
        if not self.distributed:
            return values
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=op)
        return t.tolist()

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        """Sums over ranks of per-rank sums (metrics), in one collective."""
        keys = sorted(values)
        return dict(zip(keys, self._reduce([float(values[k]) for k in keys], dist.ReduceOp.SUM)))

    def max(self, value: float) -> float:
        return self._reduce([float(value)], dist.ReduceOp.MAX)[0]

    def all(self, flag: bool) -> bool:
        return self._reduce([0.0 if flag else 1.0], dist.ReduceOp.MAX)[0] == 0.0

    # ---- gradients ---------------------------------------------------------------------------------
    def clip_grads(self, params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
        """Average the gradients over ranks (fsdp2 did it for the sharded ones during backward),
        then clip by the global norm. Returns the norm before clipping (a plain tensor)."""
        if not self.distributed:
            return torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], max_norm, foreach=True)
        for p in params:  # a rank that computed nothing still takes part, with zeros, in the same shapes
            if p.grad is None and p.requires_grad:
                p.grad = torch.zeros_like(p)
        grads = [p for p in params if p.grad is not None]
        from torch.distributed.tensor import DTensor

        sharded = [p for p in grads if isinstance(p.grad, DTensor)]
        plain = [p for p in grads if not isinstance(p.grad, DTensor)]
        self._average([p.grad for p in plain])
        norms = []
        if sharded:
            norm = torch.nn.utils.get_total_norm([p.grad for p in sharded], foreach=True)
            norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        if plain:
            norms.append(torch.nn.utils.get_total_norm([p.grad for p in plain], foreach=True))
        total = torch.linalg.vector_norm(torch.stack([n.float().cpu() for n in norms])) if norms else torch.tensor(0.0)
        for params in (sharded, plain):  # takes the parameters, and scales their .grad
            if params:
                torch.nn.utils.clip_grads_with_norm_(params, max_norm, total.to(params[0].grad.device), foreach=True)
        return total

    def _average(self, grads: list[torch.Tensor]) -> None:
        """All-reduce in flat buckets (one collective per ~32 MB, not per tensor), then / world."""
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        bucket, size = [], 0
        for g in grads + [None]:
            if g is not None:
                bucket.append(g)
                size += g.numel() * g.element_size()
                if size < BUCKET_BYTES:
                    continue
            if bucket:
                flat = _flatten_dense_tensors(bucket)
                dist.all_reduce(flat)
                flat /= self.world_size
                for g_, new in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                    g_.copy_(new)
            bucket, size = [], 0

    def broadcast_parameters(self, module: torch.nn.Module) -> None:
        """ddp: every rank starts from rank 0's weights (as DistributedDataParallel does)."""
        if self.distributed and not self.sharded:
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, 0)

    # ---- whole models ------------------------------------------------------------------------------
    def full_state(self, model: torch.nn.Module, everywhere: bool = False) -> dict[str, torch.Tensor]:
        """The unsharded state dict (fsdp2 gathers it): on rank 0 only, or on every rank."""
        if not self.sharded:
            return model.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                     cpu_offload=not everywhere))

    def load_full_state(self, model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
        """Load an unsharded state dict (present on every rank) into a (possibly sharded) model."""
        if not self.sharded:
            model.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()
