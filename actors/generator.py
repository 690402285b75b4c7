"""Generator actor: samples n responses per prompt and returns an Arrow rollout batch."""

from __future__ import annotations

import uuid

import numpy as np
import pyarrow as pa
import ray

from actors import batch as B


class Generator:
    """Hosts one generation backend. Stateless about the loop: it samples what it is given with the
    weights of the last version it was sent."""

    def __init__(self, config, model_source: str | None, replica: int = 0):
        from actors import modeling
        from actors.generation import BACKENDS
        from actors.runtime import setup_torch

        device = setup_torch(config.train.threads, config.seed + 1000 * (replica + 1),
                             want_gpu=config.rollout.num_gpus > 0)
        model, tokenizer = modeling.build(config.model, config.seed)
        if model_source:  # a warm-up checkpoint
            model = modeling.load_model(model_source)
        self.backend = BACKENDS.get(config.rollout.backend)(model, tokenizer, device=device)
        self.config = config.rollout
        self.version = 0
        self.replica = replica

    def update_weights(self, version: int, state: dict[str, np.ndarray]) -> int:
        self.backend.load_weights(state)
        self.version = version
        return version

    def generate(self, prompts: pa.Table, n: int | None = None, greedy: bool = False) -> pa.Table:
        """`prompts` has prompt_id and prompt; other columns pass through to every sample."""
        cfg = self.config
        n = 1 if greedy else (n or cfg.samples_per_prompt)
        texts = prompts.column("prompt").to_pylist()
        out = self.backend.generate(texts, n=n, max_new_tokens=cfg.max_new_tokens,
                                    temperature=cfg.temperature, top_p=cfg.top_p, greedy=greedy)
        repeat = np.repeat(np.arange(prompts.num_rows), n)
        prompt_lengths = np.array([len(p) for p in out.prompt_ids], dtype=np.int64)
        prompt_ids = B.list_column(np.concatenate(out.prompt_ids) if len(out.prompt_ids) else
                                   np.zeros(0, np.int32), prompt_lengths, pa.int32())
        extra = {name: prompts.column(name).take(repeat) for name in prompts.schema.names
                 if name not in ("prompt_id", "prompt")}
        return B.rollout_table(
            uid=[uuid.uuid4().hex for _ in range(len(repeat))],
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


GeneratorActor = ray.remote(Generator)
