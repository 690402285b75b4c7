"""Per-step wall time of `coevo run`, A/B between two code trees or two settings, interleaved.

Each arm is NAME=DIR[:key=value,key=value]: DIR is a checkout of coevo put first on PYTHONPATH (so
the driver and every Ray worker import it), the overrides apply to that arm only. Every run starts
from the same warm checkpoint with the warm-up off, trains a fixed number of steps (no stop at a
target, no checkpoint but the final one) with the same seed, so both arms do the same work when
their maths agree (the script checks the held-out accuracies match and says so when they do not).
Rounds alternate the arms.

    git worktree add /tmp/coevo-before <commit>
    python benchmarks/step_time_ab.py --rounds 3 --steps 100 before=/tmp/coevo-before \\
        after=.:algorithm.advantage=grpo

Per run: all-in milliseconds per step (first step's start to the last step's end, evaluations and
bookkeeping included, over the steps) and the medians of the per-stage times. Writes
benchmarks/results/raw/step_time_ab_<label>.json and its section of the summary
benchmarks/results/step_time_ab.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runs import coevo_command, offline_env, warm_checkpoint  # noqa: E402
from summary import raw_path, write as write_summary  # noqa: E402

STAGES = ("step", "wait_rollouts", "generate", "verify", "credit", "learn", "learner", "publish", "eval", "driver_cpu")


def parse_arm(text: str) -> tuple[str, Path, list[str]]:
    name, sep, rest = text.partition("=")
    if not sep or not name:
        raise ValueError(f"arm {text!r}: write NAME=DIR[:key=value,...]")
    where, _, overrides = rest.partition(":")
    path = Path(where).expanduser().resolve()
    if not (path / "orchestrator" / "cli.py").is_file():
        raise ValueError(f"arm {name!r}: {path} is not a coevo checkout (no orchestrator/cli.py)")
    return name, path, [o for o in overrides.split(",") if o]


def one_run(name: str, path: Path, overrides: list[str], args, warm: Path, out: Path) -> dict:
    cmd = [*coevo_command(), "run", "--output-dir", str(out), "--seed", str(args.seed), f"model.path={warm}",
           "warmup.enabled=false", f"train.max_steps={args.steps}", "train.stop_at_accuracy=null",
           "train.checkpoint_every=0", *overrides]
    env = offline_env(PYTHONPATH=str(path))
    done = subprocess.run(cmd, cwd=tempfile.gettempdir(), env=env, capture_output=True, text=True)
    if done.returncode:
        return {"arm": name, "error": f"exit {done.returncode}", "log_tail": (done.stdout + done.stderr)[-3000:]}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    start = rows[0]["time_s"] - rows[0]["time/step_s"]
    wall = rows[-1]["time_s"] + rows[-1].get("time/eval_s", 0.0) - start
    stages = {k: round(1000 * statistics.median(r[f"time/{k}_s"] for r in rows if f"time/{k}_s" in r), 2)
              for k in STAGES if any(f"time/{k}_s" in r for r in rows)}
    return {"arm": name, "per_step_ms": round(1000 * wall / len(rows), 2), "stage_ms": stages,
            "accuracies": [r["eval/accuracy"] for r in rows if r.get("eval/accuracy") is not None]}


def table(summary: dict) -> str:
    """Per arm: ms a step, median (range) over rounds, and the medians of the stage times (ms)."""
    stages = list(dict.fromkeys(k for s in summary.values() for k in s["stage_ms"]))
    return "\n".join([f"| arm | ms a step | {' | '.join(stages)} |", "|---|---:|" + "---:|" * len(stages),
                      *(f"| {name} | {s['per_step_ms']['median']:.1f} ({s['per_step_ms']['min']:.1f}-"
                        f"{s['per_step_ms']['max']:.1f}) | " + " | ".join(
                            f"{s['stage_ms'][k]:.1f}" if k in s["stage_ms"] else "-" for k in stages) + " |"
                        for name, s in summary.items())])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("arms", nargs=2, metavar="NAME=DIR[:OVERRIDES]")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warm", help="warm checkpoint (default: the default recipe's cached warm-up)")
    p.add_argument("--label", default="ab")
    args = p.parse_args()
    try:
        arms = [parse_arm(a) for a in args.arms]
    except ValueError as e:
        p.error(str(e))
    work = Path(tempfile.mkdtemp(prefix="coevo-ab-"))
    warm, _ = warm_checkpoint(args.warm, work)
    runs = []
    for r in range(args.rounds):
        for name, path, overrides in arms:
            run = one_run(name, path, overrides, args, warm, work / f"{name}-{r}")
            run["round"] = r
            runs.append(run)
            print(json.dumps(run)[:400], flush=True)
    summary = {}
    for name, _, _ in arms:
        ok = [x for x in runs if x["arm"] == name and "error" not in x]
        if ok:
            per = [x["per_step_ms"] for x in ok]
            summary[name] = {"per_step_ms": {"median": statistics.median(per), "min": min(per), "max": max(per)},
                             "stage_ms": {k: statistics.median(x["stage_ms"][k] for x in ok if k in x["stage_ms"])
                                          for k in ok[0]["stage_ms"]}}
    accs = {tuple(x["accuracies"]) for x in runs if "error" not in x}
    same = len(accs) == 1
    out = raw_path(f"step_time_ab_{args.label}.json")
    out.write_text(json.dumps({"benchmark": "step_time_ab", "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                               "arms": [{"name": n, "path": str(d), "overrides": o} for n, d, o in arms],
                               "steps": args.steps, "seed": args.seed, "warm": str(warm), "same_accuracies": same,
                               "cpus": len(os.sched_getaffinity(0)), "summary": summary, "runs": runs}, indent=1))
    for name, s in summary.items():
        m = s["per_step_ms"]
        print(f"{name}: {m['median']:.1f} ms a step ({m['min']:.1f}-{m['max']:.1f}); stages " +
              ", ".join(f"{k} {v:.1f}" for k, v in s["stage_ms"].items()))
    print("held-out accuracies: " + ("the same in every run" if same else "DIFFER between runs (not the same maths)"))
    summary_md = write_summary("step_time_ab", out.stem, table(summary), raw=[out], protocol=(
        f"{args.rounds} rounds x {args.steps} steps, seed {args.seed}, arms alternating; arms " +
        "; ".join(f"{n}={d}{':' + ','.join(o) if o else ''}" for n, d, o in arms) +
        f"; held-out accuracies {'the same in every run' if same else 'DIFFER between runs'}"))
    print(f"wrote {out} and {summary_md}", file=sys.stderr)
    return 0 if all("error" not in x for x in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
