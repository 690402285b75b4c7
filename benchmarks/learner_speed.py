"""The learner's RL step against a bare packed loop, long responses (issue 30; docs/benchmarks.md).

In one process, alternating step by step on the same synthetic GRPO batch (P prompts x S samples,
prompts of 16-32 tokens, responses of RLEN-64..RLEN tokens, random tokens, 0/1 rewards that vary in
every group, behaviour log-probs from the model itself), each variant holding its own copy of the
same random-init Qwen2 model and its own AdamW:

- `coevo`: `Learner.train_step` on the Arrow table, with the config's defaults for the device
  (GPU: bf16 autocast over fp32 master weights, packed token-budget micro-batches, chunked
  log-probs; CPU: fp32, padded micro-batches sharing each group's prompt forward). Its data path
  (validation, advantages, packing, metrics) counts against it.
- `coevo_ckpt`: the same with learner.gradient_checkpointing (peak memory with and without).
- `coevo_before`: the learner as it was before issue 30 (fp32, padded, micro-batches of 64 rows).
- `bare`: the loop a user would write: the same rows packed the same way (first-fit decreasing into
  the same token budget, one sequence per micro-batch, positions restarting per row, the same
  varlen attention kernel), full-vocabulary logits, log-softmax in fp32, PPO-clip token-mean loss,
  grad clip 1.0, fused AdamW, all under bf16 autocast on a GPU (fp32 on a CPU).
- `bare_fsdp2`: the bare loop with the model wrapped by FSDP2 at one rank with
  MixedPrecisionPolicy(bf16 params, fp32 reduce) instead of autocast (GPU only; what prime-rl and
  verl do on one GPU), to choose between the two.

Reported per variant: response tokens/s and all tokens/s (prompt + response) of the timed steps
(median over steps and seeds), MFU = (6 N + attention) FLOPs x tokens/s / peak (actors.engine;
peak: learner.peak_tflops or the GPU's dense bf16 peak), peak GPU memory, step-1 loss and grad norm.

    python benchmarks/learner_speed.py --device cuda --preset 0.5b --rlen 512 --seeds 0 1 2
    python benchmarks/learner_speed.py --preset tiny --rlen 48 --prompts 4 --samples 4   # CPU proof
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from actors import attention  # noqa: E402
from actors import batch as B  # noqa: E402
from actors.engine import model_shape, peak_flops, train_flops  # noqa: E402
from actors.packing import packed_micro_batches  # noqa: E402
from orchestrator.config import validate_config  # noqa: E402
from orchestrator.credit import Credit  # noqa: E402

PRESETS = {
    "tiny": {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64},
    "25m": {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "num_kv_heads": 2, "intermediate_size": 2048},
    "0.5b": {"hidden_size": 1024, "num_layers": 32, "num_heads": 16, "num_kv_heads": 4, "intermediate_size": 4096},
}


def config(args, seed: int, **learner) -> object:
    return validate_config({
        "seed": seed, "model": {"tiny": {"arch": "qwen2", **PRESETS[args.preset]}},
        "rollout": {"prompts_per_step": args.prompts, "samples_per_prompt": args.samples,
                    "max_new_tokens": args.rlen},
        "algorithm": {"lr": 1e-5, "grad_clip": 1.0, "micro_batch_tokens": args.budget,
                      "micro_batch_size": 4096},
        "learner": learner, "train": {"threads": args.threads}})


def on(device: str):
    return torch.device(device) if device == "cuda" else contextlib.nullcontext()


def build_model(cfg, device: str) -> torch.nn.Module:
    """The model the learner builds from `cfg` (the same weights for the same seed), on `device`.
    Rotary positions are computed, so responses may pass max_position_embeddings."""
    from actors import modeling

    with on(device):
        return modeling.build(cfg.model, cfg.seed)[0].to(device)


def synthetic_table(args, seed: int, vocab: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    P, S = args.prompts, args.samples
    n = P * S
    p_len = np.repeat(rng.integers(16, 33, P), S)
    r_len = rng.integers(max(1, args.rlen - 64), args.rlen + 1, n)
    p_tok = np.repeat([rng.integers(3, vocab, 32) for _ in range(P)], S, axis=0)
    flat_p = np.concatenate([p_tok[i, :k] for i, k in enumerate(p_len)]).astype(np.int32)
    flat_r = rng.integers(3, vocab, int(r_len.sum())).astype(np.int32)
    rewards = rng.integers(0, 2, n).astype(np.float32)
    rewards[::S], rewards[1::S] = 1.0, 0.0
    lp = B.list_column(np.zeros(len(flat_r), np.float32), r_len, pa.float32())
    t = B.rollout_table(uid=[f"u{seed}-{i}" for i in range(n)], prompt_id=[f"p{i // S}" for i in range(n)],
                        prompt=["?"] * n, response=["?"] * n, prompt_ids=B.list_column(flat_p, p_len, pa.int32()),
                        response_ids=B.list_column(flat_r, r_len, pa.int32()), behavior_logprobs=lp,
                        policy_version=0, finish_reason=["length"] * n)
    return t.append_column(B.REWARD_PREFIX + "integer_match", pa.array(rewards, pa.float32()))


# ---- the bare loop ------------------------------------------------------------------------------------
def bare_inputs(table: pa.Table, S: int) -> dict:
    """Per row: prompt + response tokens as one list, its response start, the rewards' advantages."""
    prompts = table.column("prompt_ids").to_pylist()
    responses = table.column("response_ids").to_pylist()
    r = torch.tensor(table.column("reward.integer_match").to_numpy()).view(-1, S)
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).view(-1)
    return {"seqs": [p + q for p, q in zip(prompts, responses)], "p_len": [len(p) for p in prompts],
            "r_len": [len(q) for q in responses], "adv": adv, "old_lp": None}


def bare_logprobs(model, rows: list[int], x: dict, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One packed forward of `rows`: every response token's log-prob (flat) and its row's index."""
    seqs = [x["seqs"][i] for i in rows]
    lengths = torch.tensor([len(s) for s in seqs])
    ids = torch.tensor([t for s in seqs for t in s], device=device)[None]
    pos = torch.cat([torch.arange(n) for n in lengths.tolist()]).to(device)[None]
    cu = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    cu = cu.to(device)
    m = int(lengths.max())
    with attention.packed(model):
        logits = model(input_ids=ids, position_ids=pos, use_cache=False, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                       max_length_q=m, max_length_k=m).logits[0]
    starts = (lengths.cumsum(0) - lengths).tolist()
    at = torch.tensor([s + x["p_len"][i] - 1 + j for s, i in zip(starts, rows) for j in range(x["r_len"][i])],
                      device=device)
    targets = ids[0, at + 1]
    lp = torch.log_softmax(logits[at].float(), -1).gather(-1, targets[:, None]).squeeze(-1)
    row = torch.tensor([k for k, i in enumerate(rows) for _ in range(x["r_len"][i])], device=device)
    return lp, row


def bare_step(model, optimizer, x: dict, budget: int, device: str, amp: bool) -> tuple[float, float, dict]:
    lengths = torch.tensor([len(s) for s in x["seqs"]])
    parts = packed_micro_batches(torch.arange(len(lengths)), lengths, budget, 4096)
    tokens = sum(x["r_len"])
    optimizer.zero_grad()
    total, work = 0.0, {"tokens": 0, "sq": 0.0}
    cast = torch.autocast("cuda", dtype=torch.bfloat16) if amp else contextlib.nullcontext()
    for mb in parts:
        rows = mb.tolist()
        with cast:
            lp, row = bare_logprobs(model, rows, x, device)
        old = lp.detach() if x["old_lp"] is None else x["old_lp"][torch.cat([torch.tensor(x["lp_index"][i]) for i in rows])].to(device)
        a = x["adv"][torch.tensor(rows)].to(device)[row]
        ratio = torch.exp(lp - old)
        loss = -torch.minimum(ratio * a, ratio.clamp(0.8, 1.2) * a).sum() / tokens
        loss.backward()
        total += loss.item()
        work["tokens"] += int(lengths[mb].sum())
        work["sq"] += float((lengths[mb].double() ** 2).sum())
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
    optimizer.step()
    return total, float(norm), work


def behaviour_logprobs(model, table: pa.Table, args, device: str, amp: bool) -> tuple[pa.Table, dict]:
    """The model's own log-probs of every response token (the first step is on-policy)."""
    x = bare_inputs(table, args.samples)
    lengths = torch.tensor([len(s) for s in x["seqs"]])
    flat = torch.zeros(sum(x["r_len"]))
    offsets = np.concatenate([[0], np.cumsum(x["r_len"])])
    cast = torch.autocast("cuda", dtype=torch.bfloat16) if amp else contextlib.nullcontext()
    with torch.no_grad():
        for mb in packed_micro_batches(torch.arange(len(lengths)), lengths, args.budget, 4096):
            with cast:
                lp, row = bare_logprobs(model, mb.tolist(), x, device)
            lp = lp.float().cpu()
            k = 0
            for i in mb.tolist():
                flat[offsets[i]:offsets[i + 1]] = lp[k:k + x["r_len"][i]]
                k += x["r_len"][i]
    x["old_lp"] = flat
    x["lp_index"] = [list(range(offsets[i], offsets[i + 1])) for i in range(len(x["r_len"]))]
    col = B.list_column(flat.numpy().astype(np.float32), np.array(x["r_len"]), pa.float32())
    return B.replace_column(table, "behavior_logprobs", col), x


# ---- the benchmark --------------------------------------------------------------------------------
def fsdp2_one_rank(model: torch.nn.Module, device: str) -> torch.nn.Module:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from actors.distributed import free_port
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{free_port()}",
                                rank=0, world_size=1)
    mesh = init_device_mesh(device, (1,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_seed(args, seed: int) -> dict:
    from actors.learner import Learner
    from actors.trainable import adamw

    device = args.device
    gpu = device == "cuda"
    learners, bare = {}, {}
    for v in args.variants:
        if v.startswith("coevo"):
            learner_cfg = {"gradient_checkpointing": v == "coevo_ckpt"}
            if v == "coevo_before":
                learner_cfg.update(precision="fp32", packing="off")
            cfg = config(args, seed, **learner_cfg)
            if v == "coevo_before":
                cfg = cfg.model_copy(update={"algorithm": cfg.algorithm.model_copy(
                    update={"micro_batch_size": 64, "micro_batch_tokens": None})})
            with on(device):  # built where it runs (a 0.5B model initialises in seconds on a GPU)
                learners[v] = Learner(cfg, None, role={"threads": args.threads, "num_gpus": 1 if gpu else 0},
                                      objectives=["policy_gradient"])
        elif v in ("bare", "bare_fsdp2"):
            if v == "bare_fsdp2" and not gpu:
                continue
            cfg = config(args, seed)
            model = build_model(cfg, device).train()
            if v == "bare_fsdp2":
                model = fsdp2_one_rank(model, device)
            bare[v] = (model, adamw(model.parameters(), lr=1e-5))
    cfg = config(args, seed)
    anchor = build_model(cfg, device).eval()
    table, x = behaviour_logprobs(anchor, synthetic_table(args, seed, anchor.config.vocab_size), args, device, gpu)
    table, _ = Credit(cfg).apply(table)  # the loop's credit step (on the driver): the advantages, untimed
    shape = model_shape(anchor)
    del anchor
    resp_tokens = sum(x["r_len"])
    all_tokens = sum(len(s) for s in x["seqs"])
    variants = list(learners) + list(bare)
    times = {v: [] for v in variants}
    mem, first, tflops = {}, {}, {v: [] for v in variants}
    for step in range(args.warmup + args.steps):
        order = variants if step % 2 == 0 else variants[::-1]
        for v in order:
            if gpu:
                torch.cuda.reset_peak_memory_stats()
            sync(device)
            start = time.perf_counter()
            if v in learners:
                m = learners[v].train_step(table)
                sync(device)
                dt = time.perf_counter() - start
                done = (m["train/loss"], m["train/grad_norm"])
                work_flops = m["perf/learner_tflops"] * m["time/learner_s"] * 1e12
            else:
                model, opt = bare[v]
                loss, norm, work = bare_step(model, opt, x, args.budget, device, amp=gpu and v == "bare")
                sync(device)
                dt = time.perf_counter() - start
                done = (loss, norm)
                work_flops = train_flops(shape, work["tokens"], work["sq"])
            first.setdefault(v, done)
            if step >= args.warmup:
                times[v].append(dt)
                tflops[v].append(work_flops / dt / 1e12)
            if gpu:
                mem[v] = max(mem.get(v, 0.0), torch.cuda.max_memory_allocated() / 2**30)
    peak = peak_flops(device, torch.bfloat16 if gpu else torch.float32, args.peak_tflops)
    out = {"seed": seed, "response_tokens": resp_tokens, "all_tokens": all_tokens, "step_s": times,
           "step1_loss_grad_norm": first, "peak_memory_gib": mem, "tflops": tflops,
           "response_tokens_per_s": {v: resp_tokens / statistics.median(t) for v, t in times.items()},
           "tokens_per_s": {v: all_tokens / statistics.median(t) for v, t in times.items()}}
    if peak:
        out["mfu"] = {v: statistics.median(f) * 1e12 / peak for v, f in tflops.items()}
    if "bare" in times:
        out["ratio_to_bare"] = {v: statistics.median(times["bare"]) / statistics.median(t) for v, t in times.items()}
    print(f"seed {seed}: " + ", ".join(f"{v} {out['response_tokens_per_s'][v]:.0f} resp tok/s"
                                       + (f" MFU {out['mfu'][v]:.1%}" if peak else "")
                                       + (f" {mem[v]:.1f} GiB" if v in mem else "") for v in variants), flush=True)
    print(f"seed {seed}: step-1 loss/grad norm " + ", ".join(f"{v} ({a:.5f}, {b:.4f})" for v, (a, b) in first.items()),
          flush=True)
    return out


def summarise(runs: list[dict]) -> dict:
    summary = {}
    for key in ("response_tokens_per_s", "tokens_per_s", "mfu", "ratio_to_bare", "peak_memory_gib"):
        if all(key in r for r in runs):
            summary[key] = {v: {"median": statistics.median(r[key][v] for r in runs),
                                "min": min(r[key][v] for r in runs), "max": max(r[key][v] for r in runs)}
                            for v in runs[0][key]}
    return summary


def table(result: dict) -> str:
    """Per variant, medians over seeds (a results file's `summary`)."""
    summary = result["summary"]
    lines = ["| variant | response tok/s | all tok/s | MFU | x bare | peak GiB |", "|---|---:|---:|---:|---:|---:|"]
    for v in result["runs"][0]["step_s"]:
        cell = lambda k, f: f(summary[k][v]["median"]) if k in summary and v in summary[k] else "-"  # noqa: E731
        lines.append(f"| {v} | {cell('response_tokens_per_s', lambda x: f'{x:,.0f}')} | "
                     f"{cell('tokens_per_s', lambda x: f'{x:,.0f}')} | {cell('mfu', lambda x: f'{x:.1%}')} | "
                     f"{cell('ratio_to_bare', lambda x: f'{x:.3f}')} | {cell('peak_memory_gib', lambda x: f'{x:.1f}')} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--rlen", type=int, default=512)
    p.add_argument("--budget", type=int, default=16384, help="tokens per micro-batch (algorithm.micro_batch_tokens)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--variants", default="coevo,bare,coevo_ckpt,coevo_before,bare_fsdp2")
    p.add_argument("--peak-tflops", type=float, default=None)
    p.add_argument("--out", default=None, help="JSON path (default: $OUT/learner_speed.json or benchmarks/results/raw/)")
    args = p.parse_args()
    args.variants = args.variants.split(",")
    machine = (f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}" if args.device == "cuda" else
               f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), torch {torch.__version__}")
    print(f"{machine}; preset {args.preset}; {args.prompts}x{args.samples} rows, responses "
          f"{args.rlen - 64}-{args.rlen}; budget {args.budget} tokens", flush=True)
    out = Path(args.out) if args.out else (Path(os.environ["OUT"]) / "learner_speed.json" if os.environ.get("OUT")
                                           else ROOT / "benchmarks" / "results" / "raw" / "learner_speed.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    runs = []
    for s in args.seeds:  # written after every seed: a run stopped by its time limit keeps what it measured
        runs.append(run_seed(args, s))
        result = {"machine": machine, "args": vars(args), "runs": runs, "summary": summarise(runs)}
        out.write_text(json.dumps(result, indent=1))
    print("\n" + table(result))
    # the summary section; on a lent device machine into $OUT, the folder that comes back
    from summary import write as write_summary

    summary_md = write_summary("learner_speed", out.stem, table(result), raw=[out], protocol=(
        f"{args.device}, preset {args.preset}, {args.prompts} prompts x {args.samples} samples, responses "
        f"{args.rlen - 64}-{args.rlen} tokens, budget {args.budget} tokens, seeds {args.seeds}, {args.warmup} untimed + "
        f"{args.steps} timed steps, variants {','.join(args.variants)}"),
        **({"folder": Path(os.environ["OUT"])} if os.environ.get("OUT") else {}))
    print(f"wrote {out} and {summary_md}")


if __name__ == "__main__":
    main()
