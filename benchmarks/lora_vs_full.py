"""LoRA against full fine-tuning on the same model: memory and step time of the policy learner.

One fresh process per (seed, mode), interleaved (for each seed, full then LoRA), so that a change of
the machine's load hits both alike. Each builds a Qwen2-style model of the size given (default about
30M parameters, where the optimizer's state is hundreds of MB on a CPU), makes one GRPO batch of
random token ids (behaviour log-probs recomputed by the learner itself, so ratios are 1) and takes
`--steps` RL steps after one warm-up step. It records the median step time, the peak resident memory
of the process, and exactly what each mode holds for training: trainable parameters, their
gradients and AdamW's state (two fp32 moments per trained parameter).

    python benchmarks/lora_vs_full.py                       # seeds 0-2, 5 timed steps each
    python benchmarks/lora_vs_full.py --hidden 256 --layers 4 --seeds 0
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from summary import dict_table, raw_path, write as write_summary  # noqa: E402


def config(mode: str, args) -> dict:
    heads = max(1, args.hidden // 64)
    learner = {"packing": "off", **({"lora": {"r": args.r, "alpha": 2 * args.r}} if mode == "lora" else {})}
    return {"seed": 0, "model": {"tiny": {"hidden_size": args.hidden, "num_layers": args.layers, "num_heads": heads,
                                          "num_kv_heads": max(1, heads // 2), "intermediate_size": args.hidden * 11 // 4}},
            "rollout": {"prompts_per_step": args.prompts, "samples_per_prompt": 8, "max_new_tokens": args.response},
            "algorithm": {"lr": 1e-4, "advantage": "grpo", "skip_uniform_groups": False, "micro_batch_size": 64},
            "learner": learner, "train": {"threads": args.threads}}


def batch(learner, args, seed: int):
    """prompts x 8 rows of random tokens, rewards 0/1, behaviour log-probs from the learner itself."""
    import numpy as np
    import pyarrow as pa
    import torch

    from actors import batch as B

    rng = np.random.default_rng(seed)
    n, vocab = args.prompts * 8, len(learner.tokenizer)
    prompt = rng.integers(3, vocab, (args.prompts, args.prompt)).repeat(8, axis=0)
    response = rng.integers(3, vocab, (n, args.response))
    lengths = np.full(n, args.response)
    table = B.rollout_table(
        uid=[str(i) for i in range(n)], group_id=[str(i // 8) for i in range(n)],
        prompt_id=[str(i // 8) for i in range(n)], prompt=[""] * n, response=[""] * n,
        prompt_ids=B.list_column(prompt.reshape(-1), np.full(n, args.prompt), pa.int32()),
        response_ids=B.list_column(response.reshape(-1), lengths, pa.int32()),
        behavior_logprobs=B.list_column(np.zeros(n * args.response, np.float32), lengths, pa.float32()),
        policy_version=0, finish_reason=["length"] * n)
    ids, mask, positions, r_ids, r_mask, p_width = learner._sequences(table)
    with torch.no_grad():
        lp = learner._token_logprobs(learner.model, ids, mask, positions, r_ids, p_width)
    table = table.set_column(table.schema.get_field_index("behavior_logprobs"), "behavior_logprobs",
                             B.list_column(lp.numpy().reshape(-1).astype(np.float32), lengths, pa.float32()))
    rewards = rng.integers(0, 2, n).astype(np.float32)
    return table.append_column("reward.integer_match", pa.array(rewards, pa.float32()))


def child(mode: str, seed: int, args) -> dict:
    """One measurement, in this (fresh) process."""
    import torch

    from actors import lora
    from actors.learner import Learner
    from orchestrator.config import validate_config

    cfg = validate_config(config(mode, args))
    learner = Learner(cfg, objectives=["policy_gradient"])
    table = batch(learner, args, seed)
    trained = learner.trained_parameters()
    total = sum(p.numel() for p in learner.model.parameters()
                if not (learner.lora and any(p is a for a in lora.adapter_parameters(learner.model))))
    n_trained = sum(p.numel() for p in trained)
    learner.train_step(table)  # warm-up: allocations, the optimizer's state
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        learner.train_step(table)
        times.append(time.perf_counter() - t0)
    state = learner.optimizer.state_dict()["state"]
    opt_bytes = sum(t.numel() * t.element_size() for s in state.values() for t in s.values() if torch.is_tensor(t))
    grad_bytes = sum(p.numel() * p.element_size() for p in trained)
    return {"mode": mode, "seed": seed, "base_params_M": total / 1e6, "trained_params_M": n_trained / 1e6,
            "step_s": statistics.median(times), "step_s_all": times,
            "optimizer_state_MB": opt_bytes / 2**20, "grads_MB": grad_bytes / 2**20,
            "peak_rss_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def spread(values: list[float], fmt: str = "{:.3g}") -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--prompts", type=int, default=8, help="prompt groups of 8 samples per step")
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    p.add_argument("--response", type=int, default=64, help="response tokens")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--child", nargs=2, metavar=("MODE", "SEED"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args)))
        return 0
    runs = []
    passthrough = [f"--{k}={getattr(args, k)}" for k in ("hidden", "layers", "r", "prompts", "prompt", "response",
                                                         "steps", "threads")]
    for seed in (int(s) for s in args.seeds.split(",")):
        for mode in ("full", "lora"):
            out = subprocess.run([sys.executable, __file__, *passthrough, "--child", mode, str(seed)],
                                 capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            r = runs[-1]
            print(f"[{mode} seed {seed}] step {r['step_s']:.3f} s, peak RSS {r['peak_rss_MB']:.0f} MB, "
                  f"optimizer {r['optimizer_state_MB']:.1f} MB", file=sys.stderr, flush=True)
    rows = []
    for mode in ("full", "lora"):
        mine = [r for r in runs if r["mode"] == mode]
        rows.append({"mode": mode, "params (M)": f"{mine[0]['base_params_M']:.1f}",
                     "trained (M)": f"{mine[0]['trained_params_M']:.2f}",
                     "step s, median (range)": spread([r["step_s"] for r in mine]),
                     "peak RSS MB": spread([r["peak_rss_MB"] for r in mine], "{:.0f}"),
                     "grads MB": f"{mine[0]['grads_MB']:.1f}", "AdamW state MB": f"{mine[0]['optimizer_state_MB']:.1f}"})
    full = {r["seed"]: r for r in runs if r["mode"] == "full"}
    ratios = [r["step_s"] / full[r["seed"]]["step_s"] for r in runs if r["mode"] == "lora"]
    md = dict_table(rows) + f"\n\nLoRA step time / full, per seed: {', '.join(f'{x:.2f}' for x in ratios)}"
    print(md)
    raw = raw_path("lora_vs_full.json")
    raw.write_text(json.dumps({"argv": sys.argv[1:], "runs": runs}, indent=1))
    write_summary("lora_vs_full", f"hidden{args.hidden}-layers{args.layers}-r{args.r}", md, raw=[raw], protocol=(
        f"one process per (seed, mode), interleaved; {args.prompts}x8 rows of {args.prompt}+{args.response} random "
        f"tokens, one GRPO step to warm up then the median of {args.steps}; {args.threads} torch threads; padded "
        "micro-batches (learner.packing=off, the CPU default)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
