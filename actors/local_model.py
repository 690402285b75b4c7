"""A chat model directory made locally, as a user's downloaded instruct checkpoint would look: a
byte-level BPE tokenizer trained with `tokenizers` on the task's text (Qwen2's pre-tokenizer: one
token per digit), special tokens (`<|endoftext|>` pad, `<|im_start|>`, `<|im_end|>` eos), a ChatML
template, and a Qwen2-style model with random weights, saved with `save_pretrained` (no hub).
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast, Qwen2Config

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
# Qwen2's split: letters with a leading space, single digits, punctuation runs, newlines, spaces
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
         r"|\s+(?!\S)|\s+")
# ChatML, as Qwen2.5-Instruct writes it (without tools)
CHATML = ("{%- for message in messages %}"
          "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
          "{%- endfor %}"
          "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def train_tokenizer(texts: list[str], vocab_size: int, pad_token: bool = True) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer of at most `vocab_size` tokens trained on `texts` (every byte is a
    token, so any text encodes). `pad_token=False` leaves it without one, as many checkpoints ship."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, IM_START, IM_END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=PAD if pad_token else None,
                                   padding_side="left", chat_template=CHATML, model_max_length=4096)


def build(out_dir: str | Path, texts: list[str], vocab_size: int = 512, hidden_size: int = 128,
          num_layers: int = 4, num_heads: int = 4, num_kv_heads: int = 2, intermediate_size: int = 512,
          max_position_embeddings: int = 512, init_std: float = 0.02, seed: int = 0,
          pad_token: bool = True) -> Path:
    """Write the model directory to `out_dir`: tokenizer files, config.json, generation_config.json
    (eos: `<|im_end|>` and `<|endoftext|>`, as Qwen2.5-Instruct's) and the weights."""
    out = Path(out_dir)
    tok = train_tokenizer(texts, vocab_size, pad_token)
    pad_id, end_id = tok.convert_tokens_to_ids(PAD), tok.convert_tokens_to_ids(IM_END)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=hidden_size, num_hidden_layers=num_layers,
                         num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                         intermediate_size=intermediate_size, max_position_embeddings=max_position_embeddings,
                         tie_word_embeddings=True, initializer_range=init_std, bos_token_id=None,
                         eos_token_id=end_id, pad_token_id=pad_id if pad_token else None)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=[end_id, pad_id], bos_token_id=None,
                                               pad_token_id=pad_id if pad_token else None)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
