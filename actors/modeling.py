"""Models and tokenizers without a hub: a tiny model built from a config with a locally built
character tokenizer, or any HF model + tokenizer from a local directory."""

from __future__ import annotations

import copy
import functools
import string
import sys
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (AutoModelForCausalLM, AutoTokenizer, LlamaConfig, PreTrainedTokenizerFast,
                          Qwen2Config)
from transformers.utils import logging as hf_logging

# transformers draws a "Loading weights" progress bar (with terminal escape codes) at every load; in
# an actor, a Ray job log or CI, stdout is a file, so the bar is only noise there.
if not sys.stdout.isatty():
    hf_logging.disable_progress_bar()

SPECIAL_TOKENS = ["<pad>", "<eos>", "<unk>"]
# Printable ASCII plus newline: enough for arithmetic and simple text tasks.
CHARACTERS = [c for c in string.printable if c not in "\t\r\x0b\x0c"]


def cache_kwargs(model: torch.nn.Module, cache: Any) -> dict:
    """The KV cache as forward's keyword: transformers 5.24 renamed `past_key_values` to `cache`
    (the old name warns in every call and goes in 5.40); older versions know only the old one."""
    inner = innermost(model)
    name = _CACHE_KWARG.get(type(inner))
    if name is None:
        import inspect
        name = _CACHE_KWARG[type(inner)] = ("cache" if "cache" in inspect.signature(inner.forward).parameters
                                            else "past_key_values")
    return {name: cache}


def last_logits_kwargs(model: torch.nn.Module) -> dict:
    """Ask forward for the last position's logits only (a prefill need not make [B, T, vocab] logits):
    `logits_to_keep` since transformers 4.50 (`num_logits_to_keep` before); {} where neither exists."""
    inner = innermost(model)
    name = _KEEP_KWARG.get(type(inner), "")
    if name == "":
        import inspect
        params = inspect.signature(inner.forward).parameters
        name = _KEEP_KWARG[type(inner)] = next((n for n in ("logits_to_keep", "num_logits_to_keep") if n in params), None)
    return {name: 1} if name else {}


_KEEP_KWARG: dict[type, str | None] = {}


def innermost(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a DDP-style wrapper (`.module`, whose forward takes **kwargs) and a
    peft model (whose forward passes keywords on): the one whose signature names the keywords."""
    inner = getattr(model, "module", model)
    return inner.get_base_model() if hasattr(type(inner), "get_base_model") else inner


def output_cache(out: Any) -> Any:
    """The KV cache a forward with use_cache=True returned, under either name (cache_kwargs)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


_CACHE_KWARG: dict[type, str] = {}

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def inference_dtype(setting: str, device: str | torch.device) -> torch.dtype:
    """`model.dtype` of a copy that does not train (a generator, judge, frozen reference or reward
    model) on `device`: auto is bfloat16 on a GPU (what every peer generates in), float32 on a CPU
    (where bfloat16 matmuls are slow and the learner's log-probs match the generator's exactly)."""
    if setting == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    return DTYPES[setting]


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character, built locally (no hub)."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>", padding_side="left")


def tiny_model(tokenizer: PreTrainedTokenizerFast, arch: str = "qwen2", hidden_size: int = 128,
               num_layers: int = 4, num_heads: int = 4, num_kv_heads: int = 2,
               intermediate_size: int = 512, max_position_embeddings: int = 256,
               init_std: float = 0.02, seed: int = 0, attn: str | None = None) -> torch.nn.Module:
    """A small Qwen2- or Llama-style causal LM initialised from scratch (`attn`: as in load_model)."""
    common: dict[str, Any] = dict(
        vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size, max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id,
        initializer_range=init_std,
    )
    config = {"qwen2": Qwen2Config, "llama": LlamaConfig}[arch](**common)
    torch.manual_seed(seed)
    return _with_kernel(functools.partial(AutoModelForCausalLM.from_config, config, dtype=torch.float32), attn)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if tok.pad_token is None:  # many causal LMs ship without one
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_model(path: str | Path, dtype: torch.dtype = torch.float32, attn: str | None = None) -> torch.nn.Module:
    """`attn`: transformers' attention implementation (model.attn_implementation; None: its default)."""
    load = functools.partial(AutoModelForCausalLM.from_pretrained, str(path), local_files_only=True, dtype=dtype)
    return _with_kernel(load, attn)


def reinitialised(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """The same architecture with fresh random weights (its config's initialisation, seeded): a model
    trained from scratch beside the one it was loaded as (`judge.init: scratch`)."""
    dtype = next(model.parameters()).dtype
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        fresh = type(model)(copy.deepcopy(model.config))
    return fresh.to(dtype)


def _with_kernel(make, attn: str | None) -> torch.nn.Module:
    """`make()`, with transformers' attention kernel `attn` where one is chosen; a kernel that
    cannot run here (flash_attention_2 without its package, or on CPU) fails naming the setting."""
    if not attn:
        return make()
    try:
        return make(attn_implementation=attn)
    except (ImportError, ValueError) as e:
        raise ValueError(f"model.attn_implementation={attn!r} cannot be used here: {str(e).splitlines()[0]}") from None


def build(model_cfg: Any, seed: int) -> tuple[torch.nn.Module, PreTrainedTokenizerFast]:
    """Model + tokenizer from the `model` config section (see orchestrator.config.ModelConfig)."""
    if model_cfg.path:
        path = Path(model_cfg.path).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"model.path {str(path)!r} is not a directory")
        return load_model(path, attn=model_cfg.attn_implementation), load_tokenizer(path)
    tok = char_tokenizer()
    t = model_cfg.tiny
    model = tiny_model(tok, arch=t.arch, hidden_size=t.hidden_size, num_layers=t.num_layers,
                       num_heads=t.num_heads, num_kv_heads=t.num_kv_heads,
                       intermediate_size=t.intermediate_size, init_std=t.init_std, seed=seed,
                       attn=model_cfg.attn_implementation)
    return model, tok


def load_reward_model(path: str | Path, seed: int = 0, dtype: torch.dtype = torch.float32):
    """A scalar reward model (one logit) + tokenizer from a local directory: a saved reward model,
    or a causal LM whose body is kept and gets a fresh, seeded scalar head (`score`)."""
    from transformers import AutoModelForSequenceClassification

    if path is None:
        raise ValueError("load_reward_model needs a model directory")
    tokenizer = load_tokenizer(path)
    torch.manual_seed(seed)  # the fresh head is the same wherever this runs
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "some weights were newly initialised" is the point here
    try:
        model = AutoModelForSequenceClassification.from_pretrained(str(path), num_labels=1, local_files_only=True,
                                                                   dtype=dtype)
    finally:
        hf_logging.set_verbosity(verbosity)
    if model.config.pad_token_id is None:  # needed to find each sequence's last token
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def umask_modes(folder: str | Path) -> None:
    """safetensors (0.8) writes `model.safetensors` 0600, beside the 0644 files of the rest of a
    save: give the files in `folder` the mode a plain open() would (0666 less the umask)."""
    mode = 0o666 & ~_umask()
    for path in Path(folder).iterdir():
        if path.is_file() and not path.is_symlink() and (path.stat().st_mode & 0o777) != mode:
            path.chmod(mode)


def _umask() -> int:
    import os

    try:  # read without changing it (os.umask can only be read by setting it, racing other threads)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fresh_reward_model(model_cfg: Any, seed: int, workdir: str | Path):
    """A reward model on a freshly built body (`model` config section): no warm policy to start from."""
    model, tok = build(model_cfg, seed)
    model.save_pretrained(workdir)
    tok.save_pretrained(workdir)
    return load_reward_model(workdir, seed=seed)
