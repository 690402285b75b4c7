"""LoRA adapters on a learner's model (`learner.lora`, with peft).

- RL trains the adapters only: they alone require gradients and sit in the optimizer. The SFT and
  other warm-ups train the whole base (the adapters start at zero, so the model is the base then).
- Generators and every export get the merged weights (base + B A x alpha / r) under the base model's
  own parameter names, computed without touching the base (merging in place and back would drift it
  a rounding error a step).
- The KL reference is the base with the adapters switched off (peft's `disable_adapter`), a view of
  the same parameters: no second copy.
- A checkpoint holds the merged export (plain transformers loads it), the adapter (`adapter/`,
  peft's `save_pretrained`) and, once per run, the base (the learner's reference directory), from
  which a resume puts base and adapter back exactly.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import torch

ADAPTER_DIR = "adapter"
ADAPTER = "default"  # peft's name of the one adapter


def wrap(model: torch.nn.Module, settings) -> torch.nn.Module:
    """`model` with LoRA adapters (`settings`: learner.lora); the adapters are what trains."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=settings.target_modules, bias="none", task_type="CAUSAL_LM")
    try:
        with warnings.catch_warnings():  # peft reads transformers' deprecated is_gradient_checkpointing
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            peft_model = get_peft_model(model, config)
    except ValueError as e:
        raise ValueError(f"learner.lora.target_modules={settings.target_modules!r}: {e}") from None
    head = model.get_output_embeddings()
    if any(m is head or getattr(m, "base_layer", None) is head for _, m in layers(peft_model)):
        raise ValueError("learner.lora.target_modules adapts the output layer, which the learner reads its "
                         "log-probs from directly; adapt the decoder layers only")
    train_adapters(peft_model)
    return peft_model


def is_lora(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


def layers(peft_model):
    """(name under the base model, module) of every LoRA layer."""
    from peft.tuners.lora import LoraLayer

    return [(n, m) for n, m in peft_model.get_base_model().named_modules() if isinstance(m, LoraLayer)]


def adapter_parameters(peft_model) -> list[torch.nn.Parameter]:
    return [p for n, p in peft_model.named_parameters() if "lora_" in n]


def train_adapters(peft_model) -> None:
    """RL: the adapters train, the base is frozen."""
    for n, p in peft_model.named_parameters():
        p.requires_grad_("lora_" in n)


def train_base(peft_model) -> None:
    """A warm-up: the base trains (the adapters, at zero, stay out of it)."""
    for n, p in peft_model.named_parameters():
        p.requires_grad_("lora_" not in n)


def base_state(peft_model) -> dict[str, torch.Tensor]:
    """The base model's state dict under its own names (no adapters)."""
    return {k.replace(".base_layer.", "."): v for k, v in peft_model.get_base_model().state_dict().items()
            if ".lora_" not in k}


@torch.no_grad()
def merged_state(peft_model) -> dict[str, torch.Tensor]:
    """The base's state dict with every adapted weight replaced by base + delta (new tensors; the
    model is not changed)."""
    state = base_state(peft_model)
    for name, module in layers(peft_model):
        if ADAPTER in module.lora_A:
            key = f"{name}.weight"
            state[key] = state[key] + module.get_delta_weight(ADAPTER).to(state[key].dtype)
    return state


@torch.no_grad()
def load_base_state(peft_model, state: dict[str, torch.Tensor]) -> None:
    """Copy a plain state dict (base names) into the base weights; the adapters are left as they are."""
    own = peft_model.get_base_model().state_dict()
    names = {k.replace(".base_layer.", "."): k for k in own if ".lora_" not in k}
    missing = sorted(set(names) - set(state))
    if missing:
        raise ValueError(f"LoRA base weights: missing {len(missing)} tensors (e.g. {missing[:3]})")
    for plain, key in names.items():
        own[key].copy_(state[plain])


def adapters_zero(peft_model) -> bool:
    return all(not m.lora_B[ADAPTER].weight.any() for _, m in layers(peft_model) if ADAPTER in m.lora_B)


@torch.no_grad()
def fold(peft_model) -> None:
    """Fold the adapters into the base (base += delta) and restart them at zero: the model computes the
    same, and the base (the reference view) is now these weights."""
    for _, module in layers(peft_model):
        if ADAPTER in module.lora_A:
            base = module.get_base_layer().weight
            base += module.get_delta_weight(ADAPTER).to(base.dtype)
            module.reset_lora_parameters(ADAPTER, True)


def save_adapter(peft_model, out: Path) -> None:
    peft_model.save_pretrained(str(Path(out) / ADAPTER_DIR))


def load_adapter(peft_model, path: Path) -> None:
    """The adapter weights saved by `save_adapter` in checkpoint directory `path`."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    file = Path(path) / ADAPTER_DIR / "adapter_model.safetensors"
    if not file.is_file():
        raise FileNotFoundError(f"{file} not found: this checkpoint has no LoRA adapter (was it saved with "
                                "learner.lora set?)")
    result = set_peft_model_state_dict(peft_model, load_file(str(file)))
    unexpected = getattr(result, "unexpected_keys", None) or []
    if unexpected:
        raise ValueError(f"{file}: adapter weights that do not fit learner.lora here: {unexpected[:3]}")


class AdapterOff(torch.nn.Module):
    """The base model as a frozen reference: `model`'s forward with its adapters switched off. The
    model is held, not registered, so the view owns no parameters (moving or freezing the view
    leaves the policy alone); `module` is where callers find the model (as under a DDP wrapper)."""

    def __init__(self, peft_model):
        super().__init__()
        object.__setattr__(self, "module", peft_model)
        self.eval()

    def forward(self, *args, **kwargs):
        with self.module.disable_adapter():
            return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def off(self):
        with self.module.disable_adapter():
            yield self.module
