"""The control-plane refactor of issue 16 (stages, learner objectives, role kinds, recipe-owned
settings) must not move any recipe's numbers. In deterministic CPU mode (one generator, on-policy,
one torch thread per actor) a run is bit-reproducible, so a short run of each recipe with the code
before the refactor and after it must log the same per-step values.

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
    "prime": [],
    "cooper": ["reward_model.warmup_steps=10"],
    "laser": ["laser.warmup_steps=5", "laser.warmup_prompts=64", "laser.eval_prompts=16"],
    "self_rewarding": ["judge.warmup_steps=5", "iterations.iterations=1", "iterations.prompts=32",
                       "iterations.epochs=2", "iterations.batch_pairs=4"],
}
FIELDS = ("reward/mean", "reward/std", "train/loss", "train/grad_norm", "samples/response_length", "version",
          "eval/accuracy", "rm/loss", "prm/loss", "dpo/loss", "train/pairs")


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
    return {"seconds": time.perf_counter() - start,
            "rows": [{k: r[k] for k in FIELDS if k in r} | {"step": r["step"]} for r in rows]}


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
            results[recipe] = {"identical": same, **got}
            print(f"{recipe}: {'identical' if same else 'DIFFERENT'} "
                  f"({len(got['after'].get('rows', []))} steps)", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    rows = [{"recipe": r, "steps": len(v["after"].get("rows", [])), "per-step values": "identical" if v["identical"]
             else "DIFFERENT"} for r, v in results.items()]
    write_summary("refactor_equivalence", args.out.stem, "| recipe | steps | per-step values |\n|---|---:|---|\n" +
                  "\n".join(f"| `{r['recipe']}` | {r['steps']} | {r['per-step values']} |" for r in rows),
                  raw=[args.out], protocol=f"before {args.before}, after {args.after}; fields {', '.join(FIELDS)}")


if __name__ == "__main__":
    main()
