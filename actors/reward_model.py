"""Reward-model actor: scalar reward models score (prompt, response) pairs into `reward.<name>`.

Each replica hosts every `model:` reward source of the run. A source whose learner trains it (cooper)
takes versioned weights through its channel; every row it scores records `reward_model_version`.
A sample that cannot be scored (empty or non-UTF-8 response, too long for the model) gets a null
reward and a `reward_error.<name>` reason, as with verifiers; the run goes on.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import ray
import torch

from actors import batch as B
from actors.weight_transport import Endpoint, Link, node_ip
from actors.weights import StaleReplicaError, inference_copy, load_state


def render(template: str, prompt: str, response: str, answer: str | None = None) -> str:
    """Fill a reward-model template ({prompt}, {response}, optional {answer}) without str.format,
    so braces in the texts are harmless."""
    text = template.replace("{prompt}", prompt).replace("{response}", response)
    return text.replace("{answer}", answer or "")


class ScalarScorer:
    """A scalar reward model in eval mode: texts -> one score each, in micro-batches."""

    def __init__(self, model, tokenizer, device: str, micro_batch: int = 64):
        self.model, self.tokenizer, self.device = model.to(device).eval(), tokenizer, device
        self.micro_batch = micro_batch
        self.max_tokens = getattr(model.config, "max_position_embeddings", None) or 10**9

    @torch.no_grad()
    def scores(self, texts: list[str]) -> tuple[np.ndarray, list[str | None]]:
        ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        out = np.full(len(texts), np.nan, dtype=np.float32)
        errors: list[str | None] = [None] * len(texts)
        ok = []
        for i, seq in enumerate(ids):
            if len(seq) > self.max_tokens:
                errors[i] = f"{len(seq)} tokens, more than the reward model's {self.max_tokens}"
            else:
                ok.append(i)
        for start in range(0, len(ok), self.micro_batch):
            rows = ok[start:start + self.micro_batch]
            out[rows] = score_ids(self.model, [ids[i] for i in rows], self.tokenizer.pad_token_id, self.device).cpu()
        return out, errors


def score_ids(model, ids: list[list[int]], pad_id: int, device: str) -> torch.Tensor:
    """Scalar scores [B] of token sequences, left-padded so every row's last token is the read-out."""
    width = max(len(s) for s in ids)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, s in enumerate(ids):
        input_ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                   position_ids=positions.to(device)).logits
    return logits.reshape(len(ids), -1)[:, 0].float()


class RewardModel:
    def __init__(self, config, sources: dict[str, str], role: dict | None = None, *, template: str):
        """`sources`: reward source name -> model directory; `template`: the text each model reads
        ({prompt}, {response}, {answer}; its recipe's role argument, from reward_model.template)."""
        from actors import modeling
        from actors.runtime import setup_torch

        role = role or {}
        self.device = setup_torch(role.get("threads", 0) or config.train.threads, config.seed + 77,
                                  want_gpu=role.get("num_gpus", 0) > 0)
        self.template = template
        self.scorers: dict[str, ScalarScorer] = {}
        for spec in config.model_rewards():
            model, tok = modeling.load_reward_model(sources[spec.name], seed=config.seed)
            model = inference_copy(model, modeling.inference_dtype(config.model.dtype, self.device))
            self.scorers[spec.name] = ScalarScorer(model, tok, self.device)
        self.version = 0
        self.weights_endpoint = Endpoint()  # its membership of the reward-model channel's weight group

    def ping(self) -> int:
        return self.version

    def update_weights(self, version: int, payload: dict, source: str | None = None) -> int:
        name = source or next(iter(self.scorers))
        load_state(self.scorers[name].model, payload, version, where=f"reward model {name!r}")
        self.version = version
        return version

    def receive_weights(self, link: Link, rank: int, version: int, join: bool = True, source: str | None = None) -> int:
        """Take `version` from the channel's collective broadcast; all or nothing, like update_weights."""
        name = source or next(iter(self.scorers))
        self.weights_endpoint.receive(link, rank, self.scorers[name].model, version, where=f"reward model {name!r}",
                                      device=self.device, bind=node_ip(), join=join)
        self.version = version
        return version

    @ray.method(num_returns=2)
    def score(self, table: pa.Table, expect_version: int | None = None) -> tuple[pa.Table, dict]:
        """Append `reward.<name>`/`reward_error.<name>` per reward model and `reward_model_version`."""
        if expect_version is not None and expect_version != self.version:
            raise StaleReplicaError(f"reward model replica holds version {self.version}, asked for {expect_version}")
        start = time.perf_counter()
        prompts, p_err = B.decode_texts(table, "prompt")
        responses, r_err = B.decode_texts(table, "response")
        answers = table.column("answer").cast(pa.string()).to_pylist() if "answer" in table.schema.names else None
        errors = [pe or re or ("empty response" if r == "" else None)
                  for pe, re, r in zip(p_err, r_err, responses)]
        valid = [i for i, e in enumerate(errors) if e is None]
        texts = [render(self.template, prompts[i], responses[i], answers[i] if answers else None) for i in valid]
        info = {"rows": table.num_rows}
        for name, scorer in self.scorers.items():
            mark = time.perf_counter()
            values = np.full(table.num_rows, np.nan, dtype=np.float32)
            why = list(errors)
            if texts:
                got, long = scorer.scores(texts)
                values[valid] = got
                for j, i in enumerate(valid):
                    why[i] = long[j]
            table = B.replace_column(table, B.REWARD_PREFIX + name, pa.array(values, pa.float32(), mask=np.isnan(values)))
            table = B.replace_column(table, B.REWARD_ERROR_PREFIX + name, pa.array(why, pa.string()))
            info[f"errors/{name}"] = sum(w is not None for w in why)
            info[f"seconds/{name}"] = time.perf_counter() - mark
        table = B.replace_column(table, "reward_model_version", pa.array(np.full(table.num_rows, self.version, np.int64)))
        info["busy_s"] = time.perf_counter() - start
        return B.with_version(table), info
