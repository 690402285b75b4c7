"""Held-out evaluation shared by the warm-up and the recipes: greedy generation on the eval split,
scored by the verifier; accuracy is the mean of the accuracy source."""

from __future__ import annotations

import asyncio


async def greedy_accuracy(ctx, prompts=None) -> dict[str, float]:
    """Greedy accuracy on the held-out split, spread over the generator replicas."""
    gen, ver = ctx.pools["generator"], ctx.pools["verifier"]
    chunks = ctx.split(ctx.prompts.eval if prompts is None else prompts, len(gen.replicas))

    async def one(chunk):
        table, _ = await gen.call("generate", chunk, greedy=True, versioned=True)
        return await ver.call("evaluate", table, table=False)

    results = await asyncio.gather(*[one(c) for c in chunks])
    n = sum(r["samples"] for r in results)
    out = {"eval/accuracy": sum(r["accuracy"] * r["samples"] for r in results) / n}
    for key in sorted({k for r in results for k in r if k.startswith("errors/")}):
        out[f"eval/{key}"] = sum(r.get(key, 0) for r in results)
    return out
