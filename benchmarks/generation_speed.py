"""Generation speed (issue 31): coevo's HF backend against a bare transformers `model.generate` on
the same model (one object, one dtype) and batch, interleaved, seeds 0-2. Goal: coevo >= 0.95x bare.

Both sample `--prompts` x `--samples` responses of exactly `--new-tokens` tokens (no EOS: a random
model would otherwise end samples at random points in each and the two would do different work),
at temperature 1 with no truncation, so transformers adds no warper. `bare` is what a user writes:
`generate(do_sample=True, num_return_sequences=samples)` (the prompts are expanded before the
prefill). `coevo` is `HFBackend.generate`: it runs each prompt's prefill once, computes the
behaviour log-prob of every sampled token (which bare does not) and returns the flat Samples.
`coevo_dynamic` and `coevo_static` force `rollout.hf_static_cache` off or on; `coevo` is what a run
would pick (auto: static on a GPU at 64 or more new tokens, each decoding step one replayed CUDA
graph; dynamic on a CPU).
`bare_static` (optional) is bare with transformers' static KV cache, which it compiles on a GPU
(CUDA graphs); its first call compiles and is not timed.

    python benchmarks/generation_speed.py --preset cpu            # this machine: 2 quiet minutes
    python benchmarks/generation_speed.py --device cuda --preset 0.5b --out $OUT/generation.json

Prints a table (median seconds, spread, new tokens/s, coevo/bare speed ratio per seed) and writes JSON
with --out. Torch threads: --threads (1 by default on a CPU: on a shared 2-core machine two threads
spin against the other processes and the timings swing 3x).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# random-init Qwen2 shapes (the char tokenizer's ~100-token vocabulary): learner_throughput's (0.5b is
# issue 31's preset, 486.8M parameters), and cpu: the default job's model
from benchmarks.learner_throughput import PRESETS as _LEARNER_PRESETS  # noqa: E402

PRESETS = {**_LEARNER_PRESETS, "cpu": {"hidden_size": 128, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2,
                                       "intermediate_size": 512}}
# the batch each preset is measured at, unless given: (prompts, samples, new tokens)
WORKLOADS = {"tiny": (32, 8, 32), "cpu": (32, 8, 32), "4m": (16, 8, 32), "0.5b": (32, 8, 200)}


def build(preset: str, device: str, dtype: str):
    from actors import modeling
    from orchestrator.config import validate_config

    config = validate_config({"model": {"tiny": PRESETS[preset], "dtype": dtype}})
    model, tok = modeling.build(config.model, 0)
    model = model.to(device, modeling.inference_dtype(dtype, device)).eval()
    return model, tok


def prompts_for(n: int) -> list[str]:
    """Addition prompts of 4-6 characters (left-padded to one width, as a batch is)."""
    return [f"{a}+{b}=" for a, b in zip(range(3, 3 + 7 * n, 7), range(50, 50 + 3 * n, 3))]


def variants(model, tok, device: str, prompts: list[str], samples: int, new_tokens: int) -> dict:
    """name -> a function that samples the batch once and returns the number of new tokens."""
    from transformers import GenerationConfig

    from actors.generation.hf import HFBackend
    from actors.generation.static_cache import wanted

    # coevo: the backend as a run builds it (rollout.hf_static_cache auto: static and compiled on a
    # GPU, dynamic on a CPU); coevo_dynamic / coevo_static: either way, forced
    backends = {"coevo": HFBackend(model, tok, device=device, static_cache=wanted(None, device, new_tokens, False)),
                "coevo_dynamic": HFBackend(model, tok, device=device, static_cache=False),
                "coevo_static": HFBackend(model, tok, device=device, static_cache=True)}
    for backend in backends.values():
        backend.eos_ids = []  # no EOS: exactly new_tokens each
    model.generation_config.eos_token_id = None  # nor for generate, which merges the model's own settings in
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    plain = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
                 num_return_sequences=samples, pad_token_id=tok.pad_token_id, eos_token_id=None)

    def coevo(name: str) -> int:
        out = backends[name].generate(prompts, n=samples, max_new_tokens=new_tokens)
        return int(out.response_lengths.sum())

    def bare(**extra) -> int:
        with torch.no_grad():
            out = model.generate(**enc, generation_config=GenerationConfig(**plain, **extra))
        new = out[:, enc["input_ids"].shape[1]:]
        assert new.shape[1] == new_tokens, f"bare generate stopped after {new.shape[1]} of {new_tokens} tokens"
        return int(new.numel())

    return {**{name: (lambda name=name: coevo(name)) for name in backends},
            "bare": bare, "bare_static": lambda: bare(cache_implementation="static")}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(args) -> dict:
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    prompts_n, samples, new_tokens = WORKLOADS[args.preset]
    prompts_n, samples, new_tokens = args.prompts or prompts_n, args.samples or samples, args.new_tokens or new_tokens
    model, tok = build(args.preset, args.device, args.dtype)
    prompts = prompts_for(prompts_n)
    fns = variants(model, tok, args.device, prompts, samples, new_tokens)
    names = args.variants.split(",")
    first = {}
    for name in names:  # untimed: CUDA context, kernels, a static cache's compilation
        sync(args.device)
        start = time.perf_counter()
        fns[name]()
        sync(args.device)
        first[name] = time.perf_counter() - start
        print(f"first call {name:13} {first[name]:8.3f} s (untimed: kernels, compilation)", flush=True)
    runs = {name: [] for name in names}
    rounds = [(r, seed) for r in range(args.repeats) for seed in args.seeds]
    for i, (r, seed) in enumerate(rounds):
        order = names if i % 2 == 0 else names[::-1]  # neither always goes first
        for name in order:
            torch.manual_seed(seed)
            sync(args.device)
            start = time.perf_counter()
            tokens = fns[name]()
            sync(args.device)
            seconds = time.perf_counter() - start
            runs[name].append({"seed": seed, "round": r, "s": seconds, "new_tokens": tokens,
                               "tokens_per_s": tokens / seconds})
            print(f"seed {seed} {name:12} {seconds:8.3f} s  {tokens / seconds:9.0f} new tok/s", flush=True)
    summary = {name: {"median_s": statistics.median(r["s"] for r in rs), "min_s": min(r["s"] for r in rs),
                      "max_s": max(r["s"] for r in rs),
                      "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs), "first_call_s": first[name]}
               for name, rs in runs.items()}
    for mine in [n for n in names if n.startswith("coevo")]:  # each coevo variant's speed over each other
        for name in [n for n in names if n != mine and (mine == "coevo" or n.startswith("bare"))]:
            ratios = [b["s"] / c["s"] for c, b in zip(runs[mine], runs[name])]  # paired by seed and round
            summary[f"{mine}_vs_{name}"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
    params = sum(p.numel() for p in model.parameters())
    return {"preset": args.preset, "params": params, "device": args.device, "machine": machine(args.device),
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."), "threads": torch.get_num_threads(),
            "prompts": prompts_n, "samples": samples, "new_tokens": new_tokens, "seeds": args.seeds,
            "repeats": args.repeats,
            "load": os.getloadavg(), "runs": runs, "summary": summary}


def machine(device: str) -> str:
    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    model = platform.processor() or platform.machine()
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{os.cpu_count()} CPUs ({model}), torch {torch.__version__}"


def table(result: dict) -> str:
    s = result["summary"]
    head = (f"{result['preset']} ({result['params'] / 1e6:.1f}M params, {result['dtype']}) on {result['machine']}: "
            f"{result['prompts']} prompts x {result['samples']} samples x {result['new_tokens']} new tokens, "
            f"seeds {result['seeds']} x {result.get('repeats', 1)} rounds, load {result['load'][0]:.1f}")
    lines = [head, f"{'variant':14} {'median s':>9} {'min-max s':>15} {'new tok/s':>10} {'first call s':>12}"]
    for name, v in s.items():
        if "_vs_" not in name:
            lines.append(f"{name:14} {v['median_s']:9.3f} {v['min_s']:7.3f}-{v['max_s']:<7.3f} {v['tokens_per_s']:10.0f}"
                         f" {v.get('first_call_s', float('nan')):12.1f}")
    for name, v in s.items():
        if "_vs_" in name:
            lines.append(f"{name}: {v['median']:.3f}x (runs {v['min']:.3f}-{v['max']:.3f}; goal >= 0.95 against bare)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                        help="both variants' model dtype (auto: model.dtype's, bfloat16 on a GPU)")
    parser.add_argument("--prompts", type=int, default=0, help="0: the preset's workload")
    parser.add_argument("--samples", type=int, default=0)
    parser.add_argument("--new-tokens", type=int, default=0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--repeats", type=int, default=1, help="rounds over the seeds (a loaded machine needs more)")
    parser.add_argument("--variants", default="coevo,bare", help="any of coevo,coevo_dynamic,coevo_static,bare,bare_static "
                        "(coevo: as a run builds it, static and compiled on a GPU)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: 1 on a CPU, all on a GPU host)")
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args(argv)
    if args.threads is None:
        args.threads = 0 if args.device.startswith("cuda") else 1
    result = measure(args)
    print(table(result))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
