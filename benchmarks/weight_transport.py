"""Publish time of the two weight transports (docs/weights.md) against model size and generator count.

Publish time: from the driver's `Channel.publish(version)` call to every replica holding the version
(strict on-policy: `wait=True`), through the real `Channel`/`Pool` code. The learner is a `Trainable`
holding a random-init Qwen2 model (its state dict is what both transports send: `full_state()`);
each replica holds a model of the same config and installs through `actors.weights.load_state`
(object store) or `actors.weight_transport` (collective), as the generators do. One torch thread
per actor. For every (size, replicas) cell the transports are interleaved, repeats 0..R-1, after
one unmeasured publish each (the collective's first publish also forms its group: reported apart).

    python benchmarks/weight_transport.py                       # the full grid (skips cells that do not fit)
    python benchmarks/weight_transport.py --sizes 1M 25M --replicas 1 2
    python benchmarks/weight_transport.py --table benchmarks/results/raw/weight_transport.json

Writes benchmarks/results/raw/weight_transport[_<label>].json and the table to its section of the summary
benchmarks/results/weight_transport.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from actors.trainable import Trainable  # noqa: E402
from actors.weight_transport import Endpoint  # noqa: E402

MODULE = "benchmarks.weight_transport"  # how actors import this file (it may run as __main__)

# Qwen2 shapes (tied embeddings) of about 1M, 25M, 125M and 500M parameters; 500M is Qwen2-0.5B's.
SIZES = {
    "1M": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=512, vocab_size=1024),
    "25M": dict(hidden_size=512, num_hidden_layers=7, num_attention_heads=8, num_key_value_heads=2,
                intermediate_size=1536, vocab_size=8192),
    "125M": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
                 intermediate_size=3072, vocab_size=32000),
    "500M": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936),
}
TRANSPORTS = ("object_store", "collective")


def qwen2(size: str, materialize: bool):
    """The model; replicas skip the random init (their values are overwritten by the first publish)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(tie_word_embeddings=True, **SIZES[size])
    if materialize:
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.to_empty(device="cpu")


class BenchLearner(Trainable):
    """A learner as far as publishing goes: a Trainable with a model and a version."""

    def __init__(self, config, role=None):
        import torch

        from actors.distributed import Ranks

        torch.set_num_threads(1)
        self.model, self.version, self.device = qwen2(config.size, True), 0, "cpu"
        self.weights_endpoint, self.ranks = Endpoint(), Ranks()

    def set_version(self, version: int) -> int:
        self.version = version
        return version


class BenchReplica:
    """A generator as far as weights go: `update_weights` and `receive_weights` as in actors.generator."""

    def __init__(self, config, role=None):
        import torch

        from actors.weight_transport import Endpoint

        torch.set_num_threads(1)
        self.model, self.version, self.endpoint = qwen2(config.size, False), 0, Endpoint()

    def ping(self) -> int:
        return self.version

    def update_weights(self, version: int, payload: dict) -> int:
        from actors.weights import load_state

        load_state(self.model, payload, version, where="bench replica")
        self.version = version
        return version

    def receive_weights(self, link, rank: int, version: int, join: bool = True) -> int:
        from actors.weight_transport import node_ip

        self.endpoint.receive(link, rank, self.model, version, "bench replica", bind=node_ip(), join=join)
        self.version = version
        return version

    def checksum(self) -> float:
        return float(sum(t.double().sum() for t in self.model.state_dict().values()))


async def cell(size: str, replicas: int, repeats: int, bucket_mb: float) -> dict:
    from orchestrator.channels import Channel
    from orchestrator.config import WeightsConfig
    from orchestrator.roles import Pool, RoleSpec

    config = SimpleNamespace(size=size, weights=WeightsConfig(bucket_mb=bucket_mb))
    learner = Pool("learner", RoleSpec(f"{MODULE}:BenchLearner", kind="learner", num_cpus=0), config)
    pool = Pool("generator", RoleSpec(f"{MODULE}:BenchReplica", kind="generator", num_cpus=0, replicas=replicas),
                config)
    await asyncio.gather(learner.ready(), pool.ready())
    channel = Channel("policy", learner, [pool])
    handle = learner.handles[0]
    times: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
    first: dict[str, float] = {}
    version = 0
    load = [os.getloadavg()[0]]
    for repeat in range(-1, repeats):  # -1: unmeasured (the collective forms its group there)
        for transport in TRANSPORTS if repeat % 2 else reversed(TRANSPORTS):
            version += 1
            await handle.set_version.remote(version)
            channel.settings = WeightsConfig(transport=transport, bucket_mb=bucket_mb)
            start = time.perf_counter()
            await channel.publish(version)
            elapsed = time.perf_counter() - start
            assert all(r.version == version for r in pool.replicas), f"{transport}: not every replica holds {version}"
            (times[transport].append(elapsed) if repeat >= 0 else first.__setitem__(transport, elapsed))
    sums = await asyncio.gather(*[h.checksum.remote() for h in pool.handles])
    assert len(set(sums)) == 1, f"replicas differ after the last publish: {sums}"
    load.append(os.getloadavg()[0])
    for p in (learner, pool):
        p.shutdown()
    await asyncio.sleep(1.0)  # let the killed actors' memory go before the next cell
    out = {"size": size, "replicas": replicas, "epochs": channel.epochs, "fallbacks": channel.fallbacks,
           "load_1min": load, "first_publish_s": first}
    for t, xs in times.items():
        out[t] = {"median_s": statistics.median(xs), "min_s": min(xs), "max_s": max(xs), "runs_s": xs}
    return out


def fits(size: str, replicas: int, budget_gb: float) -> bool:
    """Peak memory of a cell, fp32: the learner's model and its object-store copy, and per replica a
    model plus the collective's staging buffer (state-dict bytes: tied embeddings count twice)."""
    gb = {"1M": 0.005, "25M": 0.12, "125M": 0.61, "500M": 2.52}[size]
    return gb * (2 + 2 * replicas) <= budget_gb


def table(cells: list[dict]) -> str:
    """The markdown table of docs/benchmarks.md: medians (min-max) and collective / object store."""
    lines = ["| model | replicas | object_store s | collective s | collective / object_store | first collective s |",
             "|---|---:|---:|---:|---:|---:|"]
    for c in cells:
        o, k = c["object_store"], c["collective"]
        lines.append(f"| {c['size']} | {c['replicas']} | {o['median_s']:.3f} ({o['min_s']:.3f}-{o['max_s']:.3f}) | "
                     f"{k['median_s']:.3f} ({k['min_s']:.3f}-{k['max_s']:.3f}) | {k['median_s'] / o['median_s']:.2f} | "
                     f"{c['first_publish_s']['collective']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=list(SIZES))
    parser.add_argument("--replicas", nargs="+", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bucket-mb", type=float, default=256.0)
    parser.add_argument("--memory-gb", type=float, default=16.0, help="skip cells whose peak would pass this")
    parser.add_argument("--label", default="")
    parser.add_argument("--table", help="print the markdown table of a results JSON and exit")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(Path(args.table).read_text())["cells"]))
        return
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray
    import torch

    from summary import raw_path, write as write_summary  # here: actors import this module without benchmarks/ on the path

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    results, skipped = [], []
    for size in args.sizes:
        for n in args.replicas:
            if not fits(size, n, args.memory_gb):
                skipped.append({"size": size, "replicas": n, "why": f"peak over --memory-gb {args.memory_gb:g}"})
                print(f"{size:>5} x{n}: skipped (memory)", flush=True)
                continue
            r = asyncio.run(cell(size, n, args.repeats, args.bucket_mb))
            results.append(r)
            print(f"{size:>5} x{n}: object_store {r['object_store']['median_s']:.3f}s  collective "
                  f"{r['collective']['median_s']:.3f}s  (first collective {r['first_publish_s']['collective']:.3f}s, "
                  f"load {r['load_1min'][0]:.2f}-{r['load_1min'][1]:.2f})", flush=True)
    ray.shutdown()
    meta = {"machine": f"{platform.node()}: {os.cpu_count()} cores, "
                       f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, CPU only",
            "torch": torch.__version__, "ray": ray.__version__, "repeats": args.repeats, "bucket_mb": args.bucket_mb,
            "threads_per_actor": 1, "dtype": "float32", "skipped": skipped}
    out = raw_path(f"weight_transport{'_' + args.label if args.label else ''}.json")
    out.write_text(json.dumps({"meta": meta, "cells": results}, indent=1))
    print(table(results))
    summary = write_summary("weight_transport", out.stem, table(results), raw=[out], protocol=(
        f"sizes {args.sizes}, replicas {args.replicas}, {args.repeats} repeats after one unmeasured publish, "
        f"{args.bucket_mb:g} MiB buckets, 1 torch thread per actor; skipped {skipped or 'none'}"))
    print(f"wrote {out} and {summary}")


if __name__ == "__main__":
    main()
