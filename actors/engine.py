"""The learner's compute settings resolved for its device, and the numbers it reports about its speed
(docs/learner.md#precision, #packing, #speed-metrics).

- precision: `auto` is bf16 autocast on a CUDA GPU that supports bf16 (fp32 master weights and
  optimizer state), fp32 elsewhere; `fp32`, `bf16`, `fp16` are taken as given (bf16 also on a CPU).
- packing: `auto` packs rows padding-free on a GPU (where varlen attention has a kernel) and keeps
  padded, shared-prompt micro-batches on a CPU (faster there for short rows; docs/benchmarks.md).
- FLOPs of a trained token: 6 N (forward and backward through N parameters) plus causal attention,
  6 x layers x attention width x sequence length; MFU = FLOPs per second / the device's peak.
"""

from __future__ import annotations

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# Dense peak TFLOP/s by GPU name (vendor datasheets, without sparsity): bf16/fp16 tensor cores, and
# fp32 (tf32 where PyTorch allows it for matmuls). learner.peak_tflops overrides.
PEAK_TFLOPS = {
    "H200": {"bf16": 989.0, "tf32": 494.7, "fp32": 66.9},
    "H100": {"bf16": 989.0, "tf32": 494.7, "fp32": 66.9},
    "H800": {"bf16": 989.0, "tf32": 494.7, "fp32": 66.9},
    "B200": {"bf16": 2250.0, "tf32": 1100.0, "fp32": 80.0},
    "A100": {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "A800": {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "L40S": {"bf16": 362.0, "tf32": 183.0, "fp32": 91.6},
    "L4": {"bf16": 121.0, "tf32": 60.0, "fp32": 30.3},
    "A10": {"bf16": 125.0, "tf32": 62.5, "fp32": 31.2},
}


def resolve_precision(setting: str, device: str) -> torch.dtype:
    """The compute dtype of `learner.precision` on `device`."""
    if setting != "auto":
        return DTYPES[setting]
    if str(device).startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def resolve_packing(setting: str, device: str, dtype: torch.dtype) -> bool:
    """Whether the policy-gradient step packs rows padding-free (`learner.packing`)."""
    if setting != "auto":
        return setting == "on"
    from actors.attention import kernel
    return kernel(device, dtype) == "varlen"


def model_shape(model: torch.nn.Module) -> tuple[int, int, int]:
    """(parameters, layers, attention width) of a transformers causal LM, for the FLOP count."""
    inner = getattr(model, "module", model)
    config = inner.config
    n = sum(p.numel() for p in inner.parameters())
    heads = getattr(config, "num_attention_heads", 0) or 0
    head_dim = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else 0)
    return n, getattr(config, "num_hidden_layers", 0) or 0, heads * head_dim


def train_flops(shape: tuple[int, int, int], tokens: float, sum_sq_lengths: float) -> float:
    """FLOPs of one forward and backward over `tokens` tokens in sequences whose squared lengths sum
    to `sum_sq_lengths`: 6 N per token plus causal attention, 6 x layers x width x length per token."""
    n, layers, width = shape
    return 6.0 * n * tokens + 6.0 * layers * width * sum_sq_lengths


def peak_flops(device: str, dtype: torch.dtype, setting: float | None = None) -> float | None:
    """The device's dense peak FLOP/s in `dtype` (`learner.peak_tflops` when set); None where unknown."""
    if setting:
        return setting * 1e12
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(torch.device(device))
    kind = "bf16" if dtype in (torch.bfloat16, torch.float16) else (
        "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32")
    for key, peaks in PEAK_TFLOPS.items():
        if key in name.replace("NVIDIA ", "").split() or name.replace("NVIDIA ", "").startswith(key):
            return peaks[kind] * 1e12
    return None
