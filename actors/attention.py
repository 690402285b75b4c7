"""Attention over packed sequences (actors.packing): one transformers attention function,
`coevo_packed`, registered with transformers' AttentionInterface, that keeps each packed row's
tokens attending only to the earlier tokens of the same row.

Kernels, in order of preference:
- on a CUDA device in bf16/fp16: PyTorch's variable-length flash attention
  (`torch.nn.attention.varlen.varlen_attn`, torch >= 2.10; its signature changed between releases and
  is read once), else flash-attn's `flash_attn_varlen_func` where that package is installed;
- otherwise (CPU, fp32): scaled-dot-product attention with a block-diagonal causal mask, exact and
  O(T^2) in memory, meant for CPU runs and tests of the packed path.

The row boundaries travel as transformers' own flash-attention keywords (`cu_seq_lens_q`,
`max_length_q`), which every decoder layer passes down to its attention function.
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import torch

NAME = "coevo_packed"


@functools.lru_cache(maxsize=None)
def _varlen():
    """(function, its keyword style) of a varlen flash kernel, or None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        varlen_attn = None
    if varlen_attn is not None:
        params = inspect.signature(varlen_attn).parameters
        return varlen_attn, ("window" if "window_size" in params else "is_causal"), "enable_gqa" in params
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func, "flash_attn", True


def kernel(device: torch.device | str, dtype: torch.dtype) -> str:
    """Which kernel packed attention uses for tensors on `device` in `dtype`: 'varlen' or 'sdpa_mask'."""
    on_gpu = torch.device(device).type == "cuda"
    return "varlen" if on_gpu and dtype in (torch.bfloat16, torch.float16) and _varlen() is not None else "sdpa_mask"


def packed_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                     sliding_window=None, cu_seq_lens_q=None, max_length_q=None, **kwargs):
    """transformers' attention signature: query [1, H, T, D], key/value [1, Hkv, T, D] -> ([1, T, H, D], None)."""
    if cu_seq_lens_q is None:
        raise RuntimeError(f"attention {NAME!r} needs cu_seq_lens_q (a packed forward from actors.packing)")
    if sliding_window:
        raise ValueError(f"attention {NAME!r} does not support sliding-window layers; set learner.packing=off")
    groups = query.shape[1] // key.shape[1]
    dtype = query.dtype
    if torch.is_autocast_enabled(query.device.type):  # rotary embeddings leave q, k in fp32 under autocast
        dtype = torch.get_autocast_dtype(query.device.type)
    q, k, v = (t[0].transpose(0, 1).to(dtype).contiguous() for t in (query, key, value))  # [T, H, D]
    if kernel(q.device, dtype) == "varlen":
        out = _flash(q, k, v, cu_seq_lens_q.to(q.device, torch.int32), int(max_length_q), scaling, groups)
    else:
        out = _masked(q, k, v, cu_seq_lens_q.to(q.device), scaling, groups)
    return out[None], None


def _flash(q, k, v, cu, max_len: int, scale, groups: int) -> torch.Tensor:
    fn, style, gqa = _varlen()
    if groups > 1 and not gqa:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if style == "window":
        extra = {"enable_gqa": True} if groups > 1 and gqa else {}
        return fn(q, k, v, cu, cu, max_len, max_len, scale=scale, window_size=(-1, 0), **extra)
    if style == "is_causal":
        return fn(q, k, v, cu, cu, max_len, max_len, is_causal=True)  # scale: the default 1/sqrt(D)
    return fn(q, k, v, cu, cu, max_len, max_len, softmax_scale=scale, causal=True)


def _masked(q, k, v, cu, scale, groups: int) -> torch.Tensor:
    """Exact attention over the packed sequence: causal, and only within each row."""
    t = q.shape[0]
    row = torch.searchsorted(cu[1:].contiguous(), torch.arange(t, device=q.device), right=True)
    pos = torch.arange(t, device=q.device)
    allowed = (row[:, None] == row[None, :]) & (pos[None, :] <= pos[:, None])
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                                           attn_mask=allowed, scale=scale)
    return out.transpose(0, 1)


@functools.lru_cache(maxsize=None)
def register() -> None:
    """Register `coevo_packed` with transformers (once per process)."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, packed_attention)


@contextlib.contextmanager
def packed(model: torch.nn.Module):
    """Run `model`'s forwards inside the block with packed attention, then restore its own kernel.
    A layer that activation checkpointing recomputes in the backward pass looks its kernel up again
    then: a training step keeps the block open over its backward passes too. Re-entrant."""
    register()
    config = getattr(model, "module", model).config
    before = config._attn_implementation
    if before == NAME:
        yield
        return
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = before
