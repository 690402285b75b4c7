"""transformers `generate` backend (CPU or GPU)."""

from __future__ import annotations

import numpy as np
import torch
from transformers import GenerationConfig, LogitsProcessorList

from actors.chat import stop_token_ids
from actors.generation import BACKENDS
from actors.generation.base import Samples, decode_responses, stop_texts
from actors.modeling import cache_kwargs, last_logits_kwargs, output_cache
from actors.sampling import SamplingWarper, processed_logits, unsupported_settings
from actors.weight_transport import node_ip
from actors.weights import load_state


@BACKENDS.register("hf")
class HFBackend:
    can_sleep = False  # its model stays where it is; sleeping is vLLM's (rollout.vllm_sleep_level)

    def __init__(self, model: torch.nn.Module, tokenizer, device: str = "cpu", sleep_mode: bool = False,
                 free_memory: bool = False, static_cache: bool = False, static_min_new_tokens: int = 1):
        """`free_memory`: hand the KV cache's memory back to the GPU after every call (the generator
        shares its GPU with a learner, which trains while it idles).
        `static_cache` (rollout.hf_static_cache, resolved by static_cache.wanted): decode over a
        static KV cache, each step one compiled CUDA graph (actors/generation/static_cache.py); on
        a CPU the step runs eagerly over it (no faster: what the tests check it with). Calls asking
        for fewer than `static_min_new_tokens` tokens (a judge's verdict, an evaluation's short
        answer) decode with the dynamic cache: a compilation per shape would not pay for them."""
        unsupported = unsupported_settings(model.generation_config)
        if unsupported:
            raise ValueError(f"the model's generation_config sets {unsupported}, which the learner cannot "
                             "reproduce in its log-probs; remove them from generation_config.json")
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.device = device
        self.free_memory = free_memory and str(device).startswith("cuda")
        self.defer_stop = str(device).startswith("cuda")  # read "all ended" a step late (see generate)
        gpu = str(device).startswith("cuda")
        self.static = None
        if static_cache:
            from actors.generation.static_cache import StaticDecoder
            self.static = StaticDecoder(self.model, "reduce-overhead" if gpu else None)
        self.static_min_new_tokens = static_min_new_tokens
        # the generation_config's eos ids, the tokenizer's, and the chat template's end-of-turn tokens
        self.eos_ids = stop_token_ids(model.generation_config, tokenizer)

    @torch.no_grad()
    def generate(self, prompts: list[str], n: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, top_k: int = 0, greedy: bool = False, next_token: int | None = None,
                 stop: list[str] = ()) -> Samples:
        """n samples per prompt. Each prompt is run once and its key/value cache shared by its n
        samples (GRPO samples 8 or more per prompt: most of the prefill is shared); then a plain
        decoding loop samples from exactly the distribution `actors.sampling` describes.
        `next_token`: also return log pi(next_token | prompt, response) for each sample (LaSeR's
        last-token self-reward): read off the step after a response's EOS, or one extra one-token
        forward pass for the responses that end at the last step.
        `stop`: a sample also ends after the token that completes one of these strings (it is kept);
        only the tails of running samples are decoded to look for them.
        On a GPU the host never waits for the device within a step: whether every sample has ended
        is copied back without blocking and read a step later (one extra step at the end, whose
        tokens are padding), as transformers' deferred stop check does; stop strings need the
        tokens on the host, so with them each step waits."""
        try:
            return self._generate(prompts, n, max_new_tokens, temperature, top_p, top_k, greedy, next_token, stop)
        finally:
            if self.free_memory:  # the KV cache went with the call: give its memory back to the GPU
                torch.cuda.empty_cache()

    @torch.no_grad()
    def generate_ids(self, prompt_ids: list[np.ndarray], max_new_tokens: int, temperature: float = 1.0,
                     top_p: float = 1.0, top_k: int = 0, greedy: bool = False, stop: list[str] = ()) -> Samples:
        """One sample per prompt given as token ids (token-in/token-out: multi-turn episodes extend
        their contexts by ids and are never re-tokenised)."""
        try:
            return self._generate(None, 1, max_new_tokens, temperature, top_p, top_k, greedy, None, stop,
                                  ids=prompt_ids)
        finally:
            if self.free_memory:
                torch.cuda.empty_cache()

    def _encode(self, prompts: list[str] | None, ids: list[np.ndarray] | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded input ids and attention mask, from texts or from token ids."""
        if ids is None:
            enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
            return enc["input_ids"], enc["attention_mask"]
        width = max(len(p) for p in ids)
        input_ids = torch.full((len(ids), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for i, p in enumerate(ids):
            if len(p):
                input_ids[i, width - len(p):] = torch.as_tensor(np.asarray(p, dtype=np.int64))
                mask[i, width - len(p):] = 1
        return input_ids, mask

    def _generate(self, prompts, n, max_new_tokens, temperature, top_p, top_k, greedy, next_token, stop,
                  ids: list[np.ndarray] | None = None) -> Samples:
        input_ids, mask = self._encode(prompts, ids)
        prompt_ids = [row[m.bool()].numpy().astype(np.int32) for row, m in zip(input_ids, mask)]
        dev, model = self.device, self.model
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=input_ids.to(dev), attention_mask=mask.to(dev),
                    position_ids=positions.to(dev), use_cache=True, **last_logits_kwargs(model))
        cache = output_cache(out)
        if n > 1:
            cache.batch_repeat_interleave(n)
        logits = out.logits[:, -1].repeat_interleave(n, dim=0)
        del out
        mask = mask.repeat_interleave(n, dim=0).to(dev)
        position = positions[:, -1:].repeat_interleave(n, dim=0).to(dev) + 1
        eos = torch.tensor(self.eos_ids, device=dev)
        pad = torch.tensor(self.tokenizer.pad_token_id, device=dev)
        finished = torch.zeros(len(logits), dtype=torch.bool, device=dev)
        after = torch.full((len(logits),), float("nan"), device=dev)  # log pi(next_token | x, y)
        stopped = torch.zeros(len(logits), dtype=torch.long, device=dev)  # length, where a stop string ended it
        deferred = _DeferredFlag(dev) if self.defer_stop and not stop else None
        static = self.static if max_new_tokens >= self.static_min_new_tokens else None
        if static is not None:
            static.start(cache, mask, max_new_tokens)
            cache = None  # copied: the prefill's own cache goes
        tokens, logprobs = [], []
        for step in range(max_new_tokens):
            x = logits.float() if greedy else processed_logits(logits.float(), temperature, top_k, top_p)
            token = x.argmax(-1) if greedy else torch.multinomial(torch.softmax(x, dim=-1), 1).squeeze(1)
            logprobs.append(torch.log_softmax(x, dim=-1).gather(-1, token[:, None]).squeeze(1))
            token = torch.where(finished, pad, token)
            tokens.append(token)
            ended = ~finished & torch.isin(token, eos)
            if stop:
                hit = self._stop_hits(tokens, ~finished & ~ended, stop)
                stopped = torch.where(hit, step + 1, stopped)
                ended |= hit
            finished |= ended
            if step == max_new_tokens - 1:
                last = True
            elif deferred is not None:  # every sample had ended a step ago: this step's tokens are padding
                last = deferred.swap(finished.all())
            else:
                last = bool(finished.all())
            if last and next_token is None:
                break
            if static is not None:
                logits = static.step(token, position)
            else:
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                logits = model(input_ids=token[:, None], attention_mask=mask, position_ids=position,
                               use_cache=True, **cache_kwargs(model, cache)).logits[:, -1]
            position = position + 1
            if next_token is not None:  # the logits after each response's final token
                fill = (ended | torch.isnan(after)) if last else ended
                after = torch.where(fill, torch.log_softmax(logits.float(), dim=-1)[:, next_token], after)
            if last:
                break
        del cache
        out = _samples(prompt_ids, torch.stack(tokens, dim=1), torch.stack(logprobs, dim=1), eos,
                       None if next_token is None else after, stopped)
        if stop:  # the verifier sees the text before the stop string, as vLLM returns it
            out.texts = stop_texts(self.decode(out.response_ids, out.response_lengths), stopped.bool().tolist(), stop)
        return out

    def _stop_hits(self, tokens: list[torch.Tensor], running: torch.Tensor, stop: list[str]) -> torch.Tensor:
        """Rows of `running` whose text now contains a stop string. Only the last tokens are decoded:
        a string of L characters lies within the last L tokens (each decodes to a character or
        more); two more give the decoder the context before it."""
        hits = torch.zeros_like(running)
        rows = running.nonzero().squeeze(1)
        if len(rows):
            window = max(map(len, stop)) + 2
            tails = self.tokenizer.batch_decode(torch.stack(tokens[-window:], dim=1)[rows].cpu(),
                                                skip_special_tokens=True)
            found = torch.tensor([any(s in t for s in stop) for t in tails], device=rows.device)
            hits[rows[found]] = True
        return hits

    @torch.no_grad()
    def generate_hf(self, prompts: list[str], n: int, max_new_tokens: int, temperature: float = 1.0,
                    top_p: float = 1.0, top_k: int = 0, greedy: bool = False) -> Samples:
        """The same through transformers' `generate` (kept to check the loop above against it)."""
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
        return _samples(prompt_ids, tokens, logprobs, torch.tensor(self.eos_ids, device=tokens.device))

    def decode(self, response_ids: np.ndarray, lengths: np.ndarray) -> list[str]:
        return decode_responses(self.tokenizer, response_ids, lengths)

    def load_weights(self, payload: dict, version: int) -> None:
        load_state(self.model, payload, version, where="generator's model")

    def receive_weights(self, endpoint, link, rank: int, version: int, join: bool = True) -> None:
        endpoint.receive(link, rank, self.model, version, where="generator's model", device=self.device,
                         bind=node_ip(), join=join)


def _samples(prompt_ids, tokens: torch.Tensor, logprobs: torch.Tensor, eos: torch.Tensor,
             after: torch.Tensor | None = None, stopped: torch.Tensor | None = None) -> Samples:
    """Cut each row of sampled `tokens` [N, T] after its first end-of-sequence token (kept), or at
    its `stopped` length where a stop string ended it (> 0), into the flat Samples layout."""
    is_eos = torch.isin(tokens, eos)
    has_eos = is_eos.any(dim=1)
    lengths = torch.where(has_eos, is_eos.int().argmax(dim=1) + 1, tokens.shape[1])
    if stopped is not None:  # a stop string ends a row before any EOS (its later tokens are padding)
        has_eos = has_eos | (stopped > 0)
        lengths = torch.where(stopped > 0, stopped, lengths)
    keep = torch.arange(tokens.shape[1], device=tokens.device)[None, :] < lengths[:, None]
    return Samples(
        prompt_ids=prompt_ids,
        response_ids=tokens[keep].cpu().numpy().astype(np.int32),
        response_lengths=lengths.cpu().numpy().astype(np.int64),
        logprobs=logprobs[keep].cpu().numpy().astype(np.float32),
        finish_reason=["stop" if e else "length" for e in has_eos.tolist()],
        next_logprobs=None if after is None else after.cpu().numpy().astype(np.float32),
    )


class _DeferredFlag:
    """A device-side boolean read on the host one step late, without a stall: `swap(flag)` starts
    copying this step's flag to pinned host memory and returns the previous step's (False at first).
    Two slots, so the copy being read is never the one being written. (On a CPU, where nothing
    is queued, it only lags: what the tests check the GPU's loop with.)"""

    def __init__(self, device: str):
        self.cuda = str(device).startswith("cuda")
        self.slots = [(torch.zeros((), dtype=torch.bool, pin_memory=self.cuda),
                       torch.cuda.Event() if self.cuda else None) for _ in range(2)]
        self.pending = None

    def swap(self, flag: torch.Tensor) -> bool:
        host, event = self.slots[0]
        host.copy_(flag, non_blocking=self.cuda)
        if event is not None:
            event.record()
        previous, self.pending = self.pending, (host, event)
        self.slots.reverse()
        if previous is None:
            return False
        if previous[1] is not None:
            previous[1].synchronize()  # waits for the step before only: this one is still queued
        return bool(previous[0])
