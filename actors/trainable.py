"""What every learner shares: a model and its optimizer, its own version counter, publishing
versioned weights, tokenised sequences, its rank in the role's group (actors.distributed), and
checkpoints (HF `save_pretrained` gathered on rank 0, plus the optimizer through
`torch.distributed.checkpoint`, resumable at another world size, plus the learner's state).

A learner counts its own versions (one per optimizer update round); the orchestrator reads them from
what the learner returns, so two learners in one run never share a counter.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import pyarrow as pa
import torch

from actors import batch as B
from actors.modeling import cache_kwargs, innermost, output_cache
from actors.weight_transport import Endpoint, JoinTimeout, Link, WeightTransportError, node_ip
from actors.weights import export_state

STATE_FILE = "learner_state.pt"
OPTIMIZER_FILE = "optimizer.pt"  # checkpoints before sharded ones (still restored)
SHARDED_DIR = "sharded"  # torch.distributed.checkpoint: the optimizer, loadable at any world size


def adamw(params, lr: float, weight_decay: float = 0.01) -> torch.optim.Optimizer:
    """AdamW with the fused kernel where the parameters' device supports it: one pass over all
    parameters (the default tiny model on CPU: 0.8 ms a step against 3.5 ms for the loop)."""
    params = list(params)
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def rebuilt(optimizer: torch.optim.Optimizer, params) -> torch.optim.Optimizer:
    """The same optimizer, with its settings, over new parameter objects (after sharding)."""
    import inspect

    accepted = inspect.signature(type(optimizer)).parameters
    return type(optimizer)(list(params), **{k: v for k, v in optimizer.defaults.items() if k in accepted})


@contextlib.contextmanager
def _one_process_quietly():
    """torch.distributed.checkpoint warns on every single-process save and load (one rank is the
    usual case here, and a run's log should not repeat it at every checkpoint)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


class Trainable:
    """Base of the learner actors. Subclasses set `self.model`, `self.tokenizer`, `self.optimizer`."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    reference: torch.nn.Module | None = None  # a frozen model some learners compare against

    def _setup(self, config, role: dict | None, seed_offset: int = 0) -> None:
        import transformers

        from actors.distributed import Ranks
        from actors.runtime import setup_torch

        transformers.utils.logging.disable_progress_bar()  # no "Loading weights" bars in logs
        role = role or {}
        self.config = config
        self.device = setup_torch(role.get("threads", 0) or config.train.threads, config.seed + seed_offset,
                                  want_gpu=role.get("num_gpus", 0) > 0)
        # a learner that shares its GPU with other processes (a fraction of one) hands its cached
        # memory back after each step, so a colocated generator can use it while the learner idles
        share = role.get("num_gpus", 0)
        self.shares_gpu = isinstance(share, (int, float)) and 0 < share < 1
        self.alone_threads = role["alone_threads"] if "alone_threads" in role else \
            (role.get("threads", 0) or config.train.threads)
        self.version = 0
        self.ranks = Ranks(role.get("rank", 0), role.get("world_size", 1), config.learner.strategy)
        self.weights_endpoint = Endpoint()  # the sending end of its channels' collective weight groups

    def ping(self) -> int:
        return self.version

    # ---- the role's process group (actors.distributed) ----------------------------------------------
    def rendezvous(self) -> tuple[str, int]:
        """Rank 0's address and a free port for the group's TCP rendezvous."""
        from actors.distributed import free_port, node_address
        return node_address(), free_port()

    def init_distributed(self, address: str, port: int) -> str:
        """Join the group, shard or replicate the model, and rebuild the optimizer over it. Returns
        the backend."""
        import logging

        cfg = self.config.learner
        backend = cfg.backend if cfg.backend != "auto" else ("nccl" if self.device.startswith("cuda") else "gloo")
        self.ranks.init(address, port, backend, cfg.timeout_s)
        on_gpu = self.device.startswith("cuda")
        if self.ranks.is_main and not on_gpu and cfg.cpu_offload:
            logging.getLogger("coevo").warning("learner.cpu_offload applies to fsdp2 on GPU; this learner is on CPU")
        # fsdp2 on a GPU computes in the compute dtype (MixedPrecisionPolicy, fp32 gradient reduction)
        low = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(getattr(self, "compute_dtype", torch.float32))
        wrap = dict(device=self.device, mixed_precision=low if on_gpu else None, cpu_offload=cfg.cpu_offload and on_gpu)
        if self.ranks.sharded:
            import copy
            # a sharded holder for references frozen later (deep copies of a sharded model are not safe)
            self._reference_shell = self.ranks.wrap(copy.deepcopy(self.model).eval().requires_grad_(False), **wrap)
        self.ranks.broadcast_parameters(self.model)
        self.model = self.ranks.wrap(self.model, **wrap)
        if self.reference is not None:
            self.reference = self.ranks.wrap(self.reference, **wrap)
        self.optimizer = rebuilt(self.optimizer, self.trained_parameters())
        return backend

    def trained_parameters(self) -> list[torch.nn.Parameter]:
        return list(self.model.parameters())

    def clip_grads(self, max_norm: float) -> torch.Tensor:
        """Average gradients over the ranks, then clip every trained parameter by the global norm
        (one batched foreach pass)."""
        return self.ranks.clip_grads(self.trained_parameters(), max_norm)

    def frozen_dtype(self) -> torch.dtype:
        """The dtype of the frozen copies this learner keeps (its reference): model.dtype, bfloat16 on a
        GPU by default; float32 under fsdp2, where the reference is sharded like the model."""
        from actors.modeling import inference_dtype
        return torch.float32 if self.ranks.sharded else inference_dtype(self.config.model.dtype, self.device)

    def frozen_copy(self) -> torch.nn.Module:
        """The current weights as a frozen model (a reference, in `frozen_dtype`), sharded like the model."""
        import copy
        if not self.ranks.sharded:
            return copy.deepcopy(self.model).eval().requires_grad_(False).to(self.frozen_dtype())
        self.ranks.load_full_state(self._reference_shell, self.ranks.full_state(self.model, everywhere=True))
        return self._reference_shell

    def full_state(self) -> dict[str, torch.Tensor]:
        """The model's whole state dict (gathered from the shards; on rank 0 only, under fsdp2)."""
        return self.ranks.full_state(self.model)

    # ---- weights ---------------------------------------------------------------------------------
    def publish(self) -> dict | None:
        """`{"version", "state"}`: the object store holds it once, every replica maps it zero-copy.
        Every rank takes part (a sharded model is gathered); rank 0 returns it, the others None."""
        state = self.full_state()
        return export_state(state, self.version) if self.ranks.is_main else None

    def publish_parts(self) -> tuple[dict | None, dict]:
        """`publish` as (payload, info), so a pool call hands on the payload's ref unfetched."""
        return self.publish(), {"version": self.version}

    def open_weights(self, channel: str, group: str, timeout_s: float) -> tuple[str, int]:
        """Host the rendezvous store of a new epoch (`group`) of `channel`'s weight group: `(host, port)`."""
        host = node_ip()
        return host, self.weights_endpoint.open(channel, group, host, timeout_s)

    def send_weights(self, link: Link, version: int) -> dict:
        """Broadcast this learner's weights as `version` to the group of `link`. Every rank calls it
        (a sharded model is gathered by `full_state()`); rank 0 sends. Returns `{"bytes"}` sent to each
        receiver, or `{"error"}` when the broadcast broke: a transport failure is the channel's to
        handle (a raise would take a rank group down)."""
        if version != self.version:
            raise ValueError(f"send_weights: asked to send version {version}, but the learner is at {self.version}")
        state = self.full_state()
        if not self.ranks.is_main:
            return {"bytes": 0}
        try:
            return {"bytes": self.weights_endpoint.send(link, state, version, device=str(self.device))}
        except WeightTransportError as e:
            return {"error": str(e), "not_joined": isinstance(e, JoinTimeout)}

    # ---- checkpoints -----------------------------------------------------------------------------
    def extra_state(self) -> dict:
        """Learner-specific state to checkpoint (aggregator statistics, ...)."""
        return {}

    def load_extra_state(self, state: dict) -> None:
        pass

    def save(self, path: str, optimizer: bool = True) -> str:
        """The HF export (gathered, written by rank 0); with `optimizer`, also the optimizer sharded by
        every rank (torch.distributed.checkpoint) and the learner's state."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        self.save_model(self.model, out)
        if optimizer:
            import torch.distributed.checkpoint as dcp

            with _one_process_quietly():
                dcp.save(self._sharded_state(), checkpoint_id=str(out / SHARDED_DIR), no_dist=not self.ranks.distributed)
            if self.ranks.is_main:
                torch.save({"version": self.version, "world_size": self.ranks.world_size,
                            "extra": self.extra_state()}, out / STATE_FILE)
        self.ranks.barrier()
        return str(out)

    def save_model(self, model: torch.nn.Module, out: Path, tokenizer: bool = True) -> None:
        """`save_pretrained` of the whole (gathered) model on rank 0: plain transformers loads it."""
        state = self.ranks.full_state(model)
        if self.ranks.is_main:
            model.save_pretrained(out, state_dict=state)
            if tokenizer:
                self.tokenizer.save_pretrained(out)
            from actors.modeling import umask_modes
            umask_modes(out)

    def _trained_module(self) -> torch.nn.Module:
        """The module that owns every parameter the optimizer holds: the model, or the model plus the
        objectives' own parameters (a value head) when there are any (checkpoint keys need owners)."""
        own = {id(p) for p in self.model.parameters()}
        extra = [p for p in self.trained_parameters() if id(p) not in own]
        if not extra:
            return self.model
        holder = torch.nn.Module()
        holder.model = self.model
        holder.extra = torch.nn.ParameterList(extra)
        return holder

    def _sharded_state(self) -> dict:
        """The optimizer's state keyed by parameter names (so any world size can load it). The model's
        weights are not repeated: the HF export beside it holds them, and a learner is built from it."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return {"optimizer": get_optimizer_state_dict(self._trained_module(), self.optimizer)}

    def restore(self, path: str) -> int:
        """Optimizer, version and extra state of a checkpoint whose model this learner was built from
        (saved at any world size)."""
        path = Path(path)
        if (path / SHARDED_DIR).is_dir():
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

            state = self._sharded_state()
            with _one_process_quietly():
                dcp.load(state, checkpoint_id=str(path / SHARDED_DIR), no_dist=not self.ranks.distributed)
            set_optimizer_state_dict(self._trained_module(), self.optimizer, state["optimizer"])
        else:  # a checkpoint from before sharded checkpoints (one rank)
            self.optimizer.load_state_dict(torch.load(path / OPTIMIZER_FILE, weights_only=True))
        state = torch.load(path / STATE_FILE, weights_only=False)
        self.version = int(state["version"])
        self.load_extra_state(state.get("extra", {}))
        return self.version

    def save_reference(self, path: str) -> str | None:
        """The frozen reference, saved once per run, so a resumed run keeps the original one."""
        if self.reference is None:
            return None
        self.save_model(self.reference, Path(path), tokenizer=False)
        return path

    def load_reference(self, path: str) -> None:
        from actors import modeling
        reference = modeling.load_model(path, attn=self.config.model.attn_implementation)
        reference = reference.to(self.device, self.frozen_dtype()).eval().requires_grad_(False)
        if self.ranks.sharded:
            self.ranks.load_full_state(self._reference_shell, reference.state_dict())
            reference = self._reference_shell
        self.reference = reference

    # ---- tensors ---------------------------------------------------------------------------------
    def _sequences(self, table: pa.Table, prompt_col: str = "prompt_ids", response_col: str = "response_ids"):
        """Left-padded prompts + right-padded responses -> ids, mask, positions, response slice."""
        pad = self.tokenizer.pad_token_id
        p_ids, p_len = B.to_padded(table.column(prompt_col), pad, torch.long, left=True)
        r_ids, r_len = B.to_padded(table.column(response_col), pad, torch.long)
        p_width, r_width = p_ids.shape[1], r_ids.shape[1]
        p_mask = torch.arange(p_width)[None, :] >= (p_width - p_len)[:, None]
        r_mask = torch.arange(r_width)[None, :] < r_len[:, None]
        ids = torch.cat([p_ids, r_ids], dim=1)
        mask = torch.cat([p_mask, r_mask], dim=1).long()
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # same positions as left-padded generation
        return ids, mask, positions, r_ids, r_mask, p_width

    def _response_logits(self, model, ids, mask, positions, p_width, groups=None, after: bool = False):
        """The logits that predict each response token. With `groups` (rows of a group share their
        prompt: one sampling of one prompt), each distinct prompt is run once and its key/value cache
        is shared by the group's responses: for GRPO's n samples per prompt that removes most of the
        prompt compute, forward and backward (gradients flow back through the shared cache).
        `after`: also return the logits that follow each response's last token (LaSeR), as a pair."""
        with self.compute():
            return self._response_logits_fp(model, ids, mask, positions, p_width, groups, after)

    def _response_logits_fp(self, model, ids, mask, positions, p_width, groups=None, after: bool = False):
        dev = self.device
        inner = innermost(model)  # under a DDP-style wrapper or peft's
        flag = "is_activation_checkpointing" if hasattr(type(inner), "is_activation_checkpointing") \
            else "is_gradient_checkpointing"
        if model.training and getattr(inner, flag, False):
            groups = None  # checkpointed layers keep no KV cache to share (transformers turns it off)
        last = mask[:, p_width:].sum(1) - 1  # each response's last token, within the response
        end = ids.shape[1] if after else -1  # with `after`, the last response token is fed in too
        if groups is None or len(groups) == 0:
            logits = model(input_ids=ids[:, :end].to(dev), attention_mask=mask[:, :end].to(dev),
                           position_ids=positions[:, :end].to(dev)).logits
            response = logits[:, p_width - 1:]
        else:
            _, inverse = torch.unique(groups, return_inverse=True)
            first = torch.full((int(inverse.max()) + 1,), len(groups), dtype=torch.long).scatter_reduce(
                0, inverse, torch.arange(len(groups)), "amin")
            prompt = model(input_ids=ids[first, :p_width].to(dev), attention_mask=mask[first, :p_width].to(dev),
                           position_ids=positions[first, :p_width].to(dev), use_cache=True)
            response = prompt.logits[:, -1:][inverse.to(dev)]  # predicts each response's first token
            if ids[:, p_width:end].shape[1] > 0:
                cache = output_cache(prompt)
                cache.batch_select_indices(inverse.to(dev))
                rest = model(input_ids=ids[:, p_width:end].to(dev), attention_mask=mask[:, :end].to(dev),
                             position_ids=positions[:, p_width:end].to(dev), **cache_kwargs(model, cache)).logits
                response = torch.cat([response, rest], dim=1)
        if not after:
            return response[:, :ids.shape[1] - p_width]
        tail = response[torch.arange(len(ids), device=dev), (last + 1).to(dev)]
        return response[:, :ids.shape[1] - p_width], tail

    # ---- the compute engine: precision, packing (docs/learner.md) ------------------------------------
    def _engine_setup(self) -> None:
        """Resolve `learner.precision` and `learner.packing` for this device, and turn on activation
        checkpointing where asked. Call once the model is on its device."""
        from actors.engine import resolve_packing, resolve_precision

        cfg = self.config.learner
        self.compute_dtype = resolve_precision(cfg.precision, self.device)
        self.packing = resolve_packing(cfg.packing, self.device, self.compute_dtype)
        if cfg.gradient_checkpointing:  # transformers >= 5.20 renamed it activation checkpointing
            if hasattr(self.model, "activation_checkpointing_enable"):
                self.model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    def compute(self):
        """The context of every forward pass: autocast to the compute dtype (fp32 master weights, fp32
        optimizer state), or nothing in fp32."""
        dtype = getattr(self, "compute_dtype", torch.float32)
        if dtype == torch.float32:
            return contextlib.nullcontext()
        # no cast cache: with activation checkpointing a recomputed layer would find its weights'
        # casts cached and save fewer tensors than its first forward did (torch's CheckpointError)
        return torch.autocast(torch.device(self.device).type, dtype=dtype, cache_enabled=False)

    def release_cached_memory(self) -> None:
        """After a step, where the GPU is shared: return the allocator's cached blocks to the GPU."""
        if self.shares_gpu and str(self.device).startswith("cuda"):
            torch.cuda.empty_cache()

    def reset_peak_memory(self) -> None:
        if str(self.device).startswith("cuda"):
            torch.cuda.reset_peak_memory_stats(self.device)

    def perf_metrics(self, tokens: float, sum_sq: float, seconds: float) -> dict[str, float]:
        """Speed of a step that trained on `tokens` tokens (all ranks) in sequences whose squared
        lengths sum to `sum_sq`, in `seconds`: tokens/s, achieved TFLOP/s, MFU where the device's peak
        is known, peak GPU memory (docs/learner.md#speed-metrics)."""
        from actors.engine import model_shape, peak_flops, train_flops

        if not hasattr(self, "_shape"):
            self._shape = model_shape(self.model)
        seconds = max(seconds, 1e-9)
        flops = train_flops(self._shape, tokens, sum_sq) / seconds
        out = {"perf/learner_tokens_per_s": tokens / seconds, "perf/learner_tflops": flops / 1e12}
        peak = peak_flops(self.device, getattr(self, "compute_dtype", torch.float32), self.config.learner.peak_tflops)
        if peak:
            out["perf/mfu"] = flops / (peak * self.ranks.world_size)
        if str(self.device).startswith("cuda"):
            out["perf/peak_memory_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        return out

    def plan_micro_batches(self, rows: torch.Tensor, d: dict) -> list[torch.Tensor]:
        """`rows` of the step's tensors `d` cut into micro-batches (actors.packing): by real tokens,
        longest first, where rows are packed; in order, by padded tokens, where they are padded."""
        from actors.packing import packed_micro_batches, padded_micro_batches

        algo = self.config.algorithm
        r_len = d["r_mask"].sum(1)
        if getattr(self, "packing", False):
            p_len = d["mask"][:, :d["p_width"]].sum(1)
            return packed_micro_batches(rows, p_len + r_len, algo.micro_batch_tokens, algo.micro_batch_size)
        return padded_micro_batches(rows, r_len, d["p_width"], algo.micro_batch_tokens, algo.micro_batch_size)

    def _packed_stats(self, model, d: dict, mb: torch.Tensor, entropy: bool = False, tail: bool = False,
                      sampling: dict | None = None) -> dict:
        """One padding-free forward of rows `mb` of the step's tensors `d` (actors.packing): their
        response tokens' log-probs [n, R] under the sampling distribution, with `entropy` its entropy
        [n, R], with `tail` the logits after each row's last token [n, V]; `tokens` and `sq` (the
        sum of squared row lengths) for the step's FLOP count."""
        from actors import attention
        from actors.packing import pack
        from actors.token_head import TokenHead, installed

        p = pack(d["ids"][mb], d["mask"][mb], d["r_mask"][mb], d["r_ids"][mb], d["p_width"]).to(self.device)
        inner = getattr(model, "module", model)
        head = TokenHead(inner.get_output_embeddings(), p.at, p.targets, p.tail if tail else None,
                         entropy=entropy, **(self.sampling if sampling is None else sampling))
        with attention.packed(model), installed(model, head), self.compute():
            model(input_ids=p.input_ids, position_ids=p.position_ids, use_cache=False, cu_seq_lens_q=p.cu_seqlens,
                  cu_seq_lens_k=p.cu_seqlens, max_length_q=p.max_len, max_length_k=p.max_len)
        out = {"logp": p.unpack(head.logp), "tokens": p.tokens, "sq": float((p.seq_lengths.double() ** 2).sum())}
        if entropy:
            out["entropy"] = p.unpack(head.entropy)
        if tail:
            out["tail"] = head.tail
        return out

    def _token_logprobs(self, model, ids, mask, positions, r_ids, p_width, temperature: float = 1.0,
                        top_k: int = 0, top_p: float = 1.0, groups=None) -> torch.Tensor:
        from actors.sampling import token_logprobs

        logits = self._response_logits(model, ids, mask, positions, p_width, groups)
        return token_logprobs(logits, r_ids.to(self.device), temperature, top_k, top_p)

    @property
    def answer_end_id(self) -> int:
        """The token a supervised answer ends with: the chat template's end-of-turn token where one is
        in force (what generation stops at), else eos (actors.chat)."""
        if getattr(self, "_answer_end", None) is None:
            from actors.chat import answer_end_id
            self._answer_end = answer_end_id(self.tokenizer)
        return self._answer_end

    def _tokenize(self, texts: list[str], eos: bool = False) -> pa.Array:
        ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        if eos:
            ids = [i + [self.answer_end_id] for i in ids]
        return pa.array(ids, pa.list_(pa.int32()))
