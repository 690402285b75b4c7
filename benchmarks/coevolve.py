"""Co-evolving policy and reward model, measured (issue: reward-model actors, a second learner).

    python benchmarks/coevolve.py rm        # Bradley-Terry RM on verifier-labelled pairs; GRPO on it alone
    python benchmarks/coevolve.py hacking   # frozen vs co-evolving (cooper) reward model, seeds 0-2
    python benchmarks/coevolve.py prime     # PRIME vs outcome-only GRPO (RLOO), equal steps, seeds 0-2

Each experiment runs `coevo run` as a subprocess (embedded Ray, this machine's CPUs), reads the run's
metrics.jsonl and writes raw numbers to benchmarks/results/raw/coevolve_<experiment>.json, a plot to
benchmarks/results/raw/coevolve_hacking.png, and a markdown table to stdout and to the summary
benchmarks/results/coevolve.md. Extra `key=value`
overrides after the experiment go to every run (options first:
`coevolve.py --label _dr hacking algorithm.advantage=dr_grpo`). Held-out accuracy is always the verifier's greedy accuracy on
the held-out prompts, which no run trains on.
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
sys.path.insert(0, str(ROOT / "benchmarks"))
from runs import coevo_command  # noqa: E402
from summary import raw_path, write as write_summary  # noqa: E402

COEVO = coevo_command()  # the installed script, else the module (a source tree not pip-installed)


def coevo(config: str, overrides: list[str], out: Path, log: Path) -> dict:
    """One run; returns its summary, metrics rows and wall time."""
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.run([*COEVO, "run", config, *overrides, "--output-dir", str(out)], stdout=f,
                              stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"coevo run {config} {' '.join(overrides)} failed ({proc.returncode}); see {log}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    summary = json.loads((out / "summary.json").read_text())
    return {"config": config, "overrides": overrides, "wall_s": wall, "summary": summary, "rows": rows,
            "load_avg": os.getloadavg()[0]}


def variants_cli(doc: str, variants: dict[str, list[str]]) -> argparse.Namespace:
    """The command line of a variants-by-seeds benchmark (process_hacking.py, reward_layer.py)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", default=list(variants), choices=list(variants))
    parser.add_argument("--label", default="")
    parser.add_argument("extra", nargs="*", help="overrides for every run (after --)")
    return parser.parse_args()


def run_variants(config: str, variants: dict[str, list[str]], args: argparse.Namespace) -> dict[str, list]:
    """Every chosen variant for one seed before the next seed (interleaved, so machine noise hits all
    variants alike); returns variant -> runs in seed order."""
    runs: dict[str, list] = {v: [] for v in args.variants}
    with tempfile.TemporaryDirectory(prefix=f"coevo-{config}-") as tmp:
        work = Path(tmp)
        for seed in args.seeds:
            for i, v in enumerate(args.variants):
                runs[v].append(coevo(config, [f"seed={seed}", *variants[v], *args.extra],
                                     work / f"{i}_{seed}", work / f"{i}_{seed}.log"))
    return runs


def evals(rows: list[dict], key: str = "eval/accuracy") -> list[tuple[int, float, float]]:
    return [(r["step"], r["time_s"], r[key]) for r in rows if r.get(key) is not None]


def median_range(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def seed_of(run: dict) -> int | None:
    return next((int(o.split("=", 1)[1]) for o in run.get("overrides", []) if o.startswith("seed=")), None)


def table_rm(result: dict) -> str:
    acc = evals(result["reward_model"]["rows"], "eval/pair_accuracy")
    lines = ["### Bradley-Terry reward model on verifier-labelled pairs", "",
             "| step | held-out pair accuracy |", "|---:|---:|", *(f"| {step} | {a:.3f} |" for step, _, a in acc),
             "", "### GRPO with the reward model as the only reward", "",
             "| seed | warm-start accuracy | final accuracy | best | reward (rm) first -> last |", "|---:|---:|---:|---:|---:|"]
    for r in result["grpo_with_rm"]:
        e = evals(r["rows"])
        lines.append(f"| {seed_of(r)} | {r['summary'].get('warmup/accuracy', float('nan')):.3f} | {e[-1][2]:.3f} | "
                     f"{max(a for _, _, a in e):.3f} | "
                     f"{r['rows'][0]['reward/rm/mean']:.3f} -> {r['rows'][-1]['reward/rm/mean']:.3f} |")
    return "\n".join(lines)


def table_hacking(runs: dict) -> str:
    lines = ["### Frozen versus co-evolving reward model (same start, same seeds)", "",
             "| run | seed | held-out acc start | held-out acc end | best | rm reward first -> last |",
             "|---|---:|---:|---:|---:|---:|"]
    for name in runs:
        for r in runs[name]:
            e = evals(r["rows"])
            rm = [x["reward/rm/mean"] for x in r["rows"] if x.get("reward/rm/mean") is not None]
            lines.append(f"| {name} | {seed_of(r)} | {r['summary'].get('warmup/accuracy', e[0][2]):.3f} | {e[-1][2]:.3f} | "
                         f"{max(a for _, _, a in e):.3f} | {rm[0]:.3f} -> {rm[-1]:.3f} |")
    lines.append("")
    lines += [f"- {name}: final held-out accuracy, median (range): "
              f"{median_range([evals(r['rows'])[-1][2] for r in runs[name]])}" for name in runs]
    return "\n".join(lines)


def table_prime(runs: dict) -> str:
    lines = ["### PRIME versus outcome-only GRPO (RLOO advantages), equal steps", "",
             "| run | seed | final acc | RL wall s | s / step | acc at the other's wall time |", "|---|---:|---:|---:|---:|---:|"]
    for g, p in zip(runs["grpo_rloo"], runs["prime"]):
        for name, r, other in (("grpo_rloo", g, p), ("prime", p, g)):
            e = evals(r["rows"])
            t_other = evals(other["rows"])[-1][1]
            at = [a for _, t, a in e if t <= t_other]
            lines.append(f"| {name} | {seed_of(r)} | {e[-1][2]:.3f} | {r['summary']['time/train_s']:.1f} | "
                         f"{r['summary']['time/train_s'] / len(r['rows']):.3f} | {at[-1] if at else float('nan'):.3f} |")
    return "\n".join(lines)


TABLES = {"rm": table_rm, "hacking": table_hacking, "prime": table_prime}


# ---- experiments -------------------------------------------------------------------------------------
def exp_rm(args, work: Path) -> dict:
    """A reward model from verifier-labelled pairs of the warm policy's samples; then GRPO whose only
    reward is that reward model (the verifier, weight 0, only measures)."""
    if args.rm_dir:  # a reward model trained earlier (its run's metrics.jsonl sits beside it, if kept)
        rm_dir = Path(args.rm_dir)
        metrics = rm_dir / "metrics.jsonl"
        rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
        rm = {"config": "reward_model", "reused": str(rm_dir), "rows": rows}
    else:
        rm = coevo("reward_model", [f"train.max_steps={args.rm_steps}", "train.eval_every=10", *args.extra],
                   work / "rm", work / "rm.log")
        rm_dir = Path(rm["summary"]["final_checkpoint"]) / "rm_learner"
    runs = []
    for seed in args.seeds:
        runs.append(coevo("grpo_addition", [
            f"rewards=[{{name: rm, model: '{rm_dir}'}}, {{name: correct, fn: integer_match, weight: 0}}]",
            "verifier.accuracy_source=correct", "algorithm.advantage=grpo", "train.stop_at_accuracy=null",
            f"train.max_steps={args.steps}",
            f"seed={seed}", *args.extra, *args.grpo.split()], work / f"grpo_rm_{seed}", work / f"grpo_rm_{seed}.log"))
    result = {"reward_model": rm, "grpo_with_rm": runs}
    print(table_rm(result))
    return result


def exp_hacking(args, work: Path) -> dict:
    """Same starting reward model (`model: auto`, a short warm-up on few pairs), same seeds: frozen
    (recipe grpo) versus co-evolving (recipe cooper); the verifier labels a fraction of prompts."""
    runs = {"frozen": [], "cooper": []}
    for seed in args.seeds:
        for name, recipe in (("frozen", "grpo"), ("cooper", "cooper")):
            runs[name].append(coevo("cooper", [f"recipe={recipe}", f"seed={seed}", f"train.max_steps={args.steps}",
                                               *args.extra], work / f"{name}_{seed}", work / f"{name}_{seed}.log"))
    print(table_hacking(runs))
    plot_hacking(runs, raw_path(f"coevolve_hacking{args.label}.png"))
    return runs


def plot_hacking(runs: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_a) = plt.subplots(1, 2, figsize=(11, 3.8))
    colors = {"frozen": "tab:red", "cooper": "tab:blue"}
    for name, rs in runs.items():
        for i, r in enumerate(rs):
            steps = [x["step"] for x in r["rows"] if x.get("reward/rm/mean") is not None]
            rm = [x["reward/rm/mean"] for x in r["rows"] if x.get("reward/rm/mean") is not None]
            ax_r.plot(steps, rm, color=colors[name], alpha=0.7, label=name if i == 0 else None)
            e = evals(r["rows"])
            ax_a.plot([s for s, _, _ in e], [a for _, _, a in e], color=colors[name], marker="o", markersize=3,
                      alpha=0.7, label=name if i == 0 else None)
    ax_r.set_title("reward-model score of the policy's samples")
    ax_a.set_title("held-out accuracy (verifier, never trained on)")
    save_plot(fig, (ax_r, ax_a), path)


def save_plot(fig, axes, path: Path) -> None:
    """Shared finish of the two-panel plots: x label, grid, legend, save, close."""
    import matplotlib.pyplot as plt

    for ax in axes:
        ax.set_xlabel("policy step")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def exp_prime(args, work: Path) -> dict:
    runs = {"grpo_rloo": [], "prime": []}
    for seed in args.seeds:
        common = [f"seed={seed}", f"train.max_steps={args.steps}", "train.stop_at_accuracy=null", *args.extra]
        runs["grpo_rloo"].append(coevo("grpo_addition", ["algorithm.advantage=rloo", *common],
                                       work / f"grpo_{seed}", work / f"grpo_{seed}.log"))
        runs["prime"].append(coevo("prime", common, work / f"prime_{seed}", work / f"prime_{seed}.log"))
    print(table_prime(runs))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiment", choices=["rm", "hacking", "prime"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rm-steps", type=int, default=100)
    parser.add_argument("--rm-dir", help="rm: reuse this reward model instead of training one")
    parser.add_argument("--grpo", default="", help="rm: overrides for the GRPO runs only, space-separated")
    parser.add_argument("--label", default="")
    parser.add_argument("extra", nargs="*", help="overrides for every run (after --)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="coevolve-") as tmp:
        work = Path(tmp)
        result = {"rm": exp_rm, "hacking": exp_hacking, "prime": exp_prime}[args.experiment](args, work)
    meta = {"machine": f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}",
            "python": platform.python_version(), "argv": sys.argv[1:]}
    path = raw_path(f"coevolve_{args.experiment}{args.label}.json")
    path.write_text(json.dumps({"meta": meta, "result": result}, indent=1, default=str))
    summary = write_summary("coevolve", path.stem, TABLES[args.experiment](result), raw=[path],
                            protocol=f"seeds {args.seeds}, {args.steps} RL steps; overrides {args.extra or 'none'}")
    print(f"\nraw results: {path}\nsummary: {summary}")


if __name__ == "__main__":
    main()
