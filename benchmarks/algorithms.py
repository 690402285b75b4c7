"""Every RL algorithm coevo ships, side by side on the default task (issue 20): GRPO, PSR (GRPO's
positive half, the default recipe's), Dr.GRPO, RLOO, REINFORCE++ (and its group-baseline variant), PPO
with a critic and GAE, DAPO, GSPO, CISPO, GMPO, TOPR and DPH-RL.

Every run starts from the SAME warm checkpoint (the default recipe's cached SFT warm-up, made once if
missing; `--warm DIR` for another), passed to `coevo run` as `model.path` with the warm-up off, so the
`ppo` and `dph` recipes start from it too; all read the same exported train and held-out JSONL files
(benchmarks/vs_trl.py's protocol: 32 prompts x 8 samples a step, lr 1e-4, temperature 1, 5 new tokens,
no KL). Each run trains `--steps` steps (150) without stopping at 0.8, and the verifier measures
greedy held-out accuracy every 5 steps. Runs are interleaved: for seed in seeds, for method in methods.

    python benchmarks/algorithms.py                                  # all methods, seeds 0-2, 150 steps
    python benchmarks/algorithms.py --seeds 0 --steps 10 --label smoke
    python benchmarks/algorithms.py --methods grpo dapo -- algorithm.lr=2e-4   # extra overrides last
    python benchmarks/algorithms.py --render benchmarks/results/raw/algorithms_a.json algorithms_b.json

Per run: steps and wall time (first step's start to the end of that evaluation) to the first held-out
accuracy >= 0.8, the best accuracy, the final entropy estimate (`train/neg_logprob`: the sampled tokens'
mean negative log-prob, mean of the last 5 steps), the diversity (`samples/distinct_per_group`: distinct
responses among a prompt's 8 samples, mean of the last 5 steps) and the wall time. The raw results are
rewritten to benchmarks/results/raw/algorithms<label>.json after every run (a partial run is kept); the
markdown table (medians and ranges over seeds) goes to stdout and, with the protocol, to the summary
benchmarks/results/algorithms.md (summary.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runs import coevo_command, export_splits, read_jsonl, run_logged, warm_checkpoint  # noqa: E402
from summary import raw_path, write as write_summary  # noqa: E402
from vs_trl import EVAL_EVERY, coevo_overrides, coevo_source, machine_info  # noqa: E402

TARGET = 0.8
TAIL = 5  # steps averaged for the final entropy and diversity

# method -> (recipe file, overrides after the shared protocol). Paper settings (docs/recipes.md): with
# one on-policy update per batch (mini_batches=1) every ratio is 1, so clip ranges change nothing here;
# what differs is the advantage, the loss aggregation and the gradient's form.
# The default recipe's own advantage is psr, so every GRPO-based method names its advantage.
GRPO = "algorithm.advantage=grpo"
METHODS: dict[str, tuple[str, list[str]]] = {
    "grpo": ("grpo_addition", [GRPO]),
    "psr": ("grpo_addition", ["algorithm.advantage=psr"]),
    "dr_grpo": ("grpo_addition", ["algorithm.advantage=dr_grpo"]),
    "rloo": ("grpo_addition", ["algorithm.advantage=rloo"]),
    "reinforce_pp": ("grpo_addition", ["algorithm.advantage=reinforce_pp"]),
    "reinforce_pp_baseline": ("grpo_addition", ["algorithm.advantage=reinforce_pp_baseline"]),
    "ppo_gae": ("ppo", ["algorithm.advantage=gae"]),
    # DAPO's four parts; the overlong window is the last token of the 5 (a truncated response)
    "dapo": ("grpo_addition", [GRPO, "algorithm.clip_eps_high=0.28", "algorithm.loss_agg=token_mean",
                               "rollout.dynamic_sampling=true",
                               "rewards=[{name: integer_match}, {name: overlong, fn: overlong_penalty, "
                               "args: {max_length: 5, cache_length: 1}}]",
                               "verifier.accuracy_source=integer_match"]),
    "gspo": ("grpo_addition", [GRPO, "algorithm.policy_loss=gspo", "algorithm.clip_eps=3e-4",
                               "algorithm.clip_eps_high=4e-4"]),
    "cispo": ("grpo_addition", [GRPO, "algorithm.policy_loss=cispo"]),
    "gmpo": ("grpo_addition", [GRPO, "algorithm.policy_loss=gmpo", "algorithm.clip_eps=0.4"]),
    "topr": ("grpo_addition", [GRPO, "algorithm.policy_loss=topr"]),
    "dph": ("dph", []),
}
CURVE_KEYS = ("step", "time_s", "time/step_s", "time/eval_s", "eval/accuracy", "reward/mean", "train/loss",
              "train/clip_frac", "train/grad_norm", "train/neg_logprob", "train/advantage_abs_mean",
              "samples/distinct_per_group", "samples/uniform_reward_groups_frac", "samples/dropped/uniform_reward",
              "rehearsal/divergence", "critic/grad_norm", "critic/loss")


def run_method(method: str, seed: int, args, shared: list[str], work: Path) -> dict:
    """One `coevo run` of `method`; its record (or an error with the log's tail)."""
    recipe, overrides = METHODS[method]
    run_dir = work / f"{method}-seed{seed}"
    cmd = [*coevo_command(), "run", recipe, "--output-dir", str(run_dir), "--seed", str(seed),
           *shared, *overrides, *args.overrides]
    log = work / f"{method}-seed{seed}.log"
    out = {"method": method, "seed": seed, "recipe": recipe, "overrides": overrides, "command": cmd,
           **run_logged(cmd, log, args.timeout)}
    rc = out.pop("rc")
    metrics = run_dir / "metrics.jsonl"
    if rc != 0 or not metrics.is_file():
        return {**out, "error": f"coevo run exited {rc}", "log_tail": log.read_text(errors="replace")[-4000:]}
    rows = read_jsonl(metrics)
    summary_path = run_dir / "summary.json"
    return {**out, **score(rows), "summary": json.loads(summary_path.read_text()) if summary_path.is_file() else {},
            "log_head": log.read_text(errors="replace")[:3000]}


def score(rows: list[dict], target: float = TARGET) -> dict:
    """The table's numbers from a run's metrics rows."""
    evals = [r for r in rows if r.get("eval/accuracy") is not None]
    first_start = rows[0]["time_s"] - rows[0]["time/step_s"]  # time_s is taken after the step's update
    hit = next((r for r in evals if r["eval/accuracy"] >= target), None)
    tail = rows[-TAIL:]

    def tail_mean(key: str) -> float | None:
        vals = [r[key] for r in tail if r.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    return {
        "steps": rows[-1]["step"],
        "steps_to_target": hit["step"] if hit else None,
        "wall_to_target_s": hit["time_s"] + hit.get("time/eval_s", 0.0) - first_start if hit else None,
        "best_accuracy": max((r["eval/accuracy"] for r in evals), default=None),
        "first_eval": {"step": evals[0]["step"], "accuracy": evals[0]["eval/accuracy"]} if evals else None,
        "final_accuracy": evals[-1]["eval/accuracy"] if evals else None,
        "final_entropy": tail_mean("train/neg_logprob"),
        "start_entropy": rows[0].get("train/neg_logprob"),
        "final_distinct_per_group": tail_mean("samples/distinct_per_group"),
        "start_distinct_per_group": rows[0].get("samples/distinct_per_group"),
        "train_wall_s": rows[-1]["time_s"] + rows[-1].get("time/eval_s", 0.0) - first_start,
        "curve": [{k: r[k] for k in CURVE_KEYS if r.get(k) is not None} for r in rows],
    }


def median_range(values: list, f: str = "{:.3f}") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    med = f.format(statistics.median(values))
    return med if len(values) == 1 else f"{med} ({f.format(min(values))}-{f.format(max(values))})"


def table(runs: list[dict], methods: list[str], target: float = TARGET) -> str:
    """One row per method, medians (ranges) over seeds; ranked by steps to the target (runs that do
    not reach it count as never), then by best accuracy."""
    steps = sorted({r["steps"] for r in runs if "error" not in r})
    rows = []
    for m in methods:
        ok = [r for r in runs if r["method"] == m and "error" not in r]
        errors = sum(1 for r in runs if r["method"] == m and "error" in r)
        if not ok and not errors:
            continue
        reached = [r for r in ok if r["steps_to_target"] is not None]
        # a median over all seeds, a run that never reached the target counting as infinitely slow
        steps_key = statistics.median([r["steps_to_target"] or float("inf") for r in ok]) if ok else float("inf")
        bests = [r["best_accuracy"] for r in ok if r["best_accuracy"] is not None]
        best = statistics.median(bests) if bests else 0.0
        rows.append(((steps_key, -best), m, ok, reached, errors))
    rows.sort(key=lambda x: x[0])
    lines = [f"| rank | method | runs reaching {target:g} | steps to {target:g} | s to {target:g} | "
             f"best acc ({'/'.join(map(str, steps))} steps) | final acc | "
             "entropy start -> end | distinct/group start -> end | run s |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for rank, (_, m, ok, reached, errors) in enumerate(rows, 1):
        n = f"{len(reached)}/{len(ok)}" + (f" ({errors} failed)" if errors else "")
        lines.append(
            f"| {rank} | {m} | {n} | {median_range([r['steps_to_target'] for r in reached], '{:.0f}')} | "
            f"{median_range([r['wall_to_target_s'] for r in reached], '{:.0f}')} | "
            f"{median_range([r['best_accuracy'] for r in ok])} | {median_range([r['final_accuracy'] for r in ok])} | "
            f"{median_range([r['start_entropy'] for r in ok], '{:.2f}')} -> "
            f"{median_range([r['final_entropy'] for r in ok], '{:.2f}')} | "
            f"{median_range([r['start_distinct_per_group'] for r in ok], '{:.1f}')} -> "
            f"{median_range([r['final_distinct_per_group'] for r in ok], '{:.1f}')} | "
            f"{median_range([r['train_wall_s'] for r in ok], '{:.0f}')} |")
    return "\n".join(lines)


def saved_runs(path: Path) -> list[dict]:
    """The runs of a results file this script wrote."""
    try:
        runs = json.loads(path.read_text())["runs"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"error: {path}: not a results file of benchmarks/algorithms.py ({type(e).__name__}: {e})")
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Anything after -- is passed to every `coevo run` last (so it wins).")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--warm", help="warm checkpoint (HF directory); default: the default recipe's cached warm-up")
    p.add_argument("--timeout", type=float, default=1800, help="per-run limit, seconds")
    p.add_argument("--label", default="", help="results file suffix: algorithms<label>.json")
    p.add_argument("--keep", type=Path, help="keep the data files, logs and run directories here")
    p.add_argument("--render", nargs="+", type=Path, metavar="JSON",
                   help="run nothing: print the table of these results files together (e.g. two halves run apart)")
    p.add_argument("--at-step", type=int, metavar="N", help="with --render: each run's numbers up to step N")
    p.add_argument("overrides", nargs="*", help="extra coevo run overrides (after --)")
    args = p.parse_args(argv)
    if args.render:
        runs = [r for path in args.render for r in saved_runs(path)]
        if args.at_step:  # every run's numbers as of that step (runs of different lengths, compared alike)
            runs = [{**r, **score([c for c in r["curve"] if c["step"] <= args.at_step])} if "curve" in r else r
                    for r in runs]
        print(table(runs, [m for m in METHODS if any(r["method"] == m for r in runs)]))
        return 0

    work = Path(args.keep or tempfile.mkdtemp(prefix="coevo-algorithms-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    out = raw_path(f"algorithms{args.label}.json")
    warm, warm_info = warm_checkpoint(args.warm, work)
    train, eval_, data_info = export_splits(work)
    shared = [*coevo_overrides(warm, train, eval_, args.steps, TARGET), "train.stop_at_accuracy=null"]
    print(f"warm checkpoint: {warm} (held-out accuracy {warm_info.get('warmup/accuracy')})", file=sys.stderr, flush=True)
    report = {"benchmark": "algorithms", "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "protocol": {"steps": args.steps, "target": TARGET, "eval_every": EVAL_EVERY, "seeds": args.seeds,
                           "methods": args.methods, "order": "for seed in seeds: for method in methods",
                           "shared_overrides": shared, "extra_overrides": args.overrides},
              "warm_checkpoint": str(warm), "warm_info": warm_info, "data": data_info,
              "machine": machine_info(), "coevo_source": coevo_source(), "runs": []}
    for seed in args.seeds:
        for method in args.methods:
            r = run_method(method, seed, args, shared, work)
            report["runs"].append(r)
            report["table_markdown"] = table(report["runs"], args.methods)
            out.write_text(json.dumps(report, indent=1, default=str))  # after every run: a partial run is kept
            if "error" in r:
                print(f"[{method} seed {seed}] FAILED: {r['error']}\n{r['log_tail'][-2000:]}", file=sys.stderr, flush=True)
            else:
                print(f"[{method} seed {seed}] first eval {r['first_eval']}  best {r['best_accuracy']:.3f}  "
                      f"to {TARGET}: {r['steps_to_target']} steps  {r['train_wall_s']:.0f}s  "
                      f"load {r['load_1min_mean']}", file=sys.stderr, flush=True)
    print(report["table_markdown"])
    summary = write_summary("algorithms", out.stem, report["table_markdown"], raw=[out], protocol=(
        f"{args.steps} steps, seeds {args.seeds}, target {TARGET}, warm start {warm_info.get('warmup/accuracy', float('nan')):.3f} "
        f"held-out accuracy; extra overrides {args.overrides or 'none'}"))
    print(f"\nraw results: {out}\nsummary: {summary}", file=sys.stderr)
    return 0 if all("error" not in r for r in report["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
