"""One prepared device call for issue 31 (one GPU, end to end): each part runs in a process of its
own under its own time limit, and what it measured lands in one table and one JSON file.

  a  `coevo run`: the default job with no role settings (placement auto): where the roles landed,
     wall time, held-out accuracy from the warm start to the end
  b  generation at the preset: coevo's HF backend against bare `model.generate`, same model, batch and
     dtype, interleaved, seeds 0-2 (benchmarks/generation_speed.py; goal >= 0.95x bare)
  c  the whole GRPO step at the preset (generation + scoring + learner + publish), warm-up off, every
     group trained (algorithm.skip_uniform_groups=false: a random model's samples all score 0):
     median of the steps after the first, from metrics.jsonl
  d  TRL's GRPOTrainer on the same model and batch (benchmarks/vs_trl.py's settings; skipped where
     trl or datasets cannot be imported): median step time after the first
  e  the tests marked gpu (pytest -m gpu)

    python benchmarks/gpu_step.py --device cpu --preset tiny        # the proof on a CPU (minutes)
    python benchmarks/gpu_step.py --device cuda --preset 0.5b       # the device call (about 8 minutes)

On the GPU host (no registry, the source tree not installed, Ray from carried wheels), from the
project root, with the wheels installed as ../shared/tools/gpu/gpu-check.sh does:
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/gpu_step.py --device cuda --preset 0.5b --budget 540

The preset's batch: --prompts 32 x --samples 8 (256 samples) x --new-tokens 200. --budget caps the
whole call: a part gets what is left of it, at most its own limit, and is skipped under 30 s.
Writes $OUT/gpu_step.json (after every part) and each part's log beside it where $OUT is set (or
--out DIR); run directories and models go to a temporary directory, never under $OUT.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from benchmarks.generation_speed import PRESETS  # noqa: E402

PARTS = "abcde"
LIMITS = {"a": 150, "b": 240, "c": 240, "d": 120, "e": 60}  # seconds each, on a GPU
CPU_LIMITS = {"a": 300, "b": 300, "c": 300, "d": 600, "e": 120}
# the default job shortened for a CPU proof (the whole job is docs/default_job.md's minute)
CPU_DEFAULT_JOB = ["train.max_steps=4", "train.eval_every=2", "warmup.max_steps=20", "warmup.eval_every=10",
                   "warmup.cache=false", "data.eval_size=16", "rollout.prompts_per_step=8", "ray.num_cpus=2",
                   "train.threads=1"]


def env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0", "TERM": "dumb",
            "PYTHONPATH": os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)}


def run_part(cmd: list[str], log: Path, limit: float) -> tuple[int | str, float, str]:
    """(exit status or "timeout", seconds, the log's tail)."""
    start = time.perf_counter()
    with log.open("w") as f:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=env(), stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, timeout=limit).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return rc, time.perf_counter() - start, log.read_text(errors="replace")[-3000:]


def preset_overrides(preset: str) -> list[str]:
    return [f"model.tiny.{k}={v}" for k, v in PRESETS[preset].items()]


# ---- the parts ---------------------------------------------------------------------------------------
def part_a(args, work: Path, out: Path, limit: float) -> dict:
    run_dir = work / "default_job"
    cmd = [sys.executable, "-m", "orchestrator.cli", "run", "--output-dir", str(run_dir)]
    if args.device == "cpu":
        cmd += CPU_DEFAULT_JOB
    rc, took, tail = run_part(cmd, out / "a_default_job.log", limit)
    res = {"rc": rc, "wall_s": took, "command": " ".join(cmd[1:])}
    placement = [line for line in (out / "a_default_job.log").read_text(errors="replace").splitlines()
                 if line.startswith("placement:") or "cannot use CUDA" in line]
    res["placement"] = placement or ["(no placement line: every role on the CPU)"]
    summary = run_dir / "summary.json"
    if summary.is_file():
        s = json.loads(summary.read_text())
        res.update({k: s.get(k) for k in ("steps", "eval/accuracy", "warm_start/accuracy", "time/total_s",
                                           "time/warmup_s", "time/train_s", "time/ray_start_s")})
        res["result"] = (f"{_f(s.get('warm_start/accuracy'))} -> {_f(s.get('eval/accuracy'))} in {s.get('steps')} "
                         f"steps, {s.get('time/total_s', 0):.1f} s (warm-up {s.get('time/warmup_s', 0):.1f} s, "
                         f"training {s.get('time/train_s', 0):.1f} s); {res['placement'][0]}")
    else:
        res["log_tail"] = tail
    return res


def part_b(args, work: Path, out: Path, limit: float) -> dict:
    result = out / "b_generation.json"
    cmd = [sys.executable, "benchmarks/generation_speed.py", "--device", args.device, "--preset", args.preset,
           "--prompts", str(args.prompts), "--samples", str(args.samples), "--new-tokens", str(args.new_tokens),
           "--variants", "coevo,coevo_dynamic,bare" + (",bare_static" if args.static else ""), "--out", str(result)]
    rc, took, tail = run_part(cmd, out / "b_generation.log", limit)
    res = {"rc": rc, "wall_s": took}
    if result.is_file():
        g = json.loads(result.read_text())
        s = g["summary"]
        res.update({"summary": s, "dtype": g["dtype"], "params": g["params"], "machine": g["machine"]})
        parts = [f"coevo {s['coevo']['median_s']:.2f} s (first call {s['coevo']['first_call_s']:.0f} s), bare "
                 f"{s['bare']['median_s']:.2f} s ({g['dtype']}): {s['coevo_vs_bare']['median']:.3f}x bare "
                 f"({s['coevo_vs_bare']['min']:.3f}-{s['coevo_vs_bare']['max']:.3f})"]
        if "coevo_dynamic_vs_bare" in s:
            d = s["coevo_dynamic_vs_bare"]
            parts.append(f"dynamic cache {s['coevo_dynamic']['median_s']:.2f} s: {d['median']:.3f}x bare "
                         f"({d['min']:.3f}-{d['max']:.3f})")
        if "bare_static" in s:
            parts.append(f"bare static cache {s['bare_static']['median_s']:.2f} s "
                         f"(first call {s['bare_static']['first_call_s']:.0f} s)")
        res["result"] = "; ".join(parts)
    else:
        res["log_tail"] = tail
    return res


def part_c(args, work: Path, out: Path, limit: float) -> dict:
    run_dir = work / "grpo_step"
    cmd = [sys.executable, "-m", "orchestrator.cli", "run", "warmup.enabled=false", *preset_overrides(args.preset),
           f"rollout.prompts_per_step={args.prompts}", f"rollout.samples_per_prompt={args.samples}",
           f"rollout.max_new_tokens={args.new_tokens}", f"train.max_steps={args.steps}",
           f"train.eval_every={args.steps}", "train.stop_at_accuracy=null", "train.checkpoint_every=0",
           "data.eval_size=8", "algorithm.skip_uniform_groups=false",
           f"algorithm.micro_batch_size={args.micro_batch}", *args.learner, "--output-dir", str(run_dir)]
    if args.device == "cpu":
        cmd += ["ray.num_cpus=2", "train.threads=1"]
    rc, took, tail = run_part(cmd, out / "c_grpo_step.log", limit)
    res = {"rc": rc, "wall_s": took, "command": " ".join(cmd[1:])}
    metrics = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.is_file() else []
    timed = rows[1:] or rows  # the first step pays for CUDA's start-up
    if timed:
        keys = ("time/step_s", "time/generate_s", "time/learn_s", "time/wait_rollouts_s", "time/score_batch_s")
        res["steps"] = len(rows)
        res["median"] = {k: statistics.median(r[k] for r in timed if k in r) for k in keys if any(k in r for r in timed)}
        res["per_step"] = [{k: r.get(k) for k in ("step", *keys)} for r in rows]
        m = res["median"]
        res["result"] = (f"step {m['time/step_s']:.2f} s (generation {m.get('time/generate_s', 0):.2f} s, learner "
                         f"{m.get('time/learn_s', 0):.2f} s), median of steps 2-{len(rows)}")
    if rc != 0:
        res["log_tail"] = tail
    return res


def part_d(args, work: Path, out: Path, limit: float) -> dict:
    try:
        import datasets  # noqa: F401
        import trl  # noqa: F401
    except ImportError as e:
        return {"rc": "skipped", "wall_s": 0.0, "result": f"skipped: {e} (pip install -e '.[bench]'; datasets "
                                                         "and its small dependencies carried like Ray's)"}
    spec = {"device": args.device, "preset": args.preset, "prompts": args.prompts, "samples": args.samples,
            "new_tokens": args.new_tokens, "steps": args.steps, "model_dir": str(work / "trl_model"),
            "output_dir": str(work / "trl_out"), "result": str(out / "d_trl.json")}
    (work / "trl_spec.json").write_text(json.dumps(spec))
    cmd = [sys.executable, "benchmarks/gpu_step.py", "--trl-worker", str(work / "trl_spec.json")]
    rc, took, tail = run_part(cmd, out / "d_trl.log", limit)
    res = {"rc": rc, "wall_s": took}
    if Path(spec["result"]).is_file():
        t = json.loads(Path(spec["result"]).read_text())
        res.update(t)
        res["result"] = f"step {t['median_step_s']:.2f} s, median of steps 2-{len(t['step_s'])} ({t['dtype']})"
    else:
        res["log_tail"] = tail
    return res


def part_e(args, work: Path, out: Path, limit: float) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "tests"]
    rc, took, tail = run_part(cmd, out / "e_gpu_tests.log", limit)
    last = [line for line in tail.splitlines() if line.strip()][-1:] or [""]
    return {"rc": rc, "wall_s": took, "result": last[0]}


def trl_worker(spec_path: str) -> int:
    """Part d in its own process: TRL's GRPOTrainer on the preset's random model, per-step times."""
    spec = json.loads(Path(spec_path).read_text())
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from actors import modeling
    from actors.rewards.text import integer_match
    from orchestrator.config import validate_config
    from orchestrator.data import arithmetic
    from vs_trl import trl_settings

    cuda = spec["device"].startswith("cuda")
    config = validate_config({"model": {"tiny": PRESETS[spec["preset"]]}})
    model, tok = modeling.build(config.model, 0)
    model.save_pretrained(spec["model_dir"])
    tok.save_pretrained(spec["model_dir"])
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], local_files_only=True, dtype=torch.float32)
    rows = arithmetic(2, ["+"], eval_size=8, seed=0).train.to_pylist()
    train = Dataset.from_list([{"prompt": r["prompt"], "answer": str(r["answer"])} for r in rows])

    def reward(prompts, completions, answer, **_):
        return [integer_match(p, c, answer=a) for p, c, a in zip(prompts, completions, answer)]

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - self.t0)
            print(f"step {state.global_step}: {times[-1]:.2f} s", flush=True)

    settings = trl_settings(0, spec["steps"])
    settings.update(output_dir=spec["output_dir"], per_device_train_batch_size=spec["prompts"] * spec["samples"],
                    num_generations=spec["samples"], max_completion_length=spec["new_tokens"],
                    use_cpu=not cuda, bf16=cuda)
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=GRPOConfig(**settings), train_dataset=train,
                          processing_class=tok, callbacks=[Clock()])
    trainer.train()
    timed = times[1:] or times
    Path(spec["result"]).write_text(json.dumps({"step_s": times, "median_step_s": statistics.median(timed),
                                                "dtype": "bf16 autocast, fp32 master" if cuda else "float32",
                                                "trl_settings": {k: str(v) for k, v in settings.items()}}))
    return 0


# ---- the call --------------------------------------------------------------------------------------
def _f(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def table(results: dict) -> str:
    names = {"a": "default job, no role settings", "b": "generation: coevo vs bare", "c": "GRPO step",
             "d": "TRL GRPOTrainer step", "e": "gpu-marked tests"}
    lines = [f"{'part':4} {'what':32} {'status':8} {'took s':>7}  result"]
    for part, r in results["parts"].items():
        status = "ok" if r.get("rc") == 0 else str(r.get("rc"))
        lines.append(f"{part:4} {names[part]:32} {status:8} {r.get('wall_s', 0):7.1f}  {r.get('result', '')}")
    return "\n".join(lines)


def machine(device: str) -> str:
    import platform

    if device.startswith("cuda"):
        try:
            name = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            name = "a GPU (nvidia-smi unavailable)"
        return f"{name}; {os.cpu_count()} CPUs"
    return f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--preset", default="0.5b", choices=sorted(PRESETS))
    parser.add_argument("--parts", default=PARTS, help="which parts, e.g. abce")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps of parts c and d (the first is not timed)")
    parser.add_argument("--micro-batch", type=int, default=64, help="part c: algorithm.micro_batch_size")
    parser.add_argument("--learner", nargs="*", default=[], help="part c: more overrides, e.g. the learner's bf16 settings")
    parser.add_argument("--static", action="store_true", help="part b: also bare generate with a static KV cache")
    parser.add_argument("--budget", type=float, default=540, help="seconds for the whole call")
    parser.add_argument("--limit", nargs="*", default=[], help="a part's own limit, e.g. b=90")
    parser.add_argument("--out", default=os.environ.get("OUT"), help="where the JSON and logs go (default: $OUT)")
    parser.add_argument("--trl-worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.trl_worker:
        return trl_worker(args.trl_worker)
    limits = dict(LIMITS if args.device == "cuda" else CPU_LIMITS)
    limits.update({k: float(v) for k, v in (item.split("=", 1) for item in args.limit)})
    out = Path(args.out or tempfile.mkdtemp(prefix="gpu_step-out-")) / "gpu_step"
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu_step-"))
    results = {"device": args.device, "preset": args.preset, "machine": machine(args.device),
               "batch": f"{args.prompts} prompts x {args.samples} samples x {args.new_tokens} new tokens",
               "work_dir": str(work), "parts": {}}
    start = time.perf_counter()
    runners = {"a": part_a, "b": part_b, "c": part_c, "d": part_d, "e": part_e}
    for part in args.parts:
        left = args.budget - (time.perf_counter() - start)
        limit = min(limits[part], left)
        if limit < 30:
            results["parts"][part] = {"rc": "skipped", "wall_s": 0.0, "result": f"skipped: {left:.0f} s of the budget left"}
            continue
        print(f"== part {part} (limit {limit:.0f} s)", flush=True)
        results["parts"][part] = runners[part](args, work, out, limit)
        results["parts"][part]["limit_s"] = limit
        print(f"   {results['parts'][part].get('result') or results['parts'][part].get('rc')}", flush=True)
        (out / "gpu_step.json").write_text(json.dumps(results, indent=1, default=str))
    results["total_s"] = time.perf_counter() - start
    (out / "gpu_step.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"\n{results['machine']}, preset {args.preset}, {results['batch']}")
    print(table(results))
    print(f"wrote {out / 'gpu_step.json'}")
    return 0 if all(r.get("rc") in (0, "skipped") for r in results["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
