"""transformers `generate` backend: works on CPU and GPU, any causal LM."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from actors.generation import BACKENDS
from actors.generation.base import Samples


@BACKENDS.register("hf")
class HFBackend:
    def __init__(self, model: torch.nn.Module, tokenizer, device: str = "cpu"):
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.device = device
        eos = model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.eos_ids = sorted(set(eos) | {tokenizer.eos_token_id})

    @torch.no_grad()
    def generate(self, prompts: list[str], n: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, greedy: bool = False) -> Samples:
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        mask = enc["attention_mask"]
        prompt_ids = [row[m.bool()].numpy().astype(np.int32) for row, m in zip(enc["input_ids"], mask)]
        input_ids = enc["input_ids"].repeat_interleave(n, dim=0).to(self.device)
        attention = mask.repeat_interleave(n, dim=0).to(self.device)
        sampling = {} if greedy else dict(temperature=temperature, top_p=top_p, top_k=0)
        out = self.model.generate(
            input_ids=input_ids, attention_mask=attention, max_new_tokens=max_new_tokens,
            do_sample=not greedy, output_logits=True, return_dict_in_generate=True,
            pad_token_id=self.tokenizer.pad_token_id, eos_token_id=self.eos_ids, **sampling)
        tokens = out.sequences[:, input_ids.shape[1]:]
        # Behaviour log-probs: the sampling distribution before top-p truncation (logits / T).
        logits = torch.stack(out.logits, dim=1).float()
        if not greedy:
            logits = logits / temperature
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        is_eos = torch.isin(tokens, torch.tensor(self.eos_ids, device=tokens.device))
        has_eos = is_eos.any(dim=1)
        lengths = torch.where(has_eos, is_eos.int().argmax(dim=1) + 1, tokens.shape[1])
        keep = torch.arange(tokens.shape[1], device=tokens.device)[None, :] < lengths[:, None]
        return Samples(
            prompt_ids=prompt_ids,
            response_ids=tokens[keep].cpu().numpy().astype(np.int32),
            response_lengths=lengths.cpu().numpy().astype(np.int64),
            logprobs=logprobs[keep].cpu().numpy().astype(np.float32),
            finish_reason=["stop" if e else "length" for e in has_eos.tolist()],
        )

    def decode(self, response_ids: np.ndarray, lengths: np.ndarray) -> list[str]:
        ends = np.cumsum(lengths)
        pieces = np.split(response_ids, ends[:-1]) if len(lengths) else []
        return self.tokenizer.batch_decode(pieces, skip_special_tokens=True)

    def load_weights(self, state: dict[str, np.ndarray]) -> None:
        with warnings.catch_warnings():  # object-store arrays are read-only; load_state_dict copies
            warnings.simplefilter("ignore", UserWarning)
            tensors = {k: torch.from_numpy(v) for k, v in state.items()}
        self.model.load_state_dict(tensors, strict=False)
