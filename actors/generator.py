"""Generator actor: samples n responses per prompt and returns an Arrow rollout batch."""

from __future__ import annotations

import time
import uuid

import numpy as np
import pyarrow as pa
import ray

from actors import batch as B


class StaleReplicaError(RuntimeError):
    """A replica was asked to work at a weights version it does not hold (e.g. it was restarted)."""


class Generator:
    """Hosts one generation backend. Stateless about the loop: it samples what it is given with the
    weights of the last version it was sent, and stamps that version on every row."""

    def __init__(self, config, model_source: str | None, role: dict | None = None):
        from actors import modeling
        from actors.generation import BACKENDS
        from actors.runtime import setup_torch

        role = role or {}
        replica = role.get("replica", 0)
        device = setup_torch(role.get("threads", 0) or config.train.threads, config.seed + 1000 * (replica + 1),
                             want_gpu=role.get("num_gpus", 0) > 0)
        model, tokenizer = modeling.build(config.model, config.seed)
        if model_source:  # a warm-up checkpoint
            model = modeling.load_model(model_source)
        self.backend = BACKENDS.get(config.rollout.backend)(model, tokenizer, device=device)
        self.config = config.rollout
        self.seed = config.seed
        self.version = 0
        self.replica = replica

    def update_weights(self, version: int, payload: dict) -> int:
        self.backend.load_weights(payload, version)
        self.version = version
        return version

    def ping(self) -> int:
        return self.version

    @ray.method(num_returns=2)
    def generate(self, prompts: pa.Table, n: int | None = None, greedy: bool = False, seq: int | None = None,
                 expect_version: int | None = None) -> tuple[pa.Table, dict]:
        """`prompts` has prompt_id and prompt; other columns pass through to every sample.

        `seq` numbers the request within the run: it names the samples (uid `seq.prompt.sample`,
        group `seq.prompt`) and seeds the sampling, so a retried request reproduces its samples.
        Returns the rollout table and a small info dict for the orchestrator."""
        if expect_version is not None and expect_version != self.version:
            raise StaleReplicaError(f"generator replica {self.replica} holds weights version {self.version}, "
                                    f"asked for {expect_version}")
        start = time.perf_counter()
        cfg = self.config
        n = 1 if greedy else (n or cfg.samples_per_prompt)
        if seq is not None and not greedy:
            import torch
            torch.manual_seed(hash((self.seed, seq)) % 2**63)
        texts = prompts.column("prompt").to_pylist()
        out = self.backend.generate(texts, n=n, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                                    top_p=cfg.top_p, top_k=cfg.top_k, greedy=greedy)
        repeat = np.repeat(np.arange(prompts.num_rows), n)
        sample = np.tile(np.arange(n), prompts.num_rows)
        tag = f"{seq}" if seq is not None else uuid.uuid4().hex[:12]
        prompt_lengths = np.array([len(p) for p in out.prompt_ids], dtype=np.int64)
        prompt_ids = B.list_column(np.concatenate(out.prompt_ids) if len(out.prompt_ids) else
                                   np.zeros(0, np.int32), prompt_lengths, pa.int32())
        extra = {name: prompts.column(name).take(repeat) for name in prompts.schema.names
                 if name not in ("prompt_id", "prompt")}
        table = B.rollout_table(
            uid=[f"{tag}.{g}.{s}" for g, s in zip(repeat, sample)],
            group_id=[f"{tag}.{g}" for g in repeat],
            prompt_id=prompts.column("prompt_id").take(repeat).to_pylist(),
            prompt=[texts[i] for i in repeat],
            response=self.backend.decode(out.response_ids, out.response_lengths),
            prompt_ids=prompt_ids.take(pa.array(repeat)),
            response_ids=B.list_column(out.response_ids, out.response_lengths, pa.int32()),
            behavior_logprobs=B.list_column(out.logprobs, out.response_lengths, pa.float32()),
            policy_version=self.version,
            finish_reason=out.finish_reason,
            extra=extra,
        )
        info = {"rows": table.num_rows, "version": self.version, "busy_s": time.perf_counter() - start,
                "tokens": int(out.response_lengths.sum())}
        return table, info


GeneratorActor = ray.remote(Generator)
