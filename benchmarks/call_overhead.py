"""Where the orchestration overhead of a strict on-policy step goes: for every role method the loop
calls, the wall time the driver waits minus the time the actor reports working on it (`busy_s`;
for `train_step`, the learner's own `time/learner_s`). The difference is Ray's transport: submitting
the call, (de)serialising the Arrow tables in and out, the object store, the reply.

Runs the synthetic workload of `benchmarks/overlap.py` (generation and training that sleep for
controlled times) in-process, with `Pool.call` wrapped to time each call; no change to the code path.

    python benchmarks/call_overhead.py                    # 40 steps, 0.2 s generation and training
    python benchmarks/call_overhead.py --gen-s 2 --train-s 2 --steps 15

Prints one line per method (median over steps, first 3 steps skipped) and the step's split; then the
same gap for a bare Ray actor method that only sleeps (no coevo code), the floor of any call here;
writes benchmarks/results/raw/call_overhead[_<label>].json and the summary benchmarks/results/call_overhead.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from summary import raw_path, write as write_summary  # noqa: E402

SKIP = 3


def table(result: dict) -> str:
    """The summary's tables from a results file: per method, the step's split, the bare Ray floor."""
    ms = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    lines = ["| method | calls | wall ms | wall - busy ms |", "|---|---:|---:|---:|",
             *(f"| {name} | {m['calls']} | {ms(m['wall_ms'])} | {ms(m['transport_ms'])} |"
               for name, m in sorted(result["methods"].items())),
             "", "The step, ms (medians):", "",
             "| " + " | ".join(k.removeprefix("time/").removesuffix("_s").removesuffix("_ms") for k in result["step"]) + " |",
             "|" + "---:|" * len(result["step"]), "| " + " | ".join(f"{v:.1f}" for v in result["step"].values()) + " |",
             "", "| bare Ray call: method works (s) | wall - busy ms |", "|---:|---:|",
             *(f"| {k} | {v:.2f} |" for k, v in result["bare_ray_gap_ms"].items())]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--gen-s", type=float, default=0.2)
    parser.add_argument("--train-s", type=float, default=0.2)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    os.environ.update(COEVO_SYNTH_GEN_S=str(args.gen_s), COEVO_SYNTH_TRAIN_S=str(args.train_s))
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

    from orchestrator import roles
    from orchestrator.config import load_config
    from orchestrator.run import run

    calls = collections.defaultdict(list)
    call, sync = roles.Pool.call, roles.Pool._sync

    async def timed_call(self, method, *a, **kw):
        start = time.perf_counter()
        out = await call(self, method, *a, **kw)
        info = out[1] if isinstance(out, tuple) and isinstance(out[1], dict) else out if isinstance(out, dict) else {}
        busy = info.get("busy_s", info.get("time/learner_s"))  # train_step_published: (weights, metrics)
        calls[f"{self.name}.{method}"].append((time.perf_counter() - start, busy))
        return out

    async def timed_sync(self, rep, version, payload):
        start = time.perf_counter()
        await sync(self, rep, version, payload)
        calls[f"{self.name}.update_weights"].append((time.perf_counter() - start, None))

    roles.Pool.call, roles.Pool._sync = timed_call, timed_sync
    with tempfile.TemporaryDirectory(prefix="call-overhead-") as tmp:
        out = Path(tmp) / "run"
        cfg = load_config(None, [f"train.max_steps={args.steps}", f"train.eval_every={args.steps}",
                                 "train.stop_at_accuracy=null", "train.checkpoint_every=0",
                                 "rollout.backend=benchmarks.synthetic:SleepBackend",
                                 "algorithm.advantage=benchmarks.synthetic:slow_grpo", "warmup.enabled=false",
                                 "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1, "
                                 "intermediate_size: 64}", "rollout.max_new_tokens=4", f"output_dir={out}"])
        run(cfg)
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()][SKIP:]
        shutil.rmtree(out, ignore_errors=True)
    result = {"args": vars(args), "methods": {}, "step": {}}
    print("\n| method | calls | wall ms | wall - busy ms |\n|---|---:|---:|---:|")
    for name, values in sorted(calls.items()):
        values = values[SKIP:] if len(values) > 2 * SKIP else values
        wall = statistics.median(w for w, _ in values)
        gaps = [w - b for w, b in values if b is not None]
        gap = statistics.median(gaps) if gaps else None
        result["methods"][name] = {"calls": len(values), "wall_ms": 1000 * wall, "transport_ms": gap and 1000 * gap}
        print(f"| {name} | {len(values)} | {1000 * wall:.2f} | {'-' if gap is None else f'{1000 * gap:.2f}'} |")
    keys = ["time/step_s", "time/generate_s", "time/verify_s", "time/learner_s", "time/publish_s"]
    result["step"] = {k: 1000 * statistics.median(r[k] for r in rows) for k in keys}
    work = sum(result["step"][k] for k in keys[1:])
    result["step"]["overhead_ms"] = result["step"]["time/step_s"] - work
    print("\nstep (ms): " + ", ".join(f"{k[5:-2]} {v:.1f}" for k, v in result["step"].items() if k.startswith("time/"))
          + f"; overhead {result['step']['overhead_ms']:.1f} ({result['step']['overhead_ms'] / result['step']['time/step_s']:.1%})")
    result["bare_ray_gap_ms"] = bare_ray_gaps()
    print("bare Ray call, wall - busy (ms), by how long the method works: " +
          ", ".join(f"{k} s: {v:.2f}" for k, v in result["bare_ray_gap_ms"].items()))
    path = raw_path(f"call_overhead{args.label and '_' + args.label}.json")
    path.write_text(json.dumps(result, indent=1))
    summary = write_summary("call_overhead", path.stem, table(result), raw=[path], protocol=(
        f"synthetic on-policy step, {args.steps} steps, generation {args.gen_s} s, training {args.train_s} s, "
        f"first {SKIP} steps skipped"))
    print(f"raw results: {path}\nsummary: {summary}")


def bare_ray_gaps(repeats: int = 15) -> dict[str, float]:
    """Median (wall - busy) of awaiting a two-return actor call whose method sleeps 0, 0.05, 0.2 s."""
    import asyncio
    import logging

    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)

    @ray.remote(num_cpus=0)
    class Sleeper:
        def work(self, seconds: float):
            start = time.perf_counter()
            time.sleep(seconds)
            return None, {"busy_s": time.perf_counter() - start}

    actor = Sleeper.remote()
    ray.get(actor.work.remote(0))

    async def gaps(seconds: float) -> float:
        out = []
        for _ in range(repeats):
            start = time.perf_counter()
            _, info = actor.work.options(num_returns=2).remote(seconds)
            busy = (await info)["busy_s"]
            out.append(time.perf_counter() - start - busy)
        return 1000 * statistics.median(out)

    async def each() -> dict[str, float]:
        return {str(s): await gaps(s) for s in (0.0, 0.05, 0.2)}

    try:
        return asyncio.run(each())
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
