"""How well the async loop overlaps generation and training.

For each workload, a strict on-policy run (train.max_staleness=0) and an async one (max_staleness=1,
truncated importance sampling) of the same length. From the on-policy run's metrics: T_generate
(generation + scoring of a batch) and T_train (the learner's step, including publishing weights);
the ideal async step is max(T_generate, T_train). Reported: median step time of both runs, the
fraction of the bound the async run achieves (bound / async step; goal >= 0.9), and the
orchestration overhead of the on-policy run: step time not spent in generation, scoring or learning,
as a fraction of the step (goal <= 2 %); the weight broadcast is counted as work, not overhead.

    python benchmarks/overlap.py                    # both workloads, 3 repeats
    python benchmarks/overlap.py --workload synthetic --gen-s 0.2 --train-s 0.2

Workloads: `default` (the default recipe's task from its cached warm model), `synthetic`
(benchmarks/synthetic.py: generation and training that sleep for controlled times, no CPU contention).
Writes benchmarks/results/raw/overlap[<label>].json and the table to its section of the summary
benchmarks/results/overlap.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from summary import raw_path, write as write_summary  # noqa: E402

COEVO = [str(Path(sys.executable).parent / "coevo")]
SKIP = 3  # first steps: actor warm-up and the pipeline filling


def run(overrides: list[str], env_extra: dict, out: Path) -> list[dict]:
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "HF_HUB_OFFLINE": "1", **env_extra}
    log = out.with_suffix(".log")
    with log.open("w") as f:
        proc = subprocess.run([*COEVO, "run", *overrides, "--output-dir", str(out)], stdout=f, stderr=subprocess.STDOUT,
                              env=env, cwd=ROOT)
    if proc.returncode:
        raise RuntimeError(f"run failed, see {log}")
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()][SKIP:]


def med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def workload(name: str, args) -> tuple[list[str], dict]:
    common = [f"train.max_steps={args.steps}", f"train.eval_every={args.steps}", "train.stop_at_accuracy=null",
              "train.checkpoint_every=0"]
    if name == "default":
        return common, {}
    return ([*common, "rollout.backend=benchmarks.synthetic:SleepBackend",
             "algorithm.advantage=benchmarks.synthetic:slow_grpo", "warmup.enabled=false",
             "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1, intermediate_size: 64}",
             "rollout.max_new_tokens=4"],
            {"COEVO_SYNTH_GEN_S": str(args.gen_s), "COEVO_SYNTH_TRAIN_S": str(args.train_s)})


def table(results: list[dict]) -> str:
    """Per workload, the median (range) over repeats."""
    lines = ["| workload | T_generate s | T_train s | on-policy step s | async step s | bound / async | speed-up | overhead |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name in dict.fromkeys(r["workload"] for r in results):
        rs = [r for r in results if r["workload"] == name]
        cell = lambda k, f="{:.3f}": f"{f.format(statistics.median(r[k] for r in rs))} ({f.format(min(r[k] for r in rs))}-{f.format(max(r[k] for r in rs))})"  # noqa: E731
        lines.append(f"| {name} | {cell('t_generate')} | {cell('t_train')} | {cell('step_sync')} | {cell('step_async')} | "
                     f"{cell('fraction_of_bound', '{:.2f}')} | {cell('speedup', '{:.2f}')} | {cell('overhead_frac', '{:.1%}')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=["default", "synthetic", "both"], default="both")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--gen-s", type=float, default=0.2)
    parser.add_argument("--train-s", type=float, default=0.2)
    parser.add_argument("--label", default="")
    parser.add_argument("extra", nargs="*", help="overrides for every run (after --)")
    args = parser.parse_args()
    names = ["synthetic", "default"] if args.workload == "both" else [args.workload]
    results = []
    with tempfile.TemporaryDirectory(prefix="overlap-") as tmp:
        for name in names:
            overrides, env = workload(name, args)
            for rep in range(args.repeats):  # interleaved: on-policy, async, on-policy, async, ...
                sync = run([*overrides, *args.extra], env, Path(tmp) / f"{name}-sync-{rep}")
                asyn = run([*overrides, "train.max_staleness=1", "algorithm.off_policy=tis", *args.extra], env,
                           Path(tmp) / f"{name}-async-{rep}")
                t_gen = med(sync, "time/wait_rollouts_s")  # in strict mode: generation + scoring, unoverlapped
                t_train = med(sync, "time/learn_s") + med(sync, "time/score_batch_s")
                step_sync, step_async = med(sync, "time/step_s"), med(asyn, "time/step_s")
                bound = max(t_gen, t_train)
                # what the step spent outside the actors' own work (Ray calls, the driver's bookkeeping)
                overhead = [(r["time/step_s"] - r["time/generate_s"] - r["time/verify_s"] - r["time/learner_s"]
                             - r["time/publish_s"] - r["time/score_batch_s"]) / r["time/step_s"] for r in sync]
                results.append({"workload": name, "repeat": rep, "t_generate": t_gen, "t_train": t_train,
                                "step_sync": step_sync, "step_async": step_async, "bound": bound,
                                "fraction_of_bound": bound / step_async, "speedup": step_sync / step_async,
                                "overhead_frac": statistics.median(overhead),
                                "staleness_max": max(r["policy/staleness_max"] for r in asyn),
                                "load_avg": os.getloadavg()[0]})
                print(json.dumps(results[-1]))
    md = table(results)
    print("\n" + md)
    path = raw_path(f"overlap{args.label}.json")
    path.write_text(json.dumps({"machine": f"{os.cpu_count()} CPUs {platform.machine()}", "args": vars(args),
                                "results": results}, indent=1))
    summary = write_summary("overlap", path.stem, md, raw=[path], protocol=(
        f"{args.repeats} repeats of {args.steps} steps per workload, synthetic generation {args.gen_s} s and "
        f"training {args.train_s} s; overrides {args.extra or 'none'}"))
    print(f"raw results: {path}\nsummary: {summary}")


if __name__ == "__main__":
    main()
