"""On-policy GRPO against verifiable rewards: generate -> verify -> learn.

Each generator gets a slice of the step's prompts; each slice goes to a verifier as soon as it is
generated (Ray starts the verifier when its input ref is ready), and the learner trains on all
scored slices at once.
"""

from __future__ import annotations

import pyarrow as pa
import ray


class GRPO:
    name = "grpo"

    def rollout(self, ctx, prompts: pa.Table) -> dict[str, list[ray.ObjectRef]]:
        pieces = len(ctx.generators) * ctx.config.rollout.chunks_per_replica
        generated, scored = [], []
        for i, chunk in enumerate(ctx.split(prompts, pieces)):
            ref = ctx.generators[i % len(ctx.generators)].generate.remote(chunk)
            generated.append(ref)
            scored.append(ctx.verifiers[i % len(ctx.verifiers)].score.remote(ref))
        return {"generate": generated, "verify": scored}

    def learn(self, ctx, batches: list[ray.ObjectRef], dump_path: str | None) -> ray.ObjectRef:
        return ctx.learner.train_step.remote(*batches, dump_path=dump_path)
