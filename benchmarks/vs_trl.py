"""coevo versus TRL's GRPOTrainer, side by side: GRPO wall time from the same warm checkpoint to
0.8 held-out greedy accuracy, and samples per second.

Both sides start from the same warm checkpoint (coevo's cached SFT warm-up of the default task:
a tiny Qwen2 with a character tokenizer), read the same train/held-out JSONL files, and use the
same group size (8), prompts per step (32), learning rate (1e-4, constant), temperature (1.0),
max new tokens (5), no KL (beta 0), reward (coevo's `integer_match`; TRL calls the same function)
and held-out evaluation (greedy, the same 200 prompts, every 5 steps; stop at 0.8, cap 150 steps).
Runs are interleaved (TRL seed 0, coevo seed 0, TRL seed 1, ...); the seed changes sampling and the
prompt order on both sides, never the warm checkpoint or the data.

    pip install -e ".[bench]"                  # TRL; keep it out of an environment you share
    python benchmarks/vs_trl.py                # seeds 0 1 2, both sides
    python benchmarks/vs_trl.py --seeds 0 --label smoke
    python benchmarks/vs_trl.py --warm ~/.cache/coevo/warmup/<hash>
    python benchmarks/vs_trl.py --warmup-target 0.57 --warmup-every 1   # the ~0.58 start (its own cache entry)
    python benchmarks/vs_trl.py --only coevo -- train.max_staleness=1 algorithm.off_policy=tis
    python benchmarks/vs_trl.py --variant default seq_mean lr2e-4 "mine=algorithm.lr=3e-4 algorithm.mini_batches=2"

coevo's algorithm settings are its default recipe's unless a variant (`VARIANTS`, or
NAME='key=value ...') changes them: the default is GRPO's positive half (`algorithm.advantage=psr`);
variant `grpo` is plain GRPO, which does the same maths per step as TRL's settings below. For each
seed TRL runs first, then every variant.
Anything after `--` is passed to every `coevo run` after the shared overrides (so it wins).

Timing, the same on both sides: from the start of the first GRPO step to the end of the held-out
evaluation that first reaches the target ("incl. eval"), and the same minus every evaluation's
wall time up to then ("excl. eval"). Samples/s = completions generated and trained on up to that
step / the wall time excluding evaluation. Start-up (Ray, actors, imports, the trainer's set-up)
is not counted on either side. Without the warm checkpoint the script makes it once with
`coevo run train.max_steps=1` (the default recipe's warm-up, cached in ~/.cache/coevo/warmup/).

TRL runs in a subprocess per run (GRPOTrainer, CPU, no vLLM, fp32, 2 torch threads; settings in
`trl_settings`): 256 completions per optimizer step (per_device_train_batch_size=256,
num_generations=8, gradient_accumulation_steps=1, num_iterations=1, checked at run time), loss_type
"dapo" (with one process and no accumulation: the token-mean over the batch, as coevo's learner),
constant learning rate, no gradient checkpointing. A callback evaluates every 5 steps and stops
the trainer at the target.

Prints a markdown table and writes the raw numbers (per-step curves, settings, versions, the
machine and its load during each run) to benchmarks/results/raw/vs_trl_<label>.json, and the tables
to its section of the summary benchmarks/results/vs_trl.md. Timings on a
shared machine mean little: `--wait-quiet S` waits for a quiet machine before each run, and the
load during each run is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runs import (ROOT, LoadSampler, coevo_command, export_splits, offline_env,  # noqa: E402,F401
                  read_jsonl, run_logged, warm_checkpoint)
from summary import raw_path, write as write_summary  # noqa: E402

# The protocol both sides share.
GROUP = 8                # completions per prompt (coevo rollout.samples_per_prompt, TRL num_generations)
PROMPTS_PER_STEP = 32    # prompts per optimizer step: 256 completions
LR = 1e-4
TEMPERATURE = 1.0
MAX_NEW_TOKENS = 5
EVAL_EVERY = 5
TARGET = 0.8
MAX_STEPS = 150
THREADS = 2              # torch threads (coevo: per actor; its generator and learner alternate on-policy)


# --------------------------------------------------------------------------- shared inputs

def wait_until_quiet(max_wait_s: float, busy_pct: float) -> dict:
    """Wait (at most max_wait_s) until the machine's CPU use over a 5 s window is below busy_pct."""
    import psutil

    start, busy = time.monotonic(), psutil.cpu_percent(interval=5)
    while busy >= busy_pct and time.monotonic() - start < max_wait_s:
        busy = psutil.cpu_percent(interval=5)
    return {"waited_s": round(time.monotonic() - start, 1), "cpu_busy_pct_at_start": busy}


# --------------------------------------------------------------------------- TRL side

def trl_settings(seed: int, max_steps: int, updates: int = 1, lr: float = LR) -> dict:
    """GRPOConfig keyword arguments matching coevo's default GRPO step; with `updates` > 1, each
    generated batch of 256 is split into that many optimizer steps (TRL's steps_per_generation, the
    equivalent of coevo's algorithm.mini_batches)."""
    return dict(
        output_dir="unused",  # replaced by the worker
        seed=seed,
        learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0,  # coevo: constant lr, no warm-up
        optim="adamw_torch", weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
        max_grad_norm=1.0,                       # coevo algorithm.grad_clip
        num_generations=GROUP,
        per_device_train_batch_size=PROMPTS_PER_STEP * GROUP // updates,  # 256 completions per batch
        gradient_accumulation_steps=1, steps_per_generation=updates, num_iterations=1,  # updates per batch
        max_steps=max_steps * updates, num_train_epochs=1,
        max_completion_length=MAX_NEW_TOKENS, temperature=TEMPERATURE, top_p=1.0, top_k=0, min_p=None,
        repetition_penalty=1.0,
        beta=0.0, epsilon=0.2,                   # no KL, PPO clip 0.2 (as coevo; ratio is 1 on-policy)
        loss_type="dapo",                        # token-mean over the batch's completion tokens (= coevo)
        scale_rewards="group",                   # (r - group mean) / (group std + 1e-4), unbiased std (= coevo grpo)
        mask_truncated_completions=False, shuffle_dataset=True,
        use_vllm=False, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        disable_dropout=True, remove_unused_columns=False,
        logging_strategy="no", save_strategy="no", eval_strategy="no", report_to="none",
        disable_tqdm=True, log_completions=False, dataloader_num_workers=0,
    )


def trl_worker(spec_path: str) -> int:
    """One TRL run in this process (started by the driver below): writes a result JSON."""
    spec = json.loads(Path(spec_path).read_text())
    import torch

    torch.set_num_threads(spec["threads"])
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from actors.rewards.text import integer_match

    warm = spec["warm"]
    tokenizer = AutoTokenizer.from_pretrained(warm, local_files_only=True)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(warm, local_files_only=True, dtype=torch.float32)
    train_rows, eval_rows = read_jsonl(Path(spec["train"])), read_jsonl(Path(spec["eval"]))
    train = Dataset.from_list([{"prompt": r["prompt"], "answer": str(r["answer"])} for r in train_rows])
    eval_prompts = [r["prompt"] for r in eval_rows]
    eval_answers = [str(r["answer"]) for r in eval_rows]
    checks: dict = {"reward_calls": [], "loss_rows": [], "loss_tokens": []}
    # TRL tokenizes prompts with add_special_tokens=True, coevo with False: the same ids for this tokenizer?
    sample = eval_prompts[0]
    checks["prompt_ids_same_as_coevo"] = (tokenizer(sample)["input_ids"]
                                          == tokenizer(sample, add_special_tokens=False)["input_ids"])
    rewards_per_step: list[float] = []

    def integer_match_reward(prompts, completions, answer, **_):
        """coevo's built-in integer_match, per completion."""
        scores = [integer_match(p, c, answer=a) for p, c, a in zip(prompts, completions, answer)]
        checks["reward_calls"].append({"completions": len(completions), "distinct_prompts": len(set(prompts))})
        rewards_per_step.append(sum(scores) / len(scores))
        return scores

    eos = [tokenizer.eos_token_id]

    @torch.no_grad()
    def greedy_accuracy(m) -> float:
        """Greedy held-out accuracy, as coevo's generator + verifier compute it: one batched
        generate on the 200 prompts, decoded up to EOS, scored by integer_match."""
        was_training = m.training
        m.eval()
        enc = tokenizer(eval_prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        config = GenerationConfig(do_sample=False, max_new_tokens=MAX_NEW_TOKENS,
                                  pad_token_id=tokenizer.pad_token_id, eos_token_id=eos)
        out = m.generate(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], generation_config=config)
        texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        if was_training:
            m.train()
        return sum(integer_match(p, t, answer=a) for p, t, a in zip(eval_prompts, texts, eval_answers)) / len(texts)

    class Bench(TrainerCallback):
        def __init__(self):
            self.t0 = None
            self.steps: list[dict] = []
            self.eval_s = 0.0
            self.hit = None

        def on_step_begin(self, args, state, control, **kw):
            if self.t0 is None:
                self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            now = time.perf_counter()
            step = state.global_step
            row = {"step": step, "time_s": now - self.t0,
                   "reward/mean": rewards_per_step[-1] if rewards_per_step else None}
            if step % spec["eval_every"] == 0 or step == spec["max_steps"] * spec.get("updates", 1):
                acc = greedy_accuracy(trainer.model)
                row["eval/accuracy"] = acc
                row["time/eval_s"] = time.perf_counter() - now
                self.eval_s += row["time/eval_s"]
                print(f"step {step}: held-out accuracy {acc:.3f}, reward {row['reward/mean']:.3f}, "
                      f"{row['time_s']:.1f}s", flush=True)
                if acc >= spec["target"] and self.hit is None:
                    self.hit = step
                    control.should_training_stop = True
            row["wall_incl_eval_s"] = time.perf_counter() - self.t0
            row["wall_excl_eval_s"] = row["wall_incl_eval_s"] - self.eval_s
            self.steps.append(row)
            return control

    class CountingGRPOTrainer(GRPOTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            checks["loss_rows"].append(int(inputs["completion_ids"].shape[0]))
            checks["loss_tokens"].append(int(inputs["completion_mask"].sum()))
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)

    settings = trl_settings(spec["seed"], spec["max_steps"], spec.get("updates", 1), spec.get("lr", LR))
    settings["output_dir"] = spec["output_dir"]
    args = GRPOConfig(**settings)
    start_acc = greedy_accuracy(model)  # before training; not timed (a check that both evaluations agree)
    bench = Bench()
    t_setup = time.perf_counter()
    trainer = CountingGRPOTrainer(model=model, reward_funcs=[integer_match_reward], args=args,
                                  train_dataset=train, processing_class=tokenizer, callbacks=[bench])
    setup_s = time.perf_counter() - t_setup
    t_train = time.perf_counter()
    trainer.train()
    train_call_s = time.perf_counter() - t_train

    rows = bench.steps
    last = next((r for r in rows if r["step"] == bench.hit), rows[-1] if rows else {})
    steps = last.get("step", 0)
    completions = sum(c["completions"] for c in checks["reward_calls"][:steps])
    wall_excl = last.get("wall_excl_eval_s")
    evals = [r for r in rows if "eval/accuracy" in r]
    reported = {k: getattr(getattr(args, k), "value", getattr(args, k)) for k in settings if k != "output_dir"}
    reported.update({"generation_batch_size": args.generation_batch_size,
                     "steps_per_generation": args.steps_per_generation})
    result = {
        "side": "trl", "seed": spec["seed"], "reached_target": bench.hit is not None, "steps": steps,
        "wall_incl_eval_s": last.get("wall_incl_eval_s"), "wall_excl_eval_s": wall_excl,
        "eval_s": sum(r["time/eval_s"] for r in evals if r["step"] <= steps),
        "samples": completions, "samples_per_s": completions / wall_excl if wall_excl else None,
        "start_accuracy": start_acc, "final_accuracy": evals[-1]["eval/accuracy"] if evals else None,
        "trainer_setup_s": setup_s, "train_call_s": train_call_s, "optimizer_steps": trainer.state.global_step,
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
        "torch_threads": torch.get_num_threads(), "trl_settings": reported,
        "checks": {"prompt_ids_same_as_coevo": checks["prompt_ids_same_as_coevo"],
                   "completions_per_generation": sorted({c["completions"] for c in checks["reward_calls"]}),
                   "distinct_prompts_per_generation": sorted({c["distinct_prompts"] for c in checks["reward_calls"]}),
                   "generations": len(checks["reward_calls"]), "loss_calls": len(checks["loss_rows"]),
                   "rows_per_loss_call": sorted(set(checks["loss_rows"])),
                   "completion_tokens_per_step_mean": (sum(checks["loss_tokens"]) / len(checks["loss_tokens"])
                                                       if checks["loss_tokens"] else None)},
        "curve": rows,
    }
    Path(spec["result"]).write_text(json.dumps(result, indent=1))
    return 0


def run_trl(seed: int, warm: Path, train: Path, eval_: Path, work: Path, args, lr: float = LR) -> dict:
    run_dir = work / f"trl-lr{lr:g}-seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = {"seed": seed, "warm": str(warm), "train": str(train), "eval": str(eval_), "threads": THREADS,
            "eval_every": EVAL_EVERY * args.trl_updates, "updates": args.trl_updates,
            "target": args.target, "max_steps": args.max_steps, "lr": lr,
            "output_dir": str(run_dir / "out"), "result": str(run_dir / "result.json")}
    (run_dir / "spec.json").write_text(json.dumps(spec))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--trl-worker", str(run_dir / "spec.json")]
    log = run_dir / "trl.log"
    load = LoadSampler()
    load.start()
    t0 = time.perf_counter()
    with log.open("w") as f:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=offline_env(OMP_NUM_THREADS=str(THREADS)), stdout=f,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    out = {"side": "trl", "lr": lr, "seed": seed, "process_wall_s": time.perf_counter() - t0, **load.report()}
    if rc != 0 or not Path(spec["result"]).is_file():
        out.update(error=f"TRL worker exited {rc}", log_tail=log.read_text(errors="replace")[-4000:])
        return out
    return {**json.loads(Path(spec["result"]).read_text()), **out}


# --------------------------------------------------------------------------- coevo side

def coevo_overrides(warm: Path, train: Path, eval_: Path, max_steps: int, target: float) -> list[str]:
    return [
        "data.task=null", f"data.path={train}", f"data.eval_path={eval_}",
        "data.prompt_template='{prompt}'",  # the exported prompts already went through the recipe's template
        f"model.path={warm}", "warmup.enabled=false",
        f"rollout.prompts_per_step={PROMPTS_PER_STEP}", f"rollout.samples_per_prompt={GROUP}",
        f"rollout.max_new_tokens={MAX_NEW_TOKENS}", f"rollout.temperature={TEMPERATURE}",
        "rollout.top_p=1.0", "rollout.top_k=0",
        "rewards=[{name: integer_match}]",
        # the algorithm section is the recipe's (coevo's default) unless a variant sets it
        f"train.stop_at_accuracy={target}", f"train.eval_every={EVAL_EVERY}", f"train.max_steps={max_steps}",
        "train.checkpoint_every=0",  # TRL saves nothing either (coevo still writes its final checkpoint)
        # torch threads: coevo's default (all cores for stages that take turns, split for async)
    ]


RAY_START_TIMEOUT = "The current node timed out during startup"


def run_coevo(seed: int, warm: Path, train: Path, eval_: Path, work: Path, args, variant: str = "default",
              extra: tuple[str, ...] = ()) -> dict:
    run_dir = work / f"coevo-{variant}-seed{seed}"
    cmd = [*coevo_command(), "run", "--output-dir", str(run_dir), "--seed", str(seed),
           *coevo_overrides(warm, train, eval_, args.max_steps, args.target), *extra, *args.overrides]
    log = work / f"coevo-{variant}-seed{seed}.log"
    load = LoadSampler()
    load.start()
    t0 = time.perf_counter()
    # Ray gives a starting node 30 s to register (fixed in ray/_private/node.py): on an overloaded
    # machine a run can fail there before training starts; such a run is started again (counted).
    for attempt in range(args.startup_retries + 1):
        shutil.rmtree(run_dir, ignore_errors=True)
        with log.open("w") as f:
            try:
                rc = subprocess.run(cmd, cwd=ROOT, env=offline_env(), stdout=f, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, timeout=args.timeout).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        if rc == 0 or RAY_START_TIMEOUT not in log.read_text(errors="replace"):
            break
        print(f"[coevo:{variant} seed {seed}] Ray did not start in time (attempt {attempt + 1})",
              file=sys.stderr, flush=True)
    out = {"side": "coevo", "variant": variant, "seed": seed, "command": cmd, "ray_start_retries": attempt,
           "process_wall_s": time.perf_counter() - t0,
           **load.report()}
    metrics = run_dir / "metrics.jsonl"
    if rc != 0 or not metrics.is_file():
        out.update(error=f"coevo run exited {rc}", log_tail=log.read_text(errors="replace")[-4000:])
        if metrics.is_file():  # a run stopped by --timeout: what it learned until then
            out["partial_curve"] = [{k: r.get(k) for k in CURVE_KEYS if k in r} for r in read_jsonl(metrics)]
        return out
    rows = read_jsonl(metrics)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    hit = next((r for r in rows if r.get("eval/accuracy") is not None and r["eval/accuracy"] >= args.target), None)
    last = hit or rows[-1]
    upto = [r for r in rows if r["step"] <= last["step"]]
    first_start = rows[0]["time_s"] - rows[0]["time/step_s"]  # time_s is taken after the step's update
    wall_incl = last["time_s"] + last.get("time/eval_s", 0.0) - first_start
    eval_s = sum(r.get("time/eval_s", 0.0) for r in upto)
    samples = sum(r.get("samples/count", 0) for r in upto)
    evals = [r for r in rows if r.get("eval/accuracy") is not None]
    warm_info = json.loads((warm / "warmup.json").read_text()) if (warm / "warmup.json").is_file() else {}
    config_yaml = (run_dir / "config.yaml").read_text() if (run_dir / "config.yaml").is_file() else None
    out.update({
        "reached_target": hit is not None, "steps": last["step"],
        "wall_incl_eval_s": wall_incl, "wall_excl_eval_s": wall_incl - eval_s, "eval_s": eval_s,
        "samples": samples, "samples_per_s": samples / (wall_incl - eval_s),
        "step_s_sum": sum(r["time/step_s"] for r in upto),
        "samples_per_s_coevo_metric_median": statistics.median(r["throughput/samples_per_s"] for r in upto),
        "start_accuracy": warm_info.get("warmup/accuracy"),
        "final_accuracy": evals[-1]["eval/accuracy"] if evals else None,
        "summary": {k: v for k, v in summary.items() if k.startswith(("time/", "steps", "eval/"))},
        "checks": {"samples_per_step": sorted({r.get("samples/count") for r in upto}),
                   "completion_tokens_per_step_mean": statistics.mean(
                       r.get("samples/response_length", 0) * r.get("samples/count", 0) for r in upto)},
        "resolved_config_yaml": config_yaml,
        "soundness": soundness(rows),
        "curve": [{k: r.get(k) for k in CURVE_KEYS if k in r} for r in rows],
    })
    return out


CURVE_KEYS = ("step", "time_s", "time/step_s", "time/learner_s", "time/generate_s", "time/publish_s",
              "time/wait_rollouts_s", "reward/mean", "eval/accuracy", "time/eval_s",
              "throughput/samples_per_s", "train/neg_logprob", "train/kl", "train/clip_frac", "train/grad_norm",
              "samples/uniform_reward_groups_frac", "train/optimizer_steps")


def soundness(rows: list[dict]) -> dict:
    """Signs of an unsound run: the sampling entropy estimate (the behaviour policy's negative
    log-likelihood of its samples) at the start and the end, the largest KL and gradient norm."""
    def first_last(key):
        vals = [r[key] for r in rows if r.get(key) is not None]
        return [vals[0], vals[-1]] if vals else None
    kl = [r["train/kl"] for r in rows if r.get("train/kl") is not None]
    grad = [r["train/grad_norm"] for r in rows if r.get("train/grad_norm") is not None]
    return {"neg_logprob_first_last": first_last("train/neg_logprob"),
            "uniform_groups_frac_first_last": first_last("samples/uniform_reward_groups_frac"),
            "kl_max": max(kl, default=None), "grad_norm_max": max(grad, default=None),
            "skipped_nonfinite": max((r.get("train/skipped_nonfinite", 0) for r in rows), default=0)}


# --------------------------------------------------------------------------- variants

# Named coevo configurations, each a difference from coevo's default recipe (its `algorithm` and
# `train` sections), to find which difference from TRL costs or saves steps. TRL's side is fixed
# (trl_settings). On-policy with one optimizer step per batch the PPO ratio is exactly 1, so the
# clip range (clip_eps, clip_eps_high) cannot change a step there; both sides use a constant lr.
VARIANTS: dict[str, tuple[str, ...]] = {
    "default": (),
    "grpo": ("algorithm.advantage=grpo",),  # like for like with TRL's GRPO (the default before psr)
    "psr": ("algorithm.advantage=psr",),
    # TRL's settings spelled out (what the default was when this benchmark was written)
    "trl_match": ("algorithm.advantage=grpo", "algorithm.policy_loss=ppo_clip", f"algorithm.lr={LR}",
                  "algorithm.kl_coef=0.0", "algorithm.loss_agg=token_mean", "algorithm.mini_batches=1",
                  "algorithm.clip_eps=0.2", "algorithm.clip_eps_high=null", "algorithm.off_policy=null",
                  "train.max_staleness=0"),
    "seq_mean": ("algorithm.loss_agg=seq_mean_token_mean",),          # GRPO paper; TRL loss_type="grpo"
    "no_std": ("algorithm.advantage=dr_grpo", "algorithm.loss_agg=token_mean"),  # TRL scale_rewards="none"
    "kl0.04": ("algorithm.kl_coef=0.04",),                           # GRPO paper's beta (TRL's before 0.19)
    "lr2e-4": ("algorithm.lr=2e-4",),
    "lr3e-4": ("algorithm.lr=3e-4",),
    "mb2": ("algorithm.mini_batches=2",),
    "async": ("train.max_staleness=1", "algorithm.off_policy=tis"),
    "async_mb2": ("train.max_staleness=1", "algorithm.off_policy=tis", "algorithm.mini_batches=2"),
    # the learner's speed on two cores: transformers' eager attention (faster than sdpa at ~13 tokens),
    # and two 1-thread ddp ranks in place of one 2-thread learner
    "eager": ("model.attn_implementation=eager",),
    "eager_ddp2": ("model.attn_implementation=eager", "roles.policy_learner.replicas=2",
                   "roles.policy_learner.threads=1", "roles.policy_learner.num_cpus=0.5"),
    "async_eager": ("model.attn_implementation=eager", "train.max_staleness=1", "algorithm.off_policy=tis"),
}


def parse_variant(text: str) -> tuple[str, tuple[str, ...]]:
    """`NAME` (one of VARIANTS) or `NAME=key=value key=value ...` (a new one)."""
    import re
    import shlex

    name, sep, rest = text.partition("=")
    if not re.fullmatch(r"[A-Za-z0-9_.+-]+", name):
        raise ValueError(f"--variant {text!r}: the name {name!r} must be letters, digits or _.+- "
                         "(form: NAME or NAME='key=value ...')")
    if not sep:
        if name not in VARIANTS:
            raise ValueError(f"--variant {text!r}: no variant named {name!r}; known: {', '.join(VARIANTS)} "
                             "(or define one: NAME='key=value ...')")
        return name, VARIANTS[name]
    overrides = tuple(shlex.split(rest))
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ValueError(f"--variant {text!r}: override {bad[0]!r} is not key=value")
    return name, overrides


def parse_variants(texts: list[str]) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for text in texts or ["default"]:
        name, overrides = parse_variant(text)
        if name in out:
            raise ValueError(f"--variant {text!r}: the name {name!r} is given twice")
        out[name] = overrides
    return out


def run_label(r: dict) -> str:
    """trl, or coevo:<variant>."""
    if r["side"] == "trl":
        return "trl" if r.get("lr", LR) == LR else f"trl:lr{r['lr']:g}"
    return f"coevo:{r.get('variant', 'default')}"


# --------------------------------------------------------------------------- report

def machine_info() -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from learning_curve import machine_info as describe

    return describe(("torch", "transformers", "trl", "accelerate", "datasets", "ray", "pyarrow"))


def coevo_source() -> dict:
    """The commit coevo ran from and the files that differed from it (the editable install runs the
    working tree as it was during the runs)."""
    def git(*cmd: str) -> str:
        try:
            return subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    dirty = [line[3:] for line in git("status", "--porcelain").splitlines()
             if line[3:].startswith(("orchestrator/", "actors/", "pipelines/"))]
    return {"commit": git("rev-parse", "HEAD") or None, "modified_coevo_files": dirty}


def fmt(v, f="{:.1f}") -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return f.format(v)


def table(results: list[dict], target: float) -> str:
    lines = [f"| run | seed | >= {target:g} | steps | GRPO s to {target:g} (incl. eval) | excl. eval | eval s | samples/s | "
             "start acc | final acc | load 1-min before / mean during |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {run_label(r)} | {r['seed']} | error: {r['error']} |" + " |" * 8)
            continue
        lines.append(f"| {run_label(r)} | {r['seed']} | {fmt(r['reached_target'])} | {r['steps']} | "
                     f"{fmt(r['wall_incl_eval_s'])} | {fmt(r['wall_excl_eval_s'])} | {fmt(r['eval_s'])} | "
                     f"{fmt(r['samples_per_s'], '{:.0f}')} | {fmt(r['start_accuracy'], '{:.3f}')} | "
                     f"{fmt(r['final_accuracy'], '{:.3f}')} | "
                     f"{r['load_avg_before'][0]:.2f} / {fmt(r['load_1min_mean'], '{:.2f}')} |")
    return "\n".join(lines)


SUMMARY_KEYS = (("GRPO s to target, incl. eval", "wall_incl_eval_s", "{:.1f}"),
                ("GRPO s to target, excl. eval", "wall_excl_eval_s", "{:.1f}"),
                ("samples/s", "samples_per_s", "{:.0f}"), ("steps", "steps", "{:.0f}"))


def summarize(results: list[dict], target: float) -> tuple[dict, str]:
    stats: dict = {}
    for label in dict.fromkeys(run_label(r) for r in results):
        ok = [r for r in results if run_label(r) == label and "error" not in r]
        s = stats[label] = {"runs": len(ok), "reached": sum(bool(r["reached_target"]) for r in ok),
                            "errors": sum(1 for r in results if run_label(r) == label and "error" in r)}
        for _, key, _ in SUMMARY_KEYS:
            vals = [r[key] for r in ok if r.get(key) is not None]
            if vals:
                s[key] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    lines = [f"| run | runs (reached {target:g}) | " + " | ".join(h + ": median (min-max)" for h, _, _ in SUMMARY_KEYS) + " |",
             "|---|---|" + "---:|" * len(SUMMARY_KEYS)]
    for side, s in stats.items():
        cells = []
        for _, key, f in SUMMARY_KEYS:
            v = s.get(key)
            cells.append(f"{f.format(v['median'])} ({f.format(v['min'])}-{f.format(v['max'])})" if v else "-")
        lines.append(f"| {side} | {s['runs']} ({s['reached']}) | " + " | ".join(cells) + " |")
    ratios: dict = {}
    trl_labels = [k for k in stats if k.startswith("trl")]
    for label in [k for k in stats if not k.startswith("trl")]:
        for base in trl_labels:  # "coevo:x" against "trl" keeps its old key; other TRL rates are named
            name = label if base == "trl" else f"{label} / {base}"
            for _, key, _ in SUMMARY_KEYS:
                t, c = stats[base].get(key), stats[label].get(key)
                if t and c and t["median"]:
                    ratios.setdefault(name, {})[key] = c["median"] / t["median"]
    if ratios:
        lines.append("")
    for label, r in ratios.items():
        lines.append(f"{label if ' / ' in label else label + ' / TRL'}, ratio of medians: " + ", ".join(
            f"{h} {r[k]:.2f}" for h, k, _ in SUMMARY_KEYS if k in r) + " (goal: GRPO time <= 0.50)")
    if any(not r.get("reached_target", True) for r in results if "error" not in r):
        lines.append(f"runs that did not reach {target:g} count with their time to the step cap")
    stats["ratio_coevo_over_trl"] = ratios
    return stats, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--trl-worker"]:
        return trl_worker(argv[1])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Anything after -- is passed to `coevo run` as extra key=value overrides.")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--only", choices=("trl", "coevo"), help="run one side only")
    p.add_argument("--trl-lr", type=float, nargs="+", default=[LR], metavar="LR",
                   help="TRL learning rates, one TRL run each per seed (default: %(default)s); compare a tuned "
                        "coevo learning rate with TRL at the same rate")
    p.add_argument("--warm", help="warm checkpoint (HF directory); default: the default recipe's cached warm-up")
    p.add_argument("--warmup-target", type=float, metavar="ACC",
                   help="without --warm: the default recipe's warm-up run to this held-out accuracy instead of "
                        "its warmup.target_accuracy (a separate cache entry, made once)")
    p.add_argument("--warmup-every", type=int, metavar="N",
                   help="without --warm: the warm-up checks its accuracy every N steps instead of the default "
                        "recipe's warmup.eval_every (1 lands nearest --warmup-target)")
    p.add_argument("--max-steps", type=int, default=MAX_STEPS, help="step cap (default %(default)s)")
    p.add_argument("--trl-updates", type=int, default=1, metavar="K",
                   help="TRL optimizer steps per generated batch (steps_per_generation; default 1); "
                        "its reported steps are then optimizer steps, evaluated every 5 batches")
    p.add_argument("--target", type=float, default=TARGET, help="held-out accuracy to reach (default %(default)s)")
    p.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                   help="before each run wait up to S seconds for the machine's CPU use (5 s window) to drop "
                        "below --quiet-pct (shared machines)")
    p.add_argument("--quiet-pct", type=float, default=30)
    p.add_argument("--timeout", type=float, default=1200, help="per-run limit, seconds")
    p.add_argument("--startup-retries", type=int, default=2, metavar="N",
                   help="start a coevo run again up to N times when Ray's node did not start in time "
                        "(overloaded machine; default %(default)s)")
    p.add_argument("--label", help="results file suffix (default: <cpus>cpu)")
    p.add_argument("--out", type=Path, help="results JSON (default: benchmarks/results/raw/vs_trl_<label>.json)")
    p.add_argument("--keep", type=Path, help="keep the data files, logs and run directories here")
    p.add_argument("--variant", nargs="+", action="extend", default=[], metavar="NAME[=OVERRIDES]",
                   help="coevo configurations to run after TRL for every seed: a name from VARIANTS ("
                        + ", ".join(VARIANTS) + ") or NAME='key=value ...'; default: default")
    p.add_argument("overrides", nargs="*", help="extra coevo run overrides for every variant (after --)")
    args = p.parse_args(argv)
    try:
        variants = parse_variants(args.variant)
    except ValueError as e:
        p.error(str(e))
    if args.only != "coevo":
        try:
            import trl  # noqa: F401
        except ImportError:
            sys.exit("error: TRL is not installed here: pip install -e '.[bench]' (or --only coevo)")

    work = Path(args.keep or tempfile.mkdtemp(prefix="coevo-vs-trl-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    info = machine_info()
    label = args.label or f"{info['cpu_affinity'] or info['cpu_count_logical']}cpu"
    out = args.out or raw_path(f"vs_trl_{label}.json")
    warm, warm_info = warm_checkpoint(args.warm, work, args.warmup_target, args.warmup_every)
    train, eval_, data_info = export_splits(work)
    print(f"warm checkpoint: {warm} (held-out accuracy {warm_info.get('warmup/accuracy')})\n"
          f"data: {train} ({data_info['train_rows']} rows), {eval_} ({data_info['eval_rows']} rows)",
          file=sys.stderr, flush=True)

    source = coevo_source()
    runs = [("trl", lr) for lr in args.trl_lr] if args.only != "coevo" else []
    runs += [("coevo", v) for v in variants] if args.only != "trl" else []
    names = [("trl" if v == LR else f"trl:lr{v:g}") if side == "trl" else f"coevo:{v}" for side, v in runs]

    def report(results: list[dict]) -> tuple[str, str]:
        """Written after every run, so an interrupted invocation keeps what it measured."""
        md = table(results, args.target)
        stats, summary_md = summarize(results, args.target)
        trl_run = next((r for r in results if r["side"] == "trl" and "error" not in r), None)
        doc = {
            "benchmark": "vs_trl", "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "protocol": {"group_size": GROUP, "prompts_per_step": PROMPTS_PER_STEP, "lr": LR,
                         "temperature": TEMPERATURE, "max_new_tokens": MAX_NEW_TOKENS, "eval_every": EVAL_EVERY,
                         "target_accuracy": args.target, "max_steps": args.max_steps, "torch_threads": THREADS,
                         "seeds": args.seeds, "warm": args.warm, "warmup_target": args.warmup_target,
                         "warmup_every": args.warmup_every,
                         "order": "interleaved: " + ", ".join(f"{n} seed {x}" for x in args.seeds for n in names)},
            "warm_checkpoint": str(warm), "warm_info": warm_info, "data": data_info,
            "coevo_overrides": coevo_overrides(warm, train, eval_, args.max_steps, args.target),
            "coevo_variants": {k: list(v) for k, v in variants.items()},
            "coevo_extra_overrides": args.overrides,
            "trl_version": trl_run["versions"]["trl"] if trl_run else info.get("trl"),
            "trl_settings": trl_run["trl_settings"] if trl_run else None,
            "machine": info, "coevo_source": source, "table_markdown": md, "summary_markdown": summary_md,
            "summary": stats, "complete": len(results) == len(args.seeds) * len(runs), "runs": results,
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1, default=str))
        return md, summary_md

    results: list[dict] = []
    for seed in args.seeds:
        for (side, variant), name in zip(runs, names):
            quiet = wait_until_quiet(args.wait_quiet, args.quiet_pct) if args.wait_quiet else {}
            print(f"[{name} seed {seed}] load {os.getloadavg()[0]:.2f} ...", file=sys.stderr, flush=True)
            if side == "trl":
                r = run_trl(seed, warm, train, eval_, work, args, lr=variant)
            else:
                r = run_coevo(seed, warm, train, eval_, work, args, variant, variants[variant])
            r.update(quiet)
            results.append(r)
            if "error" in r:
                print(f"[{name} seed {seed}] FAILED: {r['error']}\n{r.get('log_tail', '')[-2000:]}",
                      file=sys.stderr, flush=True)
            else:
                print(f"[{name} seed {seed}] steps {r['steps']}  reached {r['reached_target']}  "
                      f"{r['wall_incl_eval_s']:.1f}s incl. eval / {r['wall_excl_eval_s']:.1f}s excl.  "
                      f"{r['samples_per_s']:.0f} samples/s  load {r['load_1min_mean']}", file=sys.stderr, flush=True)
            report(results)

    md, summary_md = report(results)
    print(md + "\n\n" + summary_md)
    summary = write_summary("vs_trl", out.stem, summary_md + "\n\n" + md, raw=[out], protocol=(
        f"seeds {args.seeds} interleaved, TRL lr {args.trl_lr}, variants {list(variants)}, target {args.target}, "
        f"at most {args.max_steps} steps, warm start {warm_info.get('warmup/accuracy', float('nan')):.3f} held-out accuracy; "
        f"extra overrides {args.overrides or 'none'}"))
    print(f"\nwrote {out} and {summary}", file=sys.stderr)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if results and all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
