"""Learner throughput (issue 17): coevo's RL step against a bare torch loop, and 1 rank against 2.

1. `coevo` vs `bare`, in one process, alternating step by step on the same synthetic GRPO batch:
   two copies of the same random-init Qwen2 model (actors/modeling.py), the same AdamW
   (actors.trainable.adamw), the same micro-batches, PPO-clip token-mean loss, grad clip 1.0.
   `bare` is the loop a user would write over padded tensors handed over by their generator; like
   coevo it runs each prompt once per group and shares its KV cache with the group's responses
   (the same work). coevo gets the Arrow table, so its whole data path (validation, padding,
   advantages, metrics) counts against it. `bare_full` (optional) runs prompt+response for every
   row, the loop without the shared-prompt trick. The first step's loss and gradient norm are
   printed for each: from the same weights the same maths agrees to float rounding.
2. `1x2` (1 rank, 2 torch threads) vs `2x1` (2 ranks of 1 thread, ddp over gloo on 127.0.0.1),
   the same global batch, run as in tests/test_learner_ranks.py (spawned processes, no Ray). The
   all-reduce of the gradients is timed per update.

Learner tokens/s = response tokens trained per second of `train_step` wall time.

    python benchmarks/learner_throughput.py                 # both parts, seeds 0-2, a few minutes
    python benchmarks/learner_throughput.py --part ranks --steps 3
    python benchmarks/learner_throughput.py --device cuda --preset 0.5b --strategy fsdp2 --ranks 8 --mixed-precision bf16

Writes benchmarks/results/raw/learner_throughput[_<label>].json and its section of the summary
benchmarks/results/learner_throughput.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "benchmarks"))  # summary.py

from actors import batch as B  # noqa: E402
from actors.distributed import Ranks, free_port  # noqa: E402
from actors.modeling import cache_kwargs, output_cache  # noqa: E402
from orchestrator.config import validate_config  # noqa: E402
from orchestrator.credit import Credit  # noqa: E402
from summary import raw_path, write as write_summary  # noqa: E402

# random-init Qwen2 shapes (the char tokenizer's ~100-token vocabulary, tied embeddings)
PRESETS = {
    "tiny": {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64},
    "4m": {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 1024},
    "0.5b": {"hidden_size": 1024, "num_layers": 32, "num_heads": 16, "num_kv_heads": 4, "intermediate_size": 4096},
}


def config_dict(args, seed: int, threads: int) -> dict:
    return {"seed": seed, "model": {"tiny": {"arch": "qwen2", **PRESETS[args.preset]}},
            "rollout": {"prompts_per_step": args.prompts, "samples_per_prompt": args.samples},
            "algorithm": {"lr": 1e-5, "micro_batch_size": args.micro_batch, "grad_clip": 1.0},
            "learner": {"strategy": args.strategy, "mixed_precision": args.mixed_precision},
            "train": {"threads": threads}}


# ---- the batch -------------------------------------------------------------------------------------
def synthetic_table(model, seed: int, prompts: int, samples: int, vocab: int, device: str) -> pa.Table:
    """A GRPO batch: `prompts` x `samples` rows, prompts of 16-32 tokens, responses of 32-64, random
    token ids, 0/1 rewards with both values in every group (no group is skipped), and behaviour
    log-probs from the model itself (the first step is on-policy, as after generation)."""
    rng = np.random.default_rng(seed)
    p_len = np.repeat(rng.integers(16, 33, prompts), samples)
    r_len = rng.integers(32, 65, prompts * samples)
    p_tok = np.repeat([rng.integers(3, vocab, 32) for _ in range(prompts)], samples, axis=0)
    flat_p = np.concatenate([p_tok[i, :n] for i, n in enumerate(p_len)]).astype(np.int32)
    flat_r = rng.integers(3, vocab, int(r_len.sum())).astype(np.int32)
    n = prompts * samples
    rewards = rng.integers(0, 2, n).astype(np.float32)
    rewards[::samples], rewards[1::samples] = 1.0, 0.0
    pid = [f"p{i // samples}" for i in range(n)]
    lp_placeholder = B.list_column(np.zeros(len(flat_r), np.float32), r_len, pa.float32())
    table = B.rollout_table(uid=[f"u{seed}-{i}" for i in range(n)], prompt_id=pid, prompt=["?"] * n,
                            response=["?"] * n, prompt_ids=B.list_column(flat_p, p_len, pa.int32()),
                            response_ids=B.list_column(flat_r, r_len, pa.int32()),
                            behavior_logprobs=lp_placeholder, policy_version=0, finish_reason=["length"] * n)
    t = tensors(table, samples)
    with torch.no_grad():
        lp = torch.cat([bare_logprobs(model, t, mb, samples, device) for mb in torch.arange(n).split(64)]).cpu()
    table = B.replace_column(table, "behavior_logprobs", B.from_padded(lp, t["r_len"], pa.float32()))
    return table.append_column(B.REWARD_PREFIX + "integer_match", pa.array(rewards, pa.float32()))


def tensors(table: pa.Table, samples: int) -> dict:
    """The batch as a user's generator hands it over: left-padded prompts, right-padded responses."""
    p_ids, p_len = B.to_padded(table.column("prompt_ids"), 0, torch.long, left=True)
    r_ids, r_len = B.to_padded(table.column("response_ids"), 0, torch.long)
    old_lp, _ = B.to_padded(table.column("behavior_logprobs"), 0.0, torch.float32)
    p_mask = torch.arange(p_ids.shape[1]) >= (p_ids.shape[1] - p_len)[:, None]
    r_mask = torch.arange(r_ids.shape[1]) < r_len[:, None]
    reward = torch.tensor(table.column("reward.integer_match").to_numpy()) \
        if "reward.integer_match" in table.schema.names else None
    return dict(p_ids=p_ids, p_mask=p_mask, r_ids=r_ids, r_mask=r_mask, r_len=r_len, old_lp=old_lp,
                reward=reward, samples=samples)


# ---- the bare torch loop -----------------------------------------------------------------------------
def bare_logprobs(model, t: dict, mb: torch.Tensor, samples: int, device: str, share: bool = True):
    """Token log-probs of the responses of rows `mb` (whole groups of `samples` rows in order)."""
    p_ids, p_mask = t["p_ids"][mb].to(device), t["p_mask"][mb].to(device)
    r_ids, r_mask = t["r_ids"][mb].to(device), t["r_mask"][mb].to(device)
    mask = torch.cat([p_mask, r_mask], 1).long()
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    width = p_ids.shape[1]
    if share:  # each prompt once; its KV cache repeated for the group's responses
        first = slice(None, None, samples)
        out = model(input_ids=p_ids[first], attention_mask=mask[first, :width], position_ids=pos[first, :width],
                    use_cache=True)
        cache = output_cache(out)
        cache.batch_repeat_interleave(samples)
        rest = model(input_ids=r_ids[:, :-1], attention_mask=mask[:, :-1], position_ids=pos[:, width:-1],
                     **cache_kwargs(model, cache)).logits
        logits = torch.cat([out.logits[:, -1:].repeat_interleave(samples, 0), rest], 1)
    else:
        ids = torch.cat([p_ids, r_ids], 1)
        logits = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=pos[:, :-1]).logits
        logits = logits[:, width - 1:]
    return torch.log_softmax(logits.float(), -1).gather(-1, r_ids.unsqueeze(-1)).squeeze(-1)


def bare_step(model, optimizer, t: dict, micro_batch: int, device: str, share: bool = True) -> tuple[float, float]:
    """One GRPO update: group-normalised advantages, PPO-clip token-mean loss, clip, AdamW step."""
    s = t["samples"]
    r = t["reward"].view(-1, s)
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
    tokens = t["r_mask"].sum()
    optimizer.zero_grad()
    total = 0.0
    for mb in torch.arange(len(adv)).split(micro_batch):
        logp = bare_logprobs(model, t, mb, s, device, share)
        m = t["r_mask"][mb].to(device)
        a = adv[mb].to(device)[:, None]
        ratio = torch.exp(logp - t["old_lp"][mb].to(device))
        loss = -torch.minimum(ratio * a, ratio.clamp(0.8, 1.2) * a)
        loss = (loss * m).sum() / tokens
        loss.backward()
        total += loss.item()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
    optimizer.step()
    return total, float(norm)


# ---- part 1: coevo against bare torch, one process ---------------------------------------------------
def part_overhead(args) -> dict:
    from actors import modeling
    from actors.learner import Learner
    from actors.trainable import adamw

    variants = args.variants.split(",")
    runs = []
    for seed in args.seeds:
        config = validate_config(config_dict(args, seed, args.threads))
        role = {"threads": args.threads, "num_gpus": 1 if args.device == "cuda" else 0}
        learner = Learner(config, None, role=role, objectives=["policy_gradient"])
        models, optims = {}, {}
        for v in variants:
            if v != "coevo":
                models[v] = modeling.build(config.model, seed)[0].to(learner.device).train()
                optims[v] = adamw(models[v].parameters(), lr=config.algorithm.lr,
                                  weight_decay=config.algorithm.weight_decay)
        vocab = len(learner.tokenizer)
        table = synthetic_table(learner.model, seed, args.prompts, args.samples, vocab, learner.device)
        table, _ = Credit(config).apply(table)  # the loop's credit step (on the driver): the advantages
        t = tensors(table, args.samples)
        n_tokens = int(t["r_len"].sum())
        times = {v: [] for v in variants}
        first, cpu_s = {}, {v: [] for v in variants}
        for step in range(args.warmup + args.steps):
            order = variants if step % 2 == 0 else variants[::-1]  # neither always runs first
            for v in order:
                sync(learner.device)
                start, cpu = time.perf_counter(), time.process_time()
                if v == "coevo":
                    m = learner.train_step(table)
                    first["coevo"] = first.get("coevo") or (m["train/loss"], m["train/grad_norm"])
                else:
                    done = bare_step(models[v], optims[v], t, args.micro_batch, learner.device, share=v == "bare")
                    first[v] = first.get(v) or done
                sync(learner.device)
                if step >= args.warmup:
                    times[v].append(time.perf_counter() - start)
                    cpu_s[v].append(time.process_time() - cpu)
        # the first step starts from the same weights: the same maths gives the same loss and norm
        print(f"seed {seed}: step 1 (loss, grad norm) " + ", ".join(f"{v} ({a:.6f}, {b:.6f})"
                                                                     for v, (a, b) in first.items()), flush=True)
        run = {"seed": seed, "response_tokens": n_tokens, "step1_loss_grad_norm": first, "load": os.getloadavg()[0],
               "step_s": times, "cpu_s": cpu_s,
               "tokens_per_s": {v: n_tokens / statistics.median(ts) for v, ts in times.items()}}
        run["ratio_coevo_bare"] = run["tokens_per_s"]["coevo"] / run["tokens_per_s"]["bare"]
        # neighbouring steps see about the same load: the median of their ratios is steadier
        run["paired_ratio"] = statistics.median(b / c for b, c in zip(times["bare"], times["coevo"]))
        run["cpu_ratio"] = statistics.median(cpu_s["bare"]) / statistics.median(cpu_s["coevo"])
        runs.append(run)
        print(f"seed {seed}: " + ", ".join(f"{v} {run['tokens_per_s'][v]:.0f} tok/s" for v in variants)
              + f", coevo/bare {run['ratio_coevo_bare']:.3f} (paired {run['paired_ratio']:.3f}, "
              f"CPU time {run['cpu_ratio']:.3f}); load {os.getloadavg()[0]:.1f}", flush=True)
        del learner, models, optims
    ratios = [r["ratio_coevo_bare"] for r in runs]
    summary = {v: spread([r["tokens_per_s"][v] for r in runs]) for v in variants}
    summary["ratio_coevo_bare"] = spread(ratios)
    summary["paired_ratio"] = spread([r["paired_ratio"] for r in runs])
    summary["cpu_ratio"] = spread([r["cpu_ratio"] for r in runs])
    return {"runs": runs, "summary": summary}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ---- part 2: 1 rank x 2 threads against 2 ranks x 1 thread ------------------------------------------------
def _rank(rank: int, world: int, threads: int, cfg: dict, table_path: str, port: int, out: str,
          warmup: int, steps: int, device: str) -> None:
    if device == "cuda":  # one GPU per rank, chosen before CUDA starts in this process
        os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    from actors.learner import Learner

    reduce_s = []
    average = Ranks._average

    def timed_average(self, grads):  # the gradient all-reduce (ddp), timed where it is called
        start = time.perf_counter()
        average(self, grads)
        reduce_s.append(time.perf_counter() - start)

    Ranks._average = timed_average
    role = {"rank": rank, "world_size": world, "threads": threads, "num_gpus": 1 if device == "cuda" else 0}
    learner = Learner(validate_config(cfg), None, role=role, objectives=["policy_gradient"])
    if world > 1:
        learner.init_distributed("127.0.0.1", port)
    table = feather.read_table(table_path)
    step_s, cpu_s = [], []
    for step in range(warmup + steps):
        learner.ranks.barrier()
        sync(learner.device)
        start, cpu = time.perf_counter(), time.process_time()
        learner.train_step(table)
        sync(learner.device)
        if step >= warmup:
            step_s.append(time.perf_counter() - start)
            cpu_s.append(time.process_time() - cpu)
    if rank == 0:
        json.dump({"step_s": step_s, "cpu_s": cpu_s, "allreduce_s": reduce_s[warmup:]}, open(out, "w"))
    learner.ranks.close()


def part_ranks(args) -> dict:
    import torch.multiprocessing as mp

    from actors import modeling

    layouts = [(1, args.threads), (args.ranks, max(args.threads // args.ranks, 1))]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            cfg = config_dict(args, seed, 1)
            config = validate_config(cfg)
            model, tok = modeling.build(config.model, seed)
            table = synthetic_table(model.to(args.device), seed, args.prompts, args.samples, len(tok), args.device)
            table, _ = Credit(config).apply(table)  # the loop's credit step (on the driver): the advantages
            del model
            if args.device == "cuda":
                torch.cuda.empty_cache()  # the ranks need the memory
            path = f"{tmp}/batch{seed}.arrow"
            feather.write_feather(table, path)
            n_tokens = int(sum(len(x) for x in table.column("response_ids").to_pylist()))
            for world, threads in layouts:
                out = f"{tmp}/out.json"
                mp.start_processes(_rank, args=(world, threads, cfg, path, free_port(), out, args.warmup,
                                                args.steps, args.device), nprocs=world, join=True,
                                   start_method="spawn")
                res = json.load(open(out))
                name = f"{world}x{threads}"
                step = statistics.median(res["step_s"])
                run = {"seed": seed, "layout": name, "response_tokens": n_tokens, "step_s": res["step_s"],
                       "rank0_cpu_s": res["cpu_s"], "load": os.getloadavg()[0],
                       "tokens_per_s": n_tokens / step, "allreduce_s": res["allreduce_s"],
                       "allreduce_median_s": statistics.median(res["allreduce_s"]) if res["allreduce_s"] else 0.0}
                runs.append(run)
                print(f"seed {seed} {name}: {run['tokens_per_s']:.0f} tok/s, step {step:.2f} s, "
                      f"all-reduce {run['allreduce_median_s'] * 1e3:.1f} ms/update; load {os.getloadavg()[0]:.1f}", flush=True)
    names = [f"{w}x{t}" for w, t in layouts]
    summary = {n: {"tokens_per_s": spread([r["tokens_per_s"] for r in runs if r["layout"] == n]),
                   "allreduce_s": spread([r["allreduce_median_s"] for r in runs if r["layout"] == n])}
               for n in names}
    return {"runs": runs, "summary": summary}


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def params(preset: str) -> int:
    from actors import modeling

    config = validate_config({"model": {"tiny": {"arch": "qwen2", **PRESETS[preset]}}})
    return sum(p.numel() for p in modeling.build(config.model, 0)[0].parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["overhead", "ranks", "both"], default="both")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="4m")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=32, help="rows per forward/backward (whole groups)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant and seed")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the 1-rank runs")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--strategy", choices=["ddp", "fsdp2"], default="ddp")
    parser.add_argument("--variants", default="bare,coevo", help="part 1: any of bare,coevo,bare_full")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--mixed-precision", choices=["bf16", "fp16"], default=None,
                        help="fsdp2 on GPU: the ranks' compute dtype (learner.mixed_precision)")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="for MFU on cuda (H100 bf16 dense)")
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    if args.micro_batch % args.samples:
        parser.error(f"--micro-batch {args.micro_batch} must be a multiple of --samples {args.samples} "
                     "(micro-batches of whole groups)")
    if "bare" not in args.variants.split(",") or "coevo" not in args.variants.split(","):
        parser.error(f"--variants {args.variants!r} must include bare and coevo")
    out = {"machine": machine(args.device), "load_before": os.getloadavg(), "model_params": params(args.preset),
           "args": vars(args)}
    print(f"{out['machine']}; {out['model_params'] / 1e6:.1f}M params; load {out['load_before']}", flush=True)
    if args.part in ("overhead", "both"):
        out["overhead"] = part_overhead(args)
    if args.part in ("ranks", "both"):
        out["ranks"] = part_ranks(args)
    out["load_after"] = os.getloadavg()
    if args.device == "cuda":  # 6 N per token trained (forward + backward); prompts counted once per group
        out["mfu_note"] = "MFU = 6 * params * response tokens/s / (GPUs * peak); shared prompt tokens not counted"
        flops = 6 * out["model_params"] / (args.peak_tflops * 1e12)
        for v, s in out.get("overhead", {}).get("summary", {}).items():
            if "ratio" not in v:
                s["mfu"] = flops * s["median"]
        for layout, s in out.get("ranks", {}).get("summary", {}).items():
            s["mfu"] = flops * s["tokens_per_s"]["median"] / int(layout.split("x")[0])
    path = raw_path("learner_throughput" + (f"_{args.label}" if args.label else "") + ".json")
    path.write_text(json.dumps(out, indent=1))
    summary = write_summary("learner_throughput", path.stem, table(out), raw=[path], protocol=(
        f"preset {args.preset} ({out['model_params'] / 1e6:.3g}M params), {args.prompts} prompts x {args.samples} samples, "
        f"micro-batch {args.micro_batch}, {args.warmup} untimed + {args.steps} timed steps, seeds {args.seeds}, "
        f"{args.threads} threads (1 rank), {args.ranks} ranks ({args.strategy}), {args.device}"))
    print(json.dumps({k: v["summary"] for k, v in out.items() if isinstance(v, dict) and "summary" in v}, indent=1))
    print(f"load after {out['load_after']}; wrote {path} and {summary}")


def table(out: dict) -> str:
    """The summary's tables from a results file: per seed, then the median (range) over seeds."""
    lines, f = [], lambda s, fmt="{:.0f}": f"{fmt.format(s['median'])} ({fmt.format(s['min'])}-{fmt.format(s['max'])})"  # noqa: E731
    if "overhead" in out:
        variants = list(out["overhead"]["runs"][0]["tokens_per_s"])
        lines += ["| seed | load (1 min) | " + " | ".join(f"{v} tok/s" for v in variants) +
                  " | coevo / bare | paired steps | CPU time |", "|---:" * (5 + len(variants)) + "|"]
        for r in out["overhead"]["runs"]:
            load = f"{r['load']:.1f}" if "load" in r else "-"
            lines.append(f"| {r['seed']} | {load} | " +
                         " | ".join(f"{r['tokens_per_s'][v]:.0f}" for v in variants) +
                         f" | {r['ratio_coevo_bare']:.3f} | {r['paired_ratio']:.3f} | {r['cpu_ratio']:.3f} |")
        s = out["overhead"]["summary"]
        lines.append("| median (range) | | " + " | ".join(f(s[v]) for v in variants) + " | " +
                     " | ".join(f(s[k], "{:.3f}") for k in ("ratio_coevo_bare", "paired_ratio", "cpu_ratio")) + " |")
        lines += [f"- {v}: MFU {s[v]['mfu']:.1%}" for v in variants if "mfu" in s[v]]
    if "ranks" in out:
        lines += ["", "| seed | layout (ranks x threads) | tok/s | step s | all-reduce ms/update | load (1 min) |",
                  "|---:|---|---:|---:|---:|---:|"]
        lines += [f"| {r['seed']} | {r['layout']} | {r['tokens_per_s']:.0f} | {statistics.median(r['step_s']):.2f} | "
                  f"{1e3 * r['allreduce_median_s']:.1f} | {r['load']:.1f} |" for r in out["ranks"]["runs"]]
        lines += [f"- {n}: MFU {s['mfu']:.1%}" for n, s in out["ranks"]["summary"].items() if "mfu" in s]
    return "\n".join(lines)


def machine(device: str) -> str:
    if device == "cuda":
        return f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}, torch {torch.__version__}"
    return f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), torch {torch.__version__}"


if __name__ == "__main__":
    main()
