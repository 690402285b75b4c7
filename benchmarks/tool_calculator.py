"""The agentic recipe (pipelines/tool_calculator.yaml: 4-digit multiplication with a calculator) with
and without its tool, and single-turn GRPO on the same budget.

All runs start from one warm checkpoint: the recipe's cached warm-up (made once if missing; it
demonstrates the tool protocol on warmup.data, never on a 4-digit x 4-digit product), passed as
`model.path` with the warm-up off. Per seed, three conditions:

- `tools`: the recipe as it is (episodes with the calculator);
- `no_tools`: `env.args.available=false`, the same episodes with every call answered by an error;
- `single_turn`: `env.name=null`, plain one-response GRPO with a turn budget of env.max_tokens
  (the policy's tool call is then just text): the time per step of the same budget without episodes.

    python benchmarks/tool_calculator.py                       # seeds 0-2, 30 steps
    python benchmarks/tool_calculator.py --seeds 0 --steps 10 -- rollout.prompts_per_step=8

Writes benchmarks/results/raw/tool_calculator.json (every run's curve) and its section of
benchmarks/results/tool_calculator.md. Runs one at a time, interleaved by seed (tools, no_tools,
single_turn for seed 0, then seed 1, ...), so the three conditions share the machine's load alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
from runs import coevo_command, offline_env, read_jsonl, run_logged  # noqa: E402
from summary import raw_path, write as write_summary  # noqa: E402

RECIPE = ROOT / "pipelines" / "tool_calculator.yaml"
CONDITIONS = {"tools": [], "no_tools": ["env.args.available=false"], "single_turn": ["env.name=null"]}
KEYS = ("step", "time_s", "time/step_s", "time/generate_s", "time/learn_s", "samples/response_length",
        "time/eval_s", "eval/accuracy", "reward/mean", "env/tool_call_ok_frac",
        "eval/env/tool_call_ok_frac", "eval/env/tool_calls_mean", "env/turns_mean", "env/observation_token_frac")


def warm_start(work: Path) -> tuple[Path, dict]:
    """The recipe's cached warm model (running its warm-up once if missing)."""
    from orchestrator.config import load_config
    from pipelines.stages.sft import cached

    config = load_config(str(RECIPE))
    path, info = cached(config)
    if path is None:
        log = work / "warmup.log"
        print(f"warming up once (log: {log})", file=sys.stderr, flush=True)
        cmd = [*coevo_command(), "run", str(RECIPE), "train.max_steps=1", "--output-dir", str(work / "warmup-run")]
        rc = run_logged(cmd, log, 3600)["rc"]
        path, info = cached(config)
        if rc != 0 or path is None:
            sys.exit(f"error: the warm-up run failed (exit {rc}); log tail:\n{log.read_text()[-3000:]}")
    return Path(path), info


def run(condition: str, seed: int, warm: Path, args, work: Path) -> dict:
    from orchestrator.config import load_config

    env = load_config(str(RECIPE)).env
    run_dir = work / f"{condition}-seed{seed}"
    extra = [f"rollout.max_new_tokens={env.max_tokens}"] if condition == "single_turn" else []
    cmd = [*coevo_command(), "run", str(RECIPE), "--output-dir", str(run_dir), "--seed", str(seed),
           f"model.path={warm}", "warmup.enabled=false", f"train.max_steps={args.steps}",
           f"train.eval_every={args.eval_every}", "train.checkpoint_every=0",
           *CONDITIONS[condition], *extra, *args.overrides]
    log = work / f"{condition}-seed{seed}.log"
    out = {"condition": condition, "seed": seed, "command": cmd, **run_logged(cmd, log, args.timeout, offline_env())}
    rc = out.pop("rc")
    metrics = run_dir / "metrics.jsonl"
    if rc != 0 or not metrics.is_file():
        return {**out, "error": f"coevo run exited {rc}", "log_tail": log.read_text(errors="replace")[-4000:]}
    rows = read_jsonl(metrics)
    summary = run_dir / "summary.json"
    return {**out, **score(rows), "summary": json.loads(summary.read_text()) if summary.is_file() else {}}


def score(rows: list[dict]) -> dict:
    evals = [r for r in rows if r.get("eval/accuracy") is not None]
    steps = [r["time/step_s"] for r in rows[1:] if r.get("time/step_s") is not None]  # step 1 pays start-up
    first = lambda key: next((r[key] for r in rows if r.get(key) is not None), None)  # noqa: E731
    last = lambda key: next((r[key] for r in reversed(rows) if r.get(key) is not None), None)  # noqa: E731
    return {"steps": rows[-1]["step"], "first_accuracy": evals[0]["eval/accuracy"] if evals else None,
            "final_accuracy": evals[-1]["eval/accuracy"] if evals else None,
            "best_accuracy": max((r["eval/accuracy"] for r in evals), default=None),
            "first_call_ok": first("eval/env/tool_call_ok_frac"), "final_call_ok": last("eval/env/tool_call_ok_frac"),
            "reward_first": rows[0].get("reward/mean"), "reward_last5": statistics.mean(
                [r["reward/mean"] for r in rows[-5:] if r.get("reward/mean") is not None] or [float("nan")]),
            "step_s_median": statistics.median(steps) if steps else None,
            "generate_s_median": _median(rows[1:], "time/generate_s"),
            "learn_s_median": _median(rows[1:], "time/learn_s"),
            "response_tokens_median": _median(rows[1:], "samples/response_length"),
            "curve": [{k: r[k] for k in KEYS if r.get(k) is not None} for r in rows]}


def _median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def med(values: list, f: str = "{:.3f}") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    m = f.format(statistics.median(values))
    return m if len(values) == 1 else f"{m} ({f.format(min(values))}-{f.format(max(values))})"


def table(runs: list[dict]) -> str:
    lines = ["| condition | runs | held-out acc, first eval | final | best | tool calls ok (eval), first -> final | "
             "train reward, step 1 -> last 5 | s/step | generate s/step | learn s/step | response tokens |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in CONDITIONS:
        ok = [r for r in runs if r["condition"] == c and "error" not in r]
        failed = sum(1 for r in runs if r["condition"] == c and "error" in r)
        if not ok and not failed:
            continue
        lines.append(f"| {c} | {len(ok)}{f' ({failed} failed)' if failed else ''} | "
                     f"{med([r['first_accuracy'] for r in ok])} | {med([r['final_accuracy'] for r in ok])} | "
                     f"{med([r['best_accuracy'] for r in ok])} | {med([r['first_call_ok'] for r in ok])} -> "
                     f"{med([r['final_call_ok'] for r in ok])} | {med([r['reward_first'] for r in ok])} -> "
                     f"{med([r['reward_last5'] for r in ok])} | {med([r['step_s_median'] for r in ok], '{:.2f}')} | "
                     f"{med([r.get('generate_s_median') for r in ok], '{:.2f}')} | "
                     f"{med([r.get('learn_s_median') for r in ok], '{:.2f}')} | "
                     f"{med([r.get('response_tokens_median') for r in ok], '{:.1f}')} |")
    return "\n".join(lines)


def call_correctness(paths: list[Path]) -> str:
    """Greedy episodes of each checkpoint on the recipe's held-out problems: how many first turns
    are exactly the right call (`<calc>a*b</calc>`), how many answers are right, and how many of
    the right calls end in a right answer (the result copied out)."""
    import numpy as np

    from actors.envs.episodes import BackendPolicy, run_episodes
    from actors.envs.make import make_environment
    from actors.envs.turns import turn_format
    from actors.generation.hf import HFBackend
    from actors.modeling import load_model, load_tokenizer
    from orchestrator.config import load_config
    from orchestrator.data import load_prompts

    config = load_config(str(RECIPE))
    rows = load_prompts(config.data, config.seed).eval.to_pylist()
    lines = ["| checkpoint | held-out | exact calls | right answers | right answers of exact calls |",
             "|---|---:|---:|---:|---:|"]
    for path in paths:
        backend = HFBackend(load_model(path), load_tokenizer(path))
        fmt = turn_format(backend.tokenizer, list(backend.eos_ids))
        prompts = [np.asarray(i, np.int32) for i in
                   backend.tokenizer([r["prompt"] for r in rows], add_special_tokens=False)["input_ids"]]
        episodes = run_episodes(BackendPolicy(backend, fmt.ends, greedy=True),
                                [make_environment(config.env, r) for r in rows], prompts, fmt, backend.tokenizer,
                                config.env.max_turns, config.env.max_tokens, config.rollout.max_new_tokens,
                                config.env.observation_tokens)
        exact = [e.texts[0] == f"<calc>{r['prompt'].rstrip('=')}</calc>" for r, e in zip(rows, episodes)]
        right = [e.answer.strip() == r["answer"] for r, e in zip(rows, episodes)]
        lines.append(f"| {path} | {len(rows)} | {sum(exact)} | {sum(right)} | "
                     f"{sum(a and b for a, b in zip(exact, right))} of {sum(exact)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Anything after -- is passed to every `coevo run` last (so it wins).")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--conditions", nargs="+", default=list(CONDITIONS), choices=list(CONDITIONS))
    p.add_argument("--warm", type=Path, help="warm checkpoint (default: the recipe's cached warm-up)")
    p.add_argument("--timeout", type=float, default=1200, help="per-run limit, seconds")
    p.add_argument("--work", type=Path, help="run directories and logs (default: a temporary folder)")
    p.add_argument("--summarise", type=Path, metavar="JSON",
                   help="write the summary of a results file this script wrote (runs cut short included)")
    p.add_argument("--calls", type=Path, nargs="+", metavar="CHECKPOINT",
                   help="print the exact-call and right-answer counts of these checkpoints (greedy, held-out)")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    if args.calls:
        text = call_correctness(args.calls)
        print(text)
        write_summary("tool_calculator", "tool-call correctness", text, protocol=(
            "greedy episodes of each checkpoint on the recipe's held-out problems; the first turn against the "
            "exact call <calc>a*b</calc>"))
        return 0
    out_path = raw_path("tool_calculator.json")
    if args.summarise:
        saved = json.loads(args.summarise.read_text())
        for r in saved["runs"]:  # scored again from the run directory where it is still there
            metrics = Path(r["command"][r["command"].index("--output-dir") + 1]) / "metrics.jsonl"
            if "error" not in r and metrics.is_file():
                r.update(score(read_jsonl(metrics)))
        summarise(saved["runs"], Path(saved["warm"]), argparse.Namespace(**{**vars(args), **{
            k: saved["args"][k] for k in ("steps", "eval_every", "seeds", "overrides")}}), args.summarise)
        return 0
    work = args.work or Path(tempfile.mkdtemp(prefix="coevo-tool-calc-"))
    work.mkdir(parents=True, exist_ok=True)
    warm, info = (args.warm, {}) if args.warm else warm_start(work)
    runs: list[dict] = []
    for seed in args.seeds:
        for condition in args.conditions:
            r = run(condition, seed, warm, args, work)
            runs.append(r)
            print(f"{condition} seed {seed}: " + (r["error"] if "error" in r else
                  f"acc {r['first_accuracy']} -> {r['final_accuracy']}, {r['step_s_median']:.2f} s/step"), flush=True)
            out_path.write_text(json.dumps({"warm": str(warm), "warmup": info, "args": vars(args) | {
                "warm": str(warm), "work": str(work)}, "runs": runs}, indent=1, default=str))
    summarise(runs, warm, args, out_path)
    return 0


def summarise(runs: list[dict], warm: Path, args, out_path: Path) -> None:
    text = table(runs)
    print(text)
    done = sorted({(r["condition"], r["seed"]) for r in runs})
    write_summary("tool_calculator", f"{args.steps} steps", text, raw=[out_path], protocol=(
        f"pipelines/tool_calculator.yaml from its cached warm-up ({warm.name}), {args.steps} steps, "
        f"eval every {args.eval_every} (greedy, held-out 4-digit products); conditions run one at a time, "
        f"interleaved by seed; medians (min-max) over seeds; runs: "
        f"{', '.join(f'{c} s{s}' for c, s in done)}; overrides {args.overrides or 'none'}"))


if __name__ == "__main__":
    sys.exit(main())
