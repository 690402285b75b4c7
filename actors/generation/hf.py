"""transformers `generate` backend (CPU or GPU)."""

from __future__ import annotations

import numpy as np
import torch
from transformers import GenerationConfig, LogitsProcessorList

from actors.generation import BACKENDS
from actors.generation.base import Samples
from actors.sampling import SamplingWarper, unsupported_settings
from actors.weights import load_state


@BACKENDS.register("hf")
class HFBackend:
    def __init__(self, model: torch.nn.Module, tokenizer, device: str = "cpu"):
        unsupported = unsupported_settings(model.generation_config)
        if unsupported:
            raise ValueError(f"the model's generation_config sets {unsupported}, which the learner cannot "
                             "reproduce in its log-probs; remove them from generation_config.json")
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.device = device
        eos = model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.eos_ids = sorted(set(eos) | {tokenizer.eos_token_id})

    @torch.no_grad()
    def generate(self, prompts: list[str], n: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, top_k: int = 0, greedy: bool = False) -> Samples:
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        mask = enc["attention_mask"]
        prompt_ids = [row[m.bool()].numpy().astype(np.int32) for row, m in zip(enc["input_ids"], mask)]
        input_ids = enc["input_ids"].repeat_interleave(n, dim=0).to(self.device)
        attention = mask.repeat_interleave(n, dim=0).to(self.device)
        # Our own generation config, never the model's defaults: sampling goes through one warper
        # whose distribution the learner recomputes exactly (actors.sampling).
        sampling = {} if greedy else dict(temperature=1.0, top_k=0, top_p=1.0)
        config = GenerationConfig(do_sample=not greedy, max_new_tokens=max_new_tokens,
                                  pad_token_id=self.tokenizer.pad_token_id, eos_token_id=self.eos_ids,
                                  output_scores=True, return_dict_in_generate=True, **sampling)
        processors = LogitsProcessorList([] if greedy else [SamplingWarper(temperature, top_k, top_p)])
        out = self.model.generate(input_ids=input_ids, attention_mask=attention, generation_config=config,
                                  logits_processor=processors)
        tokens = out.sequences[:, input_ids.shape[1]:]
        # Behaviour log-probs: the processed scores are exactly what was sampled from.
        scores = torch.stack(out.scores, dim=1).float()
        logprobs = torch.log_softmax(scores, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
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

    def load_weights(self, payload: dict, version: int) -> None:
        load_state(self.model, payload, version, where="generator's model")
