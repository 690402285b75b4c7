"""The policy as its own judge, trained online (SPARK's pointwise, pairwise and reflective modes; SPC
when a recipe `spc` is registered) against GRPO on the same budget of steps, with the verifier
withheld from the policy's reward on most prompts (`verifier.fraction`, as the Cooper experiment):
SPARK's judge rewards the unlabelled prompts (`aggregate.fill`), GRPO gets nothing there.

    python benchmarks/self_judges.py                                  # every recipe, seeds 0 1 2
    python benchmarks/self_judges.py --recipes grpo spark_pairwise --seeds 0 --steps 20 --label _smoke
    python benchmarks/self_judges.py -- algorithm.lr=2e-4             # overrides for every run

Every run starts from the same warm checkpoint (the default recipe's cached SFT warm-up) on the same
exported train and held-out files; the seed changes sampling and prompt order only. Runs are
interleaved (every recipe for seed 0, then seed 1, ...). Reported: held-out greedy accuracy (the
verifier's), the judge's AUROC against the verifier on sampled responses to held-out prompts
(`eval/judge_auroc`) and on each batch's labelled rows (`spark/batch_auroc`), wall time and the
machine's load. Raw results: benchmarks/results/raw/self_judges<label>.json (rewritten after every run),
plot: benchmarks/results/raw/self_judges<label>.png; the table goes to its section of the summary
benchmarks/results/self_judges.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coevolve import coevo, evals, median_range, save_plot  # noqa: E402
from summary import raw_path, write as write_summary  # noqa: E402

JUDGE_REWARDS = "rewards=[{name: integer_match}, {name: judge, judge: true, weight: 0}]"
# recipe -> (config file, overrides): the verifier where it labelled the prompt, else nothing (GRPO)
# or the policy's own judgment (SPARK)
RECIPES = {
    "grpo": ("grpo_addition", ["rewards=[{name: integer_match}]", "algorithm.advantage=grpo"]),
    **{f"spark_{mode}": ("spark", [f"spark.mode={mode}", JUDGE_REWARDS, "aggregate.fill={integer_match: judge}"])
       for mode in ("pointwise", "pairwise", "reflective")},
    "spc": ("spc", []),  # another recipe's own config; it reports the same eval/judge_auroc
}


def common(args, seed: int, warm: Path, train: Path, eval_: Path) -> list[str]:
    """What every recipe shares: the warm checkpoint, files, batch shape, optimiser and budget."""
    return [f"seed={seed}", "data.task=null", f"data.path={train}", f"data.eval_path={eval_}",
            "data.prompt_template='{prompt}'", f"model.path={warm}", "warmup.enabled=false",
            f"rollout.prompts_per_step={args.prompts}", "rollout.samples_per_prompt=8", "rollout.max_new_tokens=5",
            "algorithm.advantage=grpo", "algorithm.lr=1.0e-4", "algorithm.kl_coef=0.0",
            f"verifier.fraction={args.fraction}", f"train.max_steps={args.steps}",
            f"train.eval_every={args.eval_every}", "train.stop_at_accuracy=null", "train.checkpoint_every=0"]


def available(name: str) -> bool:
    from orchestrator.recipes import RECIPES as REGISTERED

    recipe = name.split("_")[0]
    return recipe in REGISTERED.names() and (Path(__file__).resolve().parents[1] / "pipelines" /
                                             f"{RECIPES[name][0]}.yaml").is_file()


def isolate_ray() -> None:
    """Every run starts its own local Ray cluster in a directory of its own: without this, `ray.init`
    on a shared machine finds other users' clusters under /tmp/ray and joins the newest one."""
    for key in [k for k in os.environ if k.startswith("RAY_")]:
        del os.environ[key]
    os.environ.update({"RAY_TMPDIR": tempfile.mkdtemp(prefix="sj-", dir="/tmp"), "RAY_USAGE_STATS_ENABLED": "0"})


def summarise(run: dict) -> dict:
    rows = run["rows"]
    acc = evals(rows)
    auroc = [(s, a) for s, _, a in evals(rows, "eval/judge_auroc")]
    batch = [r["spark/batch_auroc"] for r in rows if r.get("spark/batch_auroc") is not None]
    return {"final_accuracy": acc[-1][2] if acc else None, "best_accuracy": max((a for *_, a in acc), default=None),
            "judge_auroc_first": auroc[0][1] if auroc else None, "judge_auroc_last": auroc[-1][1] if auroc else None,
            "batch_auroc_last10": sum(batch[-10:]) / len(batch[-10:]) if batch else None,
            "wall_s": run["wall_s"], "train_s": run["summary"].get("time/train_s"), "load_avg": run["load_avg"]}


def table(runs: dict) -> str:
    lines = ["| recipe | seeds | final held-out acc | best | judge AUROC (held-out) first -> last "
             "| batch AUROC (last 10 steps) | train s |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, rs in runs.items():
        ok = [summarise(r) for r in rs if "error" not in r]
        if not ok:
            continue
        col = lambda k: median_range([s[k] for s in ok])  # noqa: E731
        lines.append(f"| {name} | {len(ok)} | {col('final_accuracy')} | {col('best_accuracy')} | "
                     f"{col('judge_auroc_first')} -> {col('judge_auroc_last')} | {col('batch_auroc_last10')} | "
                     f"{col('train_s')} |")
    return "\n".join(lines)


def plot(runs: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_a, ax_j) = plt.subplots(1, 2, figsize=(11, 3.8))
    for k, (name, rs) in enumerate(runs.items()):
        color = f"C{k}"
        for i, r in enumerate(x for x in rs if "error" not in x):
            e = evals(r["rows"])
            ax_a.plot([s for s, *_ in e], [a for *_, a in e], color=color, alpha=0.7, label=name if i == 0 else None)
            j = evals(r["rows"], "eval/judge_auroc")
            if j:
                ax_j.plot([s for s, *_ in j], [a for *_, a in j], color=color, marker="o", markersize=3, alpha=0.7,
                          label=name if i == 0 else None)
    ax_a.set_title("held-out accuracy (verifier)")
    ax_j.set_title("judge AUROC against the verifier (held-out samples)")
    ax_j.axhline(0.5, color="grey", lw=0.8, ls="--")
    save_plot(fig, (ax_a, ax_j), path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--prompts", type=int, default=32, help="rollout.prompts_per_step of every run")
    parser.add_argument("--eval-prompts", type=int, default=64, help="spark.eval_prompts: held-out prompts the "
                        "judge is measured on")
    parser.add_argument("--fraction", type=float, default=0.25, help="verifier.fraction of every run")
    parser.add_argument("--label", default="")
    parser.add_argument("--report", action="store_true", help="only print the table and redraw the plot "
                        "from the raw results of an earlier (or unfinished) run")
    parser.add_argument("extra", nargs="*", help="overrides for every run (after --)")
    args = parser.parse_args()
    from vs_trl import export_splits, warm_checkpoint

    if args.report:
        runs = json.loads(raw_path(f"self_judges{args.label}.json").read_text())["runs"]
        print(table(runs))
        plot(runs, raw_path(f"self_judges{args.label}.png"))
        return

    names = []
    for name in args.recipes:
        if available(name):
            names.append(name)
        else:
            print(f"skipping {name}: no recipe {name.split('_')[0]!r} with pipelines/{RECIPES[name][0]}.yaml "
                  "in this checkout", flush=True)
    isolate_ray()
    out = raw_path(f"self_judges{args.label}.json")
    runs: dict[str, list] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="self-judges-") as tmp:
        work = Path(tmp)
        warm, warm_info = warm_checkpoint(None, work)
        train, eval_, split_info = export_splits(work)
        meta = {"machine": f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}",
                "python": platform.python_version(), "argv": sys.argv[1:], "warm": str(warm),
                "warm_info": warm_info, "splits": split_info}
        for seed in args.seeds:
            for name in names:
                config, overrides = RECIPES[name]
                tag = f"{name}_{seed}"
                own = [f"spark.eval_prompts={args.eval_prompts}"] if name.startswith("spark") else []
                try:
                    run = coevo(config, [*common(args, seed, warm, train, eval_), *overrides, *own, *args.extra],
                                work / tag, work / f"{tag}.log")
                except RuntimeError as e:  # one failed recipe (say a new one) does not end the comparison
                    log = (work / f"{tag}.log").read_text(errors="replace")[-3000:]
                    run = {"config": config, "seed": seed, "error": str(e), "log_tail": log}
                    print(f"{tag}: FAILED\n{log}", flush=True)
                run["seed"] = seed
                runs[name].append(run)
                if "error" not in run:
                    s = summarise(run)
                    print(f"{tag}: final acc {s['final_accuracy']}, judge AUROC {s['judge_auroc_first']} -> "
                          f"{s['judge_auroc_last']}, {s['wall_s']:.0f} s, load {s['load_avg']:.1f}", flush=True)
                out.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1, default=str))
    print("\n" + table(runs))
    plot(runs, out.with_suffix(".png"))
    summary = write_summary("self_judges", out.stem, table(runs), raw=[out, out.with_suffix(".png")], protocol=(
        f"seeds {args.seeds}, {args.steps} steps of {args.prompts} prompts, eval every {args.eval_every}, "
        f"{args.eval_prompts} judge eval prompts, verifier.fraction {args.fraction}; overrides {args.extra or 'none'}"))
    print(f"\nraw results: {out}\nsummary: {summary}")


if __name__ == "__main__":
    main()
