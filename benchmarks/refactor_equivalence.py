"""A refactor must not move any recipe's numbers (issue 16: stages, learner objectives, role kinds,
recipe-owned settings; issue 30: credit assignment out of the learner, into the driver's credit
step). In deterministic CPU mode (one generator, on-policy, one torch thread per actor) a run is
bit-reproducible, so a short run of each recipe with the code before the refactor and after it
must log the same per-step values: the FIELDS below, and every other numeric metric the two runs
share except times, speeds and busy fractions, with the summary's warm-up results (`all_same`).
Keys only one side logs are listed.

    python benchmarks/refactor_equivalence.py --before /path/to/old/checkout --after .

Each checkout needs a Python that imports its own code (its `.venv/bin/python`). Writes
benchmarks/results/raw/refactor_equivalence.json and its section of the summary
benchmarks/results/refactor_equivalence.md."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from summary import RAW, write as write_summary  # noqa: E402

# the same short setting for every recipe: 1-digit addition, small batches, a short warm-up
SMALL = ["data.arithmetic.digits=1", "data.eval_size=32", "rollout.prompts_per_step=8",
         "rollout.samples_per_prompt=4", "rollout.max_new_tokens=3", "train.stop_at_accuracy=null",
         "ray.num_cpus=2", "train.threads=1", "warmup.target_accuracy=0.25", "warmup.eval_every=25",
         "warmup.max_steps=300", "train.max_steps=4", "train.eval_every=2", "train.checkpoint_every=0"]
RECIPES = {
    "grpo_addition": [],
    "ppo": [],
    "prime": [],
    "cooper": ["reward_model.warmup_steps=10"],
    "laser": ["laser.warmup_steps=5", "laser.warmup_prompts=64", "laser.eval_prompts=16"],
    "dph": ["dph.prompts=8", "dph.samples=2", "dph.batch=8"],
    "spark": ["spark.per_update=16", "spark.eval_prompts=16"],
    "spc": ["spc.games_per_step=4"],
    "self_rewarding": ["judge.warmup_steps=5", "iterations.iterations=1", "iterations.prompts=32",
                       "iterations.epochs=2", "iterations.batch_pairs=4"],
}
FIELDS = ("reward/mean", "reward/std", "train/loss", "train/grad_norm", "samples/response_length", "version",
          "eval/accuracy", "rm/loss", "prm/loss", "dpo/loss", "train/pairs", "train/advantage_abs_mean",
          "train/pg_loss", "train/kl", "value/loss", "train/laser_mse", "train/laser_c", "rehearsal/divergence",
          "self_judge/loss", "sneaky/train/loss", "critic/expected_reward")
# what varies from run to run in deterministic mode too: wall times, speeds, busy fractions
NOT_COMPARED = ("time", "perf/", "throughput/", "role/", "channel/", "eval/time", "prm/time", "rm/time")


def run(checkout: Path, recipe: str, extra: list[str], cache: Path, out: Path) -> dict:
    python = checkout / ".venv" / "bin" / "python"
    cmd = [str(python), "-m", "orchestrator.cli", "run", str(checkout / "pipelines" / f"{recipe}.yaml"),
           "--output-dir", str(out), *SMALL, *extra, f"warmup.cache_dir={cache}"]
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True, timeout=1500)
    if proc.returncode != 0:
        return {"error": proc.stdout[-3000:] + proc.stderr[-3000:]}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary = json.loads((out / "summary.json").read_text())
    return {"seconds": time.perf_counter() - start,
            "rows": [{k: r[k] for k in FIELDS if k in r} | {"step": r["step"]} for r in rows],
            # the summary's warm-up results (accuracies, LaSeR's c, AUROCs) and the last evaluation
            "all": [{k: v for k, v in r.items() if compared(k, v)} for r in rows]
            + [{k: v for k, v in summary.items() if compared(k, v) and not k.startswith("samples/")}]}


def compared(key: str, value) -> bool:
    return (isinstance(value, (int, float)) or value is None) and not key.startswith(NOT_COMPARED) \
        and not key.endswith(("_s", "latency_ms", "_per_s"))


def all_same(before: list[dict], after: list[dict]) -> tuple[bool, list[str], list[str]]:
    """Whether every metric both sides log is equal at every step; the keys that differ; the keys
    only one side logs (`<` before only, `>` after only)."""
    differ, only = set(), set()
    for b, a in zip(before, after):
        differ |= {k for k in b.keys() & a.keys() if b[k] != a[k]}
        only |= {f"< {k}" for k in b.keys() - a.keys()} | {f"> {k}" for k in a.keys() - b.keys()}
    return len(before) == len(after) and not differ, sorted(differ), sorted(only)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, default=Path("."))
    parser.add_argument("--recipes", nargs="*", default=list(RECIPES))
    parser.add_argument("--out", type=Path, default=RAW / "refactor_equivalence.json")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="equiv-") as tmp:
        for recipe in args.recipes:
            got = {}
            for side, checkout in (("before", args.before), ("after", args.after)):
                # each side its own cold warm-up cache: the warm-ups are part of what is compared
                got[side] = run(checkout.resolve(), recipe, RECIPES[recipe], Path(tmp) / side / "cache",
                                Path(tmp) / side / recipe)
            same = ("rows" in got["before"] and got["before"].get("rows") == got["after"].get("rows"))
            every, differ, only = all_same(got["before"].get("all", []), got["after"].get("all", [])) \
                if "rows" in got["before"] and "rows" in got["after"] else (False, [], [])
            compared_keys = len(set().union(*got["after"].get("all", [{}])))
            results[recipe] = {"identical": same, "all_identical": every, "differ": differ, "only_one_side": only,
                               **got}
            print(f"{recipe}: fields {'identical' if same else 'DIFFERENT'}, all {compared_keys} metrics "
                  f"{'identical' if every else 'DIFFERENT ' + str(differ)} ({len(got['after'].get('rows', []))} steps)"
                  + (f"; only one side: {only}" if only else "")
                  + "".join(f"\n  {side} failed: {got[side]['error'][-600:]}" for side in got if "error" in got[side]),
                  flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    rows = [{"recipe": r, "steps": len(v["after"].get("rows", [])), "per-step values": "identical" if v["identical"]
             else "DIFFERENT"} for r, v in results.items()]
    write_summary("refactor_equivalence", args.out.stem, "| recipe | steps | per-step values |\n|---|---:|---|\n" +
                  "\n".join(f"| `{r['recipe']}` | {r['steps']} | {r['per-step values']} |" for r in rows),
                  raw=[args.out], protocol=f"before {args.before}, after {args.after}; fields {', '.join(FIELDS)}")


if __name__ == "__main__":
    main()
