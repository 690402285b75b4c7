"""Orchestration scaling: throughput and weight-publish time from 1 to 32 generator replicas.

Weak scaling with synthetic roles (benchmarks/synthetic.py): each generator call sleeps `--gen-s`
and returns random tokens (SleepBackend); the learner sleeps `--train-s` per step (slow_grpo) and
trains a 1-layer, hidden-32 tiny model (the learner must hold one: its updates are what a publish
sends; measured ~0.05 s of real work at 1024 samples on this machine). Each replica gets
`--prompts-per-replica` prompts per step (`rollout.prompts_per_step` = that x replicas,
`rollout.chunk_prompts` = that), so a step's ideal time does not depend on the replica count and
ideal throughput is linear in it.

Every run is the real `coevo run` (strict on-policy, train.max_staleness=0, so a publish returns
once every replica holds the version), joining one `ray.cluster_utils.Cluster` on loopback: a head
(the learner and verifier) and `--nodes` worker nodes whose CPUs and `gen` resource hold an equal
share of 32 generators (so 32 fill every node). Runs are interleaved: for each seed, every replica
count, for each `weights.transport` (collective only on `--collective-seeds`). Verifiers scale with
the generators: coevo's default, one per 8 (`--generators-per-verifier` sets another share).
Budget: a generator actor costs ~6.7 CPU-s to start and ~280 MiB, so a 1-to-32 sweep starts 63 of
them and 32 need ~9 GiB free.

Measured per run, over the steps after `--skip` warm-up steps:
- samples/s: samples consumed / wall time between metrics rows (the driver's bookkeeping between
  steps included), and efficiency = samples/s / (replicas x samples/s of 1 replica, same seed and
  transport);
- publish time (`time/publish_s`): learner export to every replica acknowledging the version.

    python benchmarks/orchestration_scaling.py                       # 1..32 replicas, seeds 0-2 (collective: seed 0)
    python benchmarks/orchestration_scaling.py --replicas 1 32 --seeds 0 --steps 8
    python benchmarks/orchestration_scaling.py --table benchmarks/results/raw/orchestration_scaling.json

Writes benchmarks/results/raw/orchestration_scaling[_<label>].json and a .png of the same name, and the
table to its section of the summary benchmarks/results/orchestration_scaling.md.
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "benchmarks"))
from summary import raw_path, write as write_summary  # noqa: E402

COEVO = [str(Path(sys.executable).parent / "coevo")]
MAX_REPLICAS = 32


def overrides(args, replicas: int, seed: int, transport: str, out: Path) -> list[str]:
    per = args.prompts_per_replica
    return [f"seed={seed}", f"train.max_steps={args.steps}", f"train.eval_every={args.steps}",
            "train.stop_at_accuracy=null", "train.checkpoint_every=0", "train.max_staleness=0",
            "rollout.backend=benchmarks.synthetic:SleepBackend", "algorithm.advantage=benchmarks.synthetic:slow_grpo",
            "warmup.enabled=false", "rollout.max_new_tokens=4", f"data.eval_size={max(replicas, 8)}",
            "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1, intermediate_size: 64}",
            f"rollout.prompts_per_step={per * replicas}", f"rollout.chunk_prompts={per}",
            f"roles.generator.replicas={replicas}", "roles.generator.resources={gen: 1}",
            # verifiers: coevo's default, one per 8 generators (orchestrator.roles.verifier_share), unless given
            *([f"roles.verifier.replicas={max(1, -(-replicas // args.generators_per_verifier))}"]
              if args.generators_per_verifier else []),
            f"weights.transport={transport}", "weights.timeout_s=60", *args.extra, "--output-dir", str(out)]


def run_once(args, address: str, replicas: int, seed: int, transport: str, out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}  # the cluster has no token auth
    env.update(RAY_ADDRESS=address, HF_HUB_OFFLINE="1")
    started = time.perf_counter()
    with out.with_suffix(".log").open("w") as f:
        proc = subprocess.run([*COEVO, "run", *overrides(args, replicas, seed, transport, out)], stdout=f,
                              stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    if proc.returncode:
        raise RuntimeError(f"coevo run ({replicas} replicas, seed {seed}, {transport}) failed, see "
                           f"{out.with_suffix('.log')}")
    summary = json.loads((out / "summary.json").read_text())
    return {"replicas": replicas, "seed": seed, "transport": transport, **steady_state(out / "metrics.jsonl", args.skip),
            "startup_s": summary["time/warmup_s"], "run_s": time.perf_counter() - started,
            "nodes_used": generator_nodes(out.name), "load_1min": os.getloadavg()[0]}


def steady_state(metrics: Path, skip: int) -> dict:
    """Throughput and medians over the steps after the first `skip`. samples/s is over wall time
    between metrics rows (the driver's bookkeeping between steps counts), not the sum of step times."""
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    rows = [r for r in rows if "time/step_s" in r]
    if len(rows) < skip + 2:
        raise ValueError(f"{metrics}: {len(rows)} step rows; a steady state after --skip {skip} warm-up steps "
                         f"needs at least {skip + 2} (raise --steps)")
    first, steady = rows[skip], rows[skip + 1:]
    samples = sum(r["samples/count"] for r in steady)
    wall = steady[-1]["time_s"] - first["time_s"]
    median = lambda key: statistics.median(r[key] for r in steady)  # noqa: E731
    return {"samples_per_s": samples / wall, "step_s": median("time/step_s"), "wall_per_step_s": wall / len(steady),
            "publish_s": median("time/publish_s"), "publish_s_max": max(r["time/publish_s"] for r in steady),
            "wait_rollouts_s": median("time/wait_rollouts_s"), "verify_s": median("time/verify_s"),
            "learn_s": median("time/learn_s"), "learner_s": median("time/learner_s"),
            "driver_cpu_s": statistics.median(r["time/driver_cpu_s"] for r in steady) if "time/driver_cpu_s" in steady[0]
            else None,  # the loop's own CPU per step (metrics before it existed lack it)
            "samples_per_step": samples / len(steady), "steps_measured": len(steady),
            "lost": steady[-1]["samples/lost"], "fallbacks": steady[-1].get("channel/policy/fallbacks", 0)}


def generator_nodes(run: str) -> int:
    """Distinct nodes the run's generators ran on (GCS actor table; names are `<run>/<role>/<i>`)."""
    from ray._private.state import actors

    return len({a["Address"]["NodeID"] for a in actors().values()
                if (a.get("Name") or "").startswith(f"{run}/generator/")})


def start_cluster(nodes: int, gen_s: float, train_s: float):
    os.environ["PYTHONPATH"] = str(ROOT)  # the raylets' workers import benchmarks.synthetic ...
    # ... and read the synthetic costs from the environment the raylets give them (not the driver's)
    os.environ.update(COEVO_SYNTH_GEN_S=str(gen_s), COEVO_SYNTH_TRAIN_S=str(train_s))
    # loopback only: Ray reads this switch at import (as orchestrator.cluster.connect does)
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    ray_constants.ENABLE_RAY_CLUSTER = False
    per = -(-MAX_REPLICAS // nodes)
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "node_ip_address": "127.0.0.1", "include_dashboard": False})
    for _ in range(nodes):
        cluster.add_node(num_cpus=per, resources={"gen": per}, node_ip_address="127.0.0.1")
    ray.init(address=cluster.address, logging_level="WARNING")  # to read the actor table
    return cluster


def add_efficiency(results: list[dict]) -> None:
    base = {(r["seed"], r["transport"]): r["samples_per_s"] for r in results if r["replicas"] == 1}
    for r in results:
        one = base.get((r["seed"], r["transport"]))
        r["efficiency"] = r["samples_per_s"] / (r["replicas"] * one) if one else None


def table(results: list[dict]) -> str:
    def cell(rs, key, fmt):
        vals = [r[key] for r in rs if r.get(key) is not None]
        if not vals:
            return "-"
        return f"{fmt.format(statistics.median(vals))} ({fmt.format(min(vals))}-{fmt.format(max(vals))})"

    lines = ["| transport | replicas | samples/s | efficiency | step s (median) | publish s | wait rollouts s "
             "| driver CPU s per step |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for transport in dict.fromkeys(r["transport"] for r in results):
        for n in sorted({r["replicas"] for r in results}):
            rs = [r for r in results if r["transport"] == transport and r["replicas"] == n]
            if rs:
                lines.append(f"| {transport} | {n} | {cell(rs, 'samples_per_s', '{:.0f}')} | "
                             f"{cell(rs, 'efficiency', '{:.3f}')} | {cell(rs, 'step_s', '{:.3f}')} | "
                             f"{cell(rs, 'publish_s', '{:.3f}')} | {cell(rs, 'wait_rollouts_s', '{:.3f}')} | "
                             f"{cell(rs, 'driver_cpu_s', '{:.3f}')} |")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted({r["replicas"] for r in results})
    if len(counts) < 2:
        return  # no curve to draw
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for transport in dict.fromkeys(r["transport"] for r in results):
        rs = [r for r in results if r["transport"] == transport]
        for ax, key in zip(axes, ("samples_per_s", "efficiency", "publish_s")):
            med = [statistics.median([r[key] for r in rs if r["replicas"] == n and r.get(key) is not None] or [float("nan")])
                   for n in counts]
            ax.plot(counts, med, "o-", label=transport)
            ax.scatter([r["replicas"] for r in rs], [r[key] for r in rs], s=8, alpha=0.4)
    ones = [r["samples_per_s"] for r in results if r["replicas"] == 1]
    if ones:  # a file of one replica count has no baseline
        axes[0].plot(counts, [statistics.median(ones) * n for n in counts], "k--", label="ideal (linear)")
    axes[1].axhline(0.9, color="grey", ls=":", label="goal 0.9")
    for ax, title in zip(axes, ("samples/s (steady state)", "efficiency vs linear", "weight publish s (to all replicas)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(n) for n in counts])
        ax.set_xlabel("generator replicas")
        ax.set_title(title)
        ax.legend()
    axes[0].set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--transports", nargs="+", choices=["object_store", "collective"],
                        default=["object_store", "collective"])
    parser.add_argument("--nodes", type=int, default=4, help="fake worker nodes for the generators")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--skip", type=int, default=3, help="warm-up steps left out")
    parser.add_argument("--gen-s", type=float, default=1.0, help="seconds per generate call")
    parser.add_argument("--train-s", type=float, default=0.25, help="seconds the learner sleeps per step")
    parser.add_argument("--prompts-per-replica", type=int, default=4)
    parser.add_argument("--generators-per-verifier", type=int, default=None, metavar="N",
                        help="roles.verifier.replicas = ceil(replicas / N) (default: coevo's own default)")
    parser.add_argument("--collective-seeds", type=int, nargs="*", default=[0],
                        help="seeds that also run weights.transport=collective (each sweep starts 63 actors)")
    parser.add_argument("--label", default="")
    parser.add_argument("--table", type=Path, help="print the table of an existing results file and exit")
    parser.add_argument("extra", nargs="*", help="overrides for every run (after --)")
    args = parser.parse_args()
    if args.table:
        data = json.loads(args.table.read_text())
        print(table(data["results"]))
        plot(data["results"], args.table.with_suffix(".png"))
        return
    if max(args.replicas) > MAX_REPLICAS:
        parser.error(f"--replicas: at most {MAX_REPLICAS} (the fake nodes hold {MAX_REPLICAS} generators)")
    path = raw_path(f"orchestration_scaling{args.label}.json")
    results, t0 = [], time.perf_counter()

    def save() -> None:  # after every run: a sweep cut short keeps what it measured
        add_efficiency(results)
        path.write_text(json.dumps({
            "machine": f"{os.cpu_count()} CPUs {platform.machine()}, "
                       f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB",
            "nodes": 1 + args.nodes, "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "total_s": time.perf_counter() - t0, "results": results}, indent=1))

    cluster = start_cluster(args.nodes, args.gen_s, args.train_s)
    try:
        with tempfile.TemporaryDirectory(prefix="orch-scaling-") as tmp:
            for seed in args.seeds:
                for n in args.replicas:
                    for transport in args.transports:
                        if transport == "collective" and seed not in args.collective_seeds:
                            continue
                        out = Path(tmp) / f"r{n}-s{seed}-{transport}"
                        results.append(run_once(args, cluster.address, n, seed, transport, out))
                        print(json.dumps(results[-1]), flush=True)
                        save()
    finally:
        import ray

        ray.shutdown()
        cluster.shutdown()
    print(table(results))
    plot(results, path.with_suffix(".png"))
    summary = write_summary("orchestration_scaling", path.stem, table(results), raw=[path, path.with_suffix(".png")],
                            protocol=(f"replicas {args.replicas}, seeds {args.seeds} (collective: {args.collective_seeds}), "
                                      f"{1 + args.nodes} nodes, {args.steps} steps ({args.skip} skipped), generate "
                                      f"{args.gen_s} s, train {args.train_s} s, {args.prompts_per_replica} prompts a replica"))
    print(f"raw results: {path}\nplot: {path.with_suffix('.png')}\nsummary: {summary}")

if __name__ == "__main__":
    main()
