"""RL from one warm start, several seeds and settings: how much RL lifts held-out accuracy when the
warm-up is held fixed (the SFT warm-up costs most of a cold run on a loaded CPU; a warm start taken
from it lets the seeds and settings differ in RL alone).

WARM is a finished warm-up's model directory (a `warmup.json` beside the weights: a warm-up cache
entry, e.g. from `coevo run` or benchmarks/default_job.py); its held-out greedy accuracy is the warm
start. Each run is `coevo run [RECIPE] model.path=WARM warmup.enabled=false seed=N <setting>`, through
benchmarks/learning_curve.py's `run_once`, interleaved per seed; the table is benchmarks/default_job.py's.

    python benchmarks/rl_from_warm.py --warm ~/.cache/coevo/warmup/<hash> --label lora \\
        --setting full= --setting lora='learner.lora="{r: 16, alpha: 32}" algorithm.lr=1e-3'
    python benchmarks/rl_from_warm.py --recipe math_word --warm <its warm-up> --label math_word --setting rl=
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from default_job import parse_settings, record, table  # noqa: E402
from learning_curve import machine_info, run_once  # noqa: E402
from summary import raw_path, write as write_summary  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--warm", type=Path, required=True, help="a warm-up's model directory (with warmup.json)")
    p.add_argument("--recipe", help="a recipe name or YAML file (default: the default job)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--setting", action="append", default=[], metavar='NAME="KEY=VALUE ..."')
    p.add_argument("--label", required=True, help="results: rl_from_warm_<label>.json and its summary section")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("overrides", nargs="*", help="coevo run overrides for every setting")
    args = p.parse_args(argv)
    info = json.loads((args.warm / "warmup.json").read_text())
    warm = info["warmup/accuracy"]
    settings = parse_settings(args.setting, p)
    fixed = [f"model.path={args.warm.resolve()}", "model.bpe=null", "warmup.enabled=false"]
    rows, machine = [], machine_info()
    out = raw_path(f"rl_from_warm_{args.label}.json")
    for seed in (int(s) for s in args.seeds.split(",")):
        for name, overrides in settings.items():
            run = run_once(len(rows) + 1, [*fixed, f"seed={seed}", *overrides, *args.overrides], 0.5, None,
                           args.timeout, recipe=args.recipe)
            run["warm_start_accuracy"] = warm
            rows.append(record(name, seed, run))
            r = rows[-1]
            print(f"[{name or 'default'} seed {seed}] {warm} -> {r['final_accuracy']} in {r['grpo_steps']} steps; "
                  f"{r['wall_s']:.1f} s, load {r['load_avg_before'][0]:.1f}", file=sys.stderr, flush=True)
            md = table(rows)
            out.write_text(json.dumps({"benchmark": "rl_from_warm", "argv": sys.argv[1:],
                                       "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                       "warm": str(args.warm), "warm_info": info, "recipe": args.recipe,
                                       "settings": settings, "overrides": args.overrides, "machine": machine,
                                       "table_markdown": md, "runs": rows}, indent=1, default=str))
            write_summary("rl_from_warm", args.label, md, raw=[out], protocol=(
                f"`coevo run {args.recipe or ''}` from one warm start ({args.warm.name}: held-out greedy accuracy "
                f"{warm:.3f} after {info.get('warmup/steps')} SFT steps, seed {info.get('seed', '?')}), warm-up off; "
                f"per seed every setting, interleaved; settings {settings}, overrides {args.overrides or 'none'}"))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
