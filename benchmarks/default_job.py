"""Does the default job (`coevo run`, pipelines/grpo_addition.yaml) show RL doing the work?

For each seed, a cold run (empty warm-up cache: Ray start, SFT warm-up, GRPO) of `coevo run --seed N`
through benchmarks/learning_curve.py's `run_once`, which also samples the run's memory and the
machine's load. Records per seed the warm start's held-out greedy accuracy (where the SFT warm-up
stopped, the accuracy GRPO starts from), the end's, the lift, GRPO and warm-up steps, and wall time;
prints a table with median and range and writes benchmarks/results/raw/default_job[_<label>].json and
its section of the summary benchmarks/results/default_job.md.

    python benchmarks/default_job.py                                   # the default, seeds 0-2
    python benchmarks/default_job.py --setting lr3e-4="algorithm.lr=3e-4" --setting now=""
    python benchmarks/default_job.py --seeds 0 -- train.stop_at_accuracy=null train.max_steps=200
    python benchmarks/default_job.py --merge results/raw/default_job_seed1.json results/raw/default_job_seed2.json
    python benchmarks/default_job.py --recipe math_word --label math_word     # another recipe, cold

With several `--setting NAME="OVERRIDES"`, the runs are interleaved (for each seed, every setting),
so that a change of the machine's load hits all settings alike. Overrides after `--` apply to all.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning_curve import machine_info, run_once  # noqa: E402
from summary import raw_path, write as write_summary  # noqa: E402

LIFT = 0.15  # the least held-out gain over the warm start that shows RL doing the work


def record(setting: str, seed: int, run: dict) -> dict:
    """The numbers of one run that answer the question, beside the raw record."""
    warm, end = run.get("warm_start_accuracy"), run.get("final_accuracy")
    return {"setting": setting, "seed": seed, "warm_start_accuracy": warm, "final_accuracy": end,
            "lift": None if warm is None or end is None else end - warm,
            "grpo_steps": run.get("steps"), "warmup_steps": run.get("warmup_steps"),
            "wall_s": run["wall_s"], "warmup_s": run.get("warmup_s"), "grpo_s": run.get("grpo_s"),
            "load_avg_before": run["load_avg_before"], "load_avg_after": run["load_avg_after"],
            "cpu_s_run_tree": run["cpu_s_run_tree"], "cpu_s_other_processes": run["cpu_s_other_processes"],
            "error": run.get("error"),
            "eval_curve": run.get("eval_curve")}


def spread(values: list, digits: int = 1) -> str:
    """median (min-max); integers stay integers."""
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    if all(isinstance(v, int) for v in vals):
        digits = 0
    return f"{statistics.median(vals):.{digits}f} ({min(vals):.{digits}f}-{max(vals):.{digits}f})"


def table(rows: list[dict]) -> str:
    """Per setting: each seed's warm start -> end, then medians and ranges."""
    lines = ["| setting | seed: warm start -> end | lift, median (min) | GRPO steps | warm-up steps | wall s | "
             "load avg (1 min) |", "|---|---|---:|---:|---:|---:|---:|"]
    for name in dict.fromkeys(r["setting"] for r in rows):
        mine = sorted((r for r in rows if r["setting"] == name), key=lambda r: r["seed"])
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        per_seed = " / ".join(f"{r['seed']}: {fmt(r['warm_start_accuracy'])} -> {fmt(r['final_accuracy'])}"
                              for r in mine)
        lifts = [r["lift"] for r in mine if r["lift"] is not None]
        lift = f"{statistics.median(lifts):.3f} ({min(lifts):.3f})" if lifts else "-"
        lines.append(f"| {name or 'default'} | {per_seed} | {lift} | {spread([r['grpo_steps'] for r in mine])} | "
                     f"{spread([r['warmup_steps'] for r in mine])} | {spread([r['wall_s'] for r in mine])} | "
                     f"{spread([r['load_avg_before'][0] for r in mine])} |")
    return "\n".join(lines)


def write(label: str | None, report: dict) -> Path:
    out = raw_path(f"default_job_{label}.json" if label else "default_job.json")
    out.write_text(json.dumps(report, indent=1, default=str))
    summary = write_summary("default_job", out.stem, report["table_markdown"], raw=[out], protocol=(
        f"cold `coevo run {report.get('recipe') or ''}` per seed (empty warm-up cache); settings {report.get('settings', 'merged')}, "
        f"overrides {report.get('overrides') or 'none'}"))
    print(f"\nwrote {out} and {summary}", file=sys.stderr)
    return out


def merge(paths: list[Path], label: str | None) -> int:
    """One report from several (e.g. one invocation per seed): the runs side by side, each file's
    own argv and machine kept."""
    reports = [json.loads(p.read_text()) for p in paths]
    rows = [r for rep in reports for r in rep["runs"]]
    md = table(rows)
    print(md)
    same = lambda key: reports[0].get(key) if all(r.get(key) == reports[0].get(key) for r in reports) else "mixed"  # noqa: E731
    write(label, {"benchmark": "default_job", "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "merged_from": [{"file": p.name, "argv": rep["argv"], "created": rep["created"],
                                   "machine": rep["machine"]} for p, rep in zip(paths, reports)],
                  "recipe": same("recipe"), "overrides": same("overrides"),
                  "min_lift": LIFT, "table_markdown": md, "runs": rows})
    return 0 if all(r["lift"] is not None and r["lift"] >= LIFT for r in rows) else 1


def parse_settings(items: list[str], parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """`--setting NAME="KEY=VALUE ..."` items as {name: overrides}; none: one setting without overrides."""
    settings = {}
    for item in items or ["="]:
        name, sep, overrides = item.partition("=")
        if not sep:
            parser.error(f"--setting {item!r}: expected NAME=\"KEY=VALUE ...\" (NAME= for no overrides)")
        settings[name] = shlex.split(overrides)
    return settings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--setting", action="append", default=[], metavar='NAME="KEY=VALUE ..."',
                   help="a setting to compare (repeatable); runs are interleaved per seed")
    p.add_argument("--label", help="results file suffix: default_job_<label>.json")
    p.add_argument("--recipe", help="a recipe name or YAML file (default: the default job)")
    p.add_argument("--timeout", type=float, default=900, help="per-run limit, seconds")
    p.add_argument("--interval", type=float, default=0.5, help="memory sampling period, seconds")
    p.add_argument("--merge", nargs="+", type=Path, metavar="JSON",
                   help="run nothing: combine the runs of these result files into one (--label names it)")
    p.add_argument("overrides", nargs="*", help="coevo run overrides for every setting")
    args = p.parse_args(argv)
    if args.merge:
        return merge(args.merge, args.label)
    settings = parse_settings(args.setting, p)
    rows, machine = [], machine_info()
    for seed in (int(s) for s in args.seeds.split(",")):
        for name, overrides in settings.items():
            run = run_once(len(rows) + 1, [f"seed={seed}", *overrides, *args.overrides], args.interval, None,
                           args.timeout, recipe=args.recipe)
            rows.append(record(name, seed, run))
            r = rows[-1]
            print(f"[{name or 'default'} seed {seed}] warm start {r['warm_start_accuracy']} -> "
                  f"{r['final_accuracy']} in {r['grpo_steps']} GRPO steps; {r['wall_s']:.1f} s, "
                  f"load {r['load_avg_before'][0]:.1f}", file=sys.stderr, flush=True)
            md = table(rows)  # written after every run: a long benchmark cut short keeps what it measured
            write(args.label, {
                "benchmark": "default_job", "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "argv": sys.argv[1:], "recipe": args.recipe, "settings": settings, "overrides": args.overrides, "min_lift": LIFT,
                "machine": machine, "table_markdown": md, "runs": rows})
    print(md)
    ok = all(r["lift"] is not None and r["lift"] >= LIFT for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
