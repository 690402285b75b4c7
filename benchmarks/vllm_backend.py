"""vLLM backend against bare vLLM and the HF backend: generation tokens/s and in-place update time.

Interleaved: each round runs every contender once on the same prompts and sampling settings, so
machine load drifts hit them alike; reports medians over rounds. Per model size (random-init tiny
configs): the HF backend, coevo's vLLM backend, bare `vllm.LLM.generate` on the engine the backend
built (same weights, same SamplingParams: the backend's own overhead is the ratio), and the time of
one in-place weight update (`VLLMBackend.load_weights`).

    /work/vllm-venv/bin/python benchmarks/vllm_backend.py                     # tiny + ~25M, 3 rounds
    /work/vllm-venv/bin/python benchmarks/vllm_backend.py --sizes tiny 25m 125m --rounds 5

Writes benchmarks/results/raw/vllm_backend[_<label>].json and its section of the summary
benchmarks/results/vllm_backend.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from summary import raw_path, write as write_summary  # noqa: E402

SIZES = {  # random-init Qwen2-style configs on the char tokenizer
    "tiny": dict(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=512),
    "25m": dict(hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, intermediate_size=1536),
    "125m": dict(hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=4, intermediate_size=3072),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["tiny", "25m"], choices=sorted(SIZES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--label", default="")
    args = parser.parse_args()

    import torch

    from actors import modeling
    from actors.generation.hf import HFBackend
    from actors.generation.vllm import VLLMBackend
    from actors.weights import export_state

    torch.set_num_threads(args.threads)
    tok = modeling.char_tokenizer()
    prompts = [f"{a}+{b}=" for a, b in zip(range(10, 10 + args.prompts), range(50, 50 + args.prompts))]
    results = {"args": vars(args), "sizes": {}}
    for size in args.sizes:
        hf = HFBackend(modeling.tiny_model(tok, seed=0, init_std=0.08, **SIZES[size]), tok)
        params = sum(p.numel() for p in hf.model.parameters())
        vllm_backend = VLLMBackend(modeling.tiny_model(tok, seed=0, init_std=0.08, **SIZES[size]), tok)
        payload = export_state(hf.model, 1)
        rows = {k: [] for k in ("hf", "vllm_backend", "vllm_bare")}
        updates = []
        for mode in ("greedy", "sampled"):
            greedy = mode == "greedy"
            kw = dict(n=1 if greedy else args.n, max_new_tokens=args.max_new_tokens, temperature=1.0,
                      top_p=1.0, top_k=0, greedy=greedy)
            bare_prompts, bare_params = _bare_request(vllm_backend, prompts, **kw)
            for r in range(args.rounds):
                for name in rows:
                    start = time.perf_counter()
                    if name == "vllm_bare":
                        outs = vllm_backend.engine.llm.generate(bare_prompts, bare_params, use_tqdm=False)
                        tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
                    else:
                        backend = hf if name == "hf" else vllm_backend
                        tokens = int(backend.generate(prompts, **kw).response_lengths.sum())
                    rows[name].append({"mode": mode, "round": r, "tokens": tokens,
                                       "tokens_per_s": tokens / (time.perf_counter() - start)})
                start = time.perf_counter()
                vllm_backend.load_weights(payload, 1)
                updates.append(time.perf_counter() - start)
        summary = {}
        for mode in ("greedy", "sampled"):
            med = {k: statistics.median(x["tokens_per_s"] for x in v if x["mode"] == mode) for k, v in rows.items()}
            summary[mode] = {**{f"{k}_tokens_per_s": round(m, 1) for k, m in med.items()},
                             "backend_over_bare": round(med["vllm_backend"] / med["vllm_bare"], 3),
                             "vllm_over_hf": round(med["vllm_backend"] / med["hf"], 3)}
        summary["update_s_median"] = round(statistics.median(updates), 4)
        results["sizes"][size] = {"parameters": params, "summary": summary, "raw": rows, "update_s": updates}
        print(f"{size} ({params / 1e6:.1f}M params): {json.dumps(summary)}", flush=True)
        del vllm_backend
    out = raw_path(f"vllm_backend{'_' + args.label if args.label else ''}.json")
    out.write_text(json.dumps(results, indent=1))
    summary = write_summary("vllm_backend", out.stem, table(results), raw=[out], protocol=(
        f"{args.rounds} interleaved rounds, {args.prompts} prompts, n={args.n} when sampled, {args.max_new_tokens} new "
        f"tokens, {args.threads} torch thread(s)"))
    print(f"wrote {out} and {summary}")


def table(results: dict) -> str:
    """Per size and mode: medians over rounds (a results file's `sizes`)."""
    lines = ["| model (random init) | mode | HF tok/s | vLLM backend tok/s | bare vLLM tok/s | backend / bare | vLLM / HF "
             "| in-place update s |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for size, r in results["sizes"].items():
        for mode in ("greedy", "sampled"):
            s = r["summary"].get(mode)
            if s:
                lines.append(f"| {size}, {r['parameters'] / 1e6:.1f}M params | {mode} | {s['hf_tokens_per_s']:.0f} | "
                             f"{s['vllm_backend_tokens_per_s']:.0f} | {s['vllm_bare_tokens_per_s']:.0f} | "
                             f"{s['backend_over_bare']:.2f} | {s['vllm_over_hf']:.2f} | "
                             f"{r['summary']['update_s_median'] if mode == 'greedy' else ''} |")
    return "\n".join(lines)


def _bare_request(backend, prompts, n, max_new_tokens, temperature, top_p, top_k, greedy):
    """The request the backend sends, built once outside it (tokenised prompts, SamplingParams)."""
    ids = backend.tokenizer(prompts, add_special_tokens=False)["input_ids"]
    return backend.engine.request(ids, n, max_new_tokens, temperature, top_p, top_k, greedy,
                                  backend.eos_ids, seed=0)


if __name__ == "__main__":
    main()
