"""Decoding steps over transformers' static KV cache, one compiled call each (CUDA graphs on a GPU).

At a small model and a large batch a decoding step on a GPU is bound by launches, not arithmetic: the
0.5B preset's step is about 500 kernels, each launched from Python (docs/benchmarks.md). A static
cache keeps every tensor of the step at one shape and one address, so `torch.compile` can capture the
whole step once per shape and replay it as a CUDA graph (mode "reduce-overhead"), as transformers'
own `generate(cache_implementation="static")` does. The HF backend keeps its prefill (each prompt
once, shared by its n samples) and its sampling loop; only the model's decoding forward comes from
here (`rollout.hf_static_cache`).

Each (batch size, cache length) gets its own cache, kept for the next call of that shape: a compiled
step is specialised to the cache object it was traced with, so reusing it is what makes the second
call free of compilation. The cache length is the prompt width plus the new tokens, rounded up to a
multiple of `bucket`, so batches whose prompt widths differ a little share a shape.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from transformers import StaticCache

from actors.modeling import cache_kwargs

KEEP_SHAPES = 4  # caches (and their compiled steps) kept, least recently used first out
AUTO_MIN_NEW_TOKENS = 64  # auto: worth a compilation only where calls decode this many steps or more


def wanted(setting: bool | None, device: str, max_new_tokens: int, episodes: bool) -> bool:
    """rollout.hf_static_cache, resolved: an explicit setting wins; auto (None) is on a GPU for
    single-turn rollouts of at least AUTO_MIN_NEW_TOKENS new tokens. Short decodes (the default job's
    8 tokens) launch too few steps to repay a compilation per batch shape, and multi-turn episodes
    shrink their batch turn by turn (a compilation per size). Under auto a backend with the static
    cache also decodes its own short calls (a judge's verdict) with the dynamic one."""
    if setting is not None:
        return setting
    return str(device).startswith("cuda") and max_new_tokens >= AUTO_MIN_NEW_TOKENS and not episodes


class StaticDecoder:
    def __init__(self, model: torch.nn.Module, compile_mode: str | None, bucket: int = 64):
        """`compile_mode`: torch.compile's mode for the step ("reduce-overhead": CUDA graphs), "" for
        inductor's default, None to run the step eagerly (what the CPU tests check the cache with)."""
        self.model, self.bucket = model, bucket
        self.compiled = compile_mode is not None
        self.forward = (torch.compile(model.forward, mode=compile_mode or None, dynamic=False)
                        if self.compiled else model.forward)
        self.shapes: OrderedDict[tuple[int, int], tuple[StaticCache, torch.Tensor]] = OrderedDict()
        self.cache = self.mask = None

    def start(self, prefix, mask: torch.Tensor, new_tokens: int) -> None:
        """Copy a prefill's dynamic cache `prefix` (one row per sample, prompts left-padded to the
        width of `mask` [N, W]) into the static cache of this shape; the mask covers every slot
        (causality hides the ones not yet written)."""
        n, width = mask.shape
        length = -(-(width + new_tokens) // self.bucket) * self.bucket
        key = (n, length)
        if key in self.shapes:
            self.shapes.move_to_end(key)
            self.cache, self.mask = self.shapes[key]
            self.cache.reset()
        else:
            while len(self.shapes) >= KEEP_SHAPES:
                self.shapes.popitem(last=False)
            self.cache = StaticCache(config=self.model.config, max_cache_len=length)
            self.mask = torch.ones((n, length), dtype=mask.dtype, device=mask.device)
            if self.compiled:
                torch._dynamo.mark_static_address(self.mask)
            self.shapes[key] = (self.cache, self.mask)
        for i, layer in enumerate(prefix.layers):  # writes slots 0..W-1 and sets each layer's length
            self.cache.update(layer.keys, layer.values, i)
        self.mask[:, :width].copy_(mask)
        self.mask[:, width:] = 1

    def step(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """Logits [N, V] of the next token after `token` [N] at `position` [N, 1]; a copy, since a
        replayed graph overwrites its outputs on the next call."""
        if self.compiled:
            torch.compiler.cudagraph_mark_step_begin()
        out = self.forward(input_ids=token[:, None], attention_mask=self.mask, position_ids=position,
                           use_cache=True, **cache_kwargs(self.model, self.cache))
        return out.logits[:, -1].clone()
