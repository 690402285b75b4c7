"""Self-judging where labels are scarce (issue 32): the verifier labels a fraction f of the training
prompts (`verifier.fraction`); the baseline is GRPO on the labelled prompts only (the others give it
no reward); each self-judging or co-evolving recipe may also use the unlabelled prompts through its
judge (`aggregate.fill: {<verifier>: <judge>}`; self_rewarding pairs them by its judge). Same warm
start per task (the task's cached SFT warm-up), same exported train and held-out files, same steps of
the same batch shape; the seed changes sampling and prompt order only.

    python benchmarks/self_judges.py --task sorting --fractions 0.1 0.25          # every recipe, seeds 0 1 2
    python benchmarks/self_judges.py --task sorting --recipes grpo spark --seeds 0 --steps 10 --label _smoke
    python benchmarks/self_judges.py --task sorting --recipes spark --credit raw calibrated gated spread
    python benchmarks/self_judges.py --gap --task sorting                          # the verification gap only
    python benchmarks/self_judges.py --task sorting --report --label _x             # table from the raw file
    python benchmarks/self_judges.py --task sorting --fractions 0.1 --train-size 1000 --recipes grpo \
        -- verifier.labelled_share=1                      # GRPO drawing only the ~100 labelled prompts
    python benchmarks/self_judges.py --task sorting --fractions 0.1 --train-size 1000 --held-out 1000 \
        --steps 40 --credit gated --judge-task distill --judge-task-fraction 0.75 --recipes spc \
        -- algorithm.advantage=grpo_bernoulli algorithm.lr=5.0e-5 algorithm.kl_coef=0.1 \
        rollout.prompts_per_step=64 verifier.labelled_share=0.5 judge.warmup_samples=32 \
        judge.warmup_resample=25 spc.policy_items=128  # the judge's prompts on top of 32 labelled a step
    python benchmarks/self_judges.py ... --judge-separate --judge-online 128 --recipes self_judged_grpo -- ...
                                                          # its judge apart learning from 128 labelled rollouts a step

By default every recipe draws prompts as they come, so labelled ones make up `fraction` of a step and
GRPO gets nothing from the rest. `-- verifier.labelled_share=1` makes GRPO draw only the labelled
prompts (GRPO on the labelled prompts alone); a share below 1 gives a judging recipe that share of
labelled prompts a step and unlabelled ones for its judge. `--train-size N` shrinks the pool to the
train split's first N prompts, so the same fraction labels fewer of them (labels scarce in prompts,
not only in a step's share).

Recipes (each the shipped YAML's recipe with the scarce-label reward; `--credit` picks how judge
rewards enter the advantage, orchestrator/judge_credit.py):
  grpo              the baseline: the verifier's reward where it labels, nothing elsewhere
  self_judged_grpo  + the policy's own judgment (judging warm-up on labelled samples) elsewhere
  grpo_after_judge_warmup  the control: self_judged_grpo's warm-up and start, its judge not used (no fill)
  spark             + its judge, also trained online on the labelled rollouts (pointwise)
  laser             + LaSeR's last-token self-reward (its self-verification warm-up, labelled prompts;
                    its NLL on every sample, each kind at its share of the draw:
                    laser.warmup_nll_on=all)
  cooper            + a reward model (warm-up on labelled pairs) trained online on labelled pairs
  self_rewarding    DPO iterations on pairs: labels where they exist, the judge elsewhere
  spc               + the SPC critic (judging warm-up; trained on the game and the policy's labelled errors)
  grpo_oracle_fill  no recipe: the task's verifier itself fills the unlabelled prompts (a judge always
                    right; `--oracle-flip q`: wrong on a fixed share q of answers), what a judge could add
                    (benchmarks/oracle_fill.py)

Judging warm-ups see only the labelled prompts, and their task share repeats the policy's own greedy
answers (`judge.warmup_task=own`; `--judge-task own_samples`: its sampled answers), so no warm-up
teaches the task: each recipe's warm start (after its warm-ups) is reported beside the SFT warm
start. `--gap` measures the verification gap alone: the judge's held-out AUROC after its warm-up
against the policy's held-out accuracy, at equal labelled data. Raw results: benchmarks/results/raw/self_judges<label>.json (rewritten after every
run); the tables go to their section of benchmarks/results/self_judges.md (self_judges_h1k*.md for
those on 1,000 held-out prompts or more).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coevolve import coevo, evals, median_range  # noqa: E402
from summary import raw_path, write as write_summary  # noqa: E402

TASKS = {  # the task's recipe file (its data, warm-up), verifier and answer length
    "sorting": {"config": "grpo_sorting", "verifier": "sorted_digits", "max_new_tokens": 7},
    "addition": {"config": "grpo_addition", "verifier": "integer_match", "max_new_tokens": 5},
}
CREDIT = {  # how judge rewards enter the advantage (orchestrator/judge_credit.py)
    "raw": [],
    "calibrated": ["judge_credit.confidence=calibrated"],
    "gated": ["judge_credit.confidence=gated"],
    "spread": ["judge_credit.min_spread=0.2"],
    "guard": ["judge_credit.min_auroc=0.6"],
    "calibrated_guard": ["judge_credit.confidence=calibrated", "judge_credit.min_auroc=0.6"],
}
CONTROL = "grpo_after_judge_warmup"  # GRPO on the labelled prompts from the judging warm-up's start
JUDGES = ("self_judged_grpo", "spark", "spc", "self_rewarding")  # the recipes with a judging warm-up


def prompts_as_run(args) -> int:
    """The prompts a step as run: an override after `--` wins over --prompts (self_rewarding's three
    iterations draw as many prompts as the step-wise recipes' steps do)."""
    return int(next((o.split("=", 1)[1] for o in reversed(args.extra) if o.startswith("rollout.prompts_per_step=")),
                    args.prompts))


def recipes(v: str, args) -> dict[str, tuple[str, list[str]]]:
    """recipe -> (config file, overrides) in the scarce-label regime, `v` the task's verifier."""
    judge = f"rewards=[{{name: {v}}}, {{name: judge, judge: true, weight: 0}}]"
    warm = [f"judge.warmup_steps={args.judge_warmup}", f"judge.warmup_task={args.judge_task}",
            f"judge.warmup_task_fraction={args.judge_task_fraction}"]
    # --judge-separate: the judge apart from the policy (judge.separate), where the recipe allows it
    shared, warm = warm, warm + (["judge.separate=true"] if args.judge_separate else [])
    # --judge-online N: self_judged_grpo's judge apart goes on learning from N labelled rollouts a step
    online = [f"judge.online_items={args.judge_online}", f"judge.online_lr={args.judge_online_lr}"] \
        if args.judge_online else []
    if args.judge_init == "scratch":  # a judge from random weights: its warm-up trains verdicts only
        online += ["judge.init=scratch"]
    sjg_warm = [w for w in warm if not w.startswith("judge.warmup_task")] if args.judge_init == "scratch" else warm
    return {
        "grpo": ("grpo_addition", [f"rewards=[{{name: {v}}}]"]),
        "self_judged_grpo": ("self_judged_grpo", [judge, f"aggregate.fill={{{v}: judge}}", f"verifier.accuracy_source={v}",
                                                  *sjg_warm, *online]),
        # the control: self_judged_grpo's judging warm-up, then GRPO on the labelled prompts alone
        "grpo_after_judge_warmup": ("self_judged_grpo", [judge, f"verifier.accuracy_source={v}", *warm]),
        "spark": ("spark", [judge, f"aggregate.fill={{{v}: judge}}", *shared, f"spark.eval_prompts={args.eval_prompts}"]),
        "laser": ("laser", [f"rewards=[{{name: {v}}}, {{name: self, laser: true, weight: 0}}]",
                            f"aggregate.fill={{{v}: self}}", f"verifier.accuracy_source={v}",
                            f"laser.warmup_steps={args.laser_warmup}", "laser.warmup_nll_on=all",
                            f"laser.eval_prompts={args.eval_prompts}"]),
        "cooper": ("cooper", [f"rewards=[{{name: {v}}}, {{name: rm, model: auto, weight: 0}}]",
                              f"aggregate.fill={{{v}: rm}}", f"verifier.accuracy_source={v}",
                              f"reward_model.warmup_steps={args.rm_warmup}"]),
        "self_rewarding": ("self_rewarding", [judge, f"verifier.accuracy_source={v}", "iterations.labels=true", *warm,
                                              f"iterations.prompts={prompts_as_run(args) * args.steps // 3}", "iterations.iterations=3",
                                              "train.max_steps=100000"]),
        "grpo_oracle_fill": ("grpo_addition", [
            f"rewards=[{{name: {v}}}, {{name: oracle, fn: 'oracle_fill:oracle', weight: 0, "
            f"args: {{verifier: {v}, flip: {args.oracle_flip}}}}}]", f"aggregate.fill={{{v}: oracle}}",
            f"verifier.accuracy_source={v}"]),
        "spc": ("spc", [f"rewards=[{{name: {v}}}, {{name: critic, judge: true, weight: 0}}]",
                        f"aggregate.fill={{{v}: critic}}", *warm, "spc.policy_items=32"]),
    }


def common(args, task: dict, seed: int, fraction: float, warm: Path, train: Path, eval_: Path) -> list[str]:
    """What every recipe shares: the warm checkpoint, files, batch shape, optimiser and budget."""
    return [f"seed={seed}", "data.task=null", f"data.path={train}", f"data.eval_path={eval_}",
            "data.prompt_template='{prompt}'", f"model.path={warm}", "warmup.enabled=false",
            f"rollout.prompts_per_step={args.prompts}", "rollout.samples_per_prompt=8",
            f"rollout.max_new_tokens={task['max_new_tokens']}", "algorithm.advantage=grpo", "algorithm.lr=1.0e-4",
            "algorithm.kl_coef=0.0", f"verifier.fraction={fraction}", f"train.max_steps={args.steps}",
            f"train.eval_every={args.eval_every}", "train.stop_at_accuracy=null", "train.checkpoint_every=0",
            f"train.threads={args.threads}", f"ray.num_cpus={args.cpus}"]


def extend_held_out(task: str, train: Path, eval_: Path, size: int) -> int:
    """Grows the held-out file to `size` prompts with fresh sorting problems (digit strings in neither
    split, drawn with their own seed): more held-out prompts, the same task and warm start."""
    import numpy as np

    from runs import read_jsonl

    held = read_jsonl(eval_)
    if size < len(held):
        raise SystemExit(f"--held-out {size}: the task holds {len(held)} held-out prompts already; give at least that")
    if size == len(held):
        return size
    if task != "sorting":
        raise SystemExit(f"--held-out {size}: only the sorting task has problems to spare; {task} keeps its "
                         f"{len(held)}")
    seen = {r["prompt"] for r in held} | {r["prompt"] for r in read_jsonl(train)}
    length = len(held[0]["answer"])
    rng = np.random.default_rng([0, 12])  # not the task's own stream ([seed, 11])
    with eval_.open("a") as f:
        while len(held) < size:
            digits = "".join(map(str, rng.integers(0, 10, size=length)))
            if f"{digits}>" not in seen:
                seen.add(f"{digits}>")
                held.append({"prompt": f"{digits}>", "answer": "".join(sorted(digits))})
                f.write(json.dumps(held[-1]) + "\n")
    return len(held)


def summary_file(held_out: int, name: str) -> str:
    """The summaries file of a measurement: the one already holding its section, else those on 1,000
    held-out prompts or more in self_judges_h1k_2.md (self_judges_h1k.md is full: under 200 kB),
    the rest in self_judges.md."""
    from summary import RESULTS

    for path in sorted(RESULTS.glob("self_judges*.md")):
        if f"<!-- run: {name} -->" in path.read_text():
            return path.stem
    return "self_judges_h1k_2" if held_out >= 1000 else "self_judges"


def shrink_train(train: Path, size: int) -> int:
    """Keeps the train file's first `size` prompts (the task's rows are in a seeded random order):
    the pool the runs draw from, and of which `verifier.fraction` labels a share."""
    from runs import read_jsonl

    rows = read_jsonl(train)
    if not 0 < size <= len(rows):
        raise SystemExit(f"--train-size {size}: the task's train split holds {len(rows)} prompts; give 1 to that")
    train.write_text("".join(json.dumps(r) + "\n" for r in rows[:size]))
    return size


def held_out_accuracy(task: dict, warm: Path, train: Path, eval_: Path) -> float:
    """The warm model's greedy accuracy on the held-out file, as a run's evaluation reads it (the
    generator's greedy decoding, the task's verifier), in-process."""
    import pyarrow as pa

    from actors.generator import Generator
    from actors.rewards import REWARD_FUNCTIONS
    from orchestrator.config import load_config
    from runs import read_jsonl

    config = load_config(task["config"], ["data.task=null", f"data.path={train}", f"data.eval_path={eval_}",
                                          "data.prompt_template='{prompt}'", f"model.path={warm}",
                                          f"rollout.max_new_tokens={task['max_new_tokens']}", "train.threads=1"])
    rows = read_jsonl(eval_)
    prompts = pa.table({"prompt_id": [str(i) for i in range(len(rows))], "prompt": [r["prompt"] for r in rows],
                        "answer": [r["answer"] for r in rows]})
    out, _ = Generator(config, str(warm)).generate(prompts, greedy=True)
    verify = REWARD_FUNCTIONS.get(task["verifier"])
    columns = [out.column(c).to_pylist() for c in ("prompt", "response", "answer")]
    scores = [verify(prompt=p, response=r, answer=a) for p, r, a in zip(*columns)]
    return float(sum(s >= 0.5 for s in scores) / len(scores))


def isolate_ray() -> None:
    """Every run starts its own local Ray cluster in a directory of its own: without this, `ray.init`
    on a shared machine finds other users' clusters under /tmp/ray and joins the newest one."""
    for key in [k for k in os.environ if k.startswith("RAY_")]:
        del os.environ[key]
    os.environ.update({"RAY_TMPDIR": tempfile.mkdtemp(prefix="sj-", dir="/tmp"), "RAY_USAGE_STATS_ENABLED": "0"})
    # grpo_oracle_fill's reward function (benchmarks/oracle_fill.py), imported by each run's sandbox
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [os.environ.get("PYTHONPATH")])])


def start_accuracy(run: dict) -> float | None:
    """The policy's held-out accuracy where RL began (the run's warm start, after its last warm-up),
    else after its judging or LaSeR warm-up, else the SFT warm start."""
    s = run["summary"]
    if s.get("judge_warmup/separate"):  # the judge apart: the policy starts where it was given
        return s.get("warm_start/accuracy", run.get("sft_accuracy"))
    for key in ("warm_start/accuracy", "judge_warmup/accuracy_after", "laser_warmup/accuracy_after"):
        if s.get(key) is not None:
            return s[key]
    return s.get("warm_start/accuracy", run.get("sft_accuracy"))


def summarise(run: dict) -> dict:
    rows, s = run["rows"], run["summary"]
    acc = evals(rows)
    auroc = [a for key in ("eval/judge_auroc", "eval/self_reward_auroc", "eval/reward_model_auroc")
             for *_, a in evals(rows, key)]
    learned = [v for r in rows for k, v in r.items() if k.startswith("learned/") and k.endswith("/auroc")]
    batch = [r.get("spark/batch_auroc", r.get("judge/auroc")) for r in rows]
    probed = any(k.endswith("/auroc_trained") for r in rows for k in r)  # verifier.probe_share: the probes' AUROC
    batch = (learned if probed else None) or [b for b in batch if b is not None] or learned or \
        [r["iter/judge_auroc"] for r in rows if r.get("iter/judge_auroc") is not None]
    hacking = max((r.get("eval/hacking_count") or 0 for r in rows), default=0)
    guard = [v for r in rows for k, v in r.items() if k.endswith("/guard") or k == "iter/guarded"]
    before = s.get("judge_warmup/auroc_own_samples", s.get("laser_warmup/self_reward_auroc_after"))
    return {"start": start_accuracy(run), "final": acc[-1][2] if acc else None,
            "best": max((a for *_, a in acc), default=None),
            "judge_auroc_start": before, "judge_auroc_first": auroc[0] if auroc else None,
            "judge_auroc_last": auroc[-1] if auroc else None,
            "batch_auroc_last5": statistics.mean(batch[-5:]) if batch else None,
            "hacking_count": hacking, "guard_frac": statistics.mean(guard) if guard else None,
            "wall_s": run["wall_s"], "train_s": s.get("time/train_s")}


def med(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def table(runs: dict) -> str:
    """One row per (fraction, recipe): medians (range) over seeds; `vs grpo` is the recipe's median
    final accuracy minus the baseline's at the same fraction, `vs control` minus the control's (GRPO on
    the labelled prompts from the judging warm-up's start); `above start` counts the seeds that end
    at or above their own warm start."""
    lines = ["| f | recipe | seeds | warm start | final held-out acc | vs grpo | vs control | >= start | best | judge AUROC: "
             "after warm-up / first eval -> last eval | batch AUROC (last 5) | hacking evals | guard on | train s |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    order = ["grpo", CONTROL, "self_judged_grpo", "spark", "laser", "cooper", "self_rewarding", "spc"]
    rank = lambda key: (-float(key.split("/")[0]), next((i for i, r in enumerate(order)  # noqa: E731
                                                          if key.split("/", 1)[1].startswith(r)), len(order)), key)
    for key, rs in sorted(runs.items(), key=lambda kv: rank(kv[0])):
        fraction, name = key.split("/", 1)
        ok = [summarise(r) for r in rs if "error" not in r]
        if not ok:
            lines.append(f"| {fraction} | {name} | 0 (failed: {len(rs)}) | | | | | | | | | | | |")
            continue

        def versus(other: str) -> str:  # the median final minus `other`'s at this fraction
            finals = [summarise(r)["final"] for r in runs.get(f"{fraction}/{other}", []) if "error" not in r]
            return "-" if not finals or name == other else f"{med([s['final'] for s in ok]) - med(finals):+.3f}"
        col = lambda k: median_range([s[k] for s in ok])  # noqa: E731
        held = sum(1 for s in ok if s["final"] is not None and s["start"] is not None and s["final"] >= s["start"])
        lines.append(f"| {fraction} | {name} | {len(ok)} | {col('start')} | {col('final')} | "
                     f"{versus('grpo')} | {versus(CONTROL)} | {held}/{len(ok)} | {col('best')} | "
                     f"{col('judge_auroc_start')} / {col('judge_auroc_first')} -> {col('judge_auroc_last')} | "
                     f"{col('batch_auroc_last5')} | {col('hacking_count')} | {col('guard_frac')} | {col('train_s')} |")
    return "\n".join(lines)


def gap_table(runs: list[dict]) -> str:
    lines = ["| f | seed | SFT warm start acc | judge AUROC before its warm-up | after (warm policy's samples) | "
             "after (own samples) | policy acc after | examples | warm-up s |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        s = r["summary"]
        f = lambda k: "-" if s.get(k) is None else f"{s[k]:.3f}"  # noqa: E731
        lines.append(f"| {r['fraction']} | {r['seed']} | {r['sft_accuracy']:.3f} | {f('judge_warmup/auroc_before')} | "
                     f"{f('judge_warmup/auroc_after')} | {f('judge_warmup/auroc_own_samples')} | "
                     f"{f('judge_warmup/accuracy_after')} | {s.get('judge_warmup/examples', '-')} | {f('judge_warmup/time_s')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=list(TASKS), default="sorting")
    parser.add_argument("--recipes", nargs="+", default=["grpo", "self_judged_grpo", "spark", "laser", "cooper",
                                                           "self_rewarding", "spc"])
    parser.add_argument("--credit", nargs="+", default=["raw"], choices=list(CREDIT),
                        help="judge_credit variants: the recipes of --ablate run once per variant, the others "
                        "with the first")
    parser.add_argument("--ablate", nargs="*", default=[], help="recipes that run with every --credit variant")
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.1])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--prompts", type=int, default=32, help="rollout.prompts_per_step of every run")
    parser.add_argument("--eval-prompts", type=int, default=64, help="held-out prompts the judge is measured on")
    parser.add_argument("--held-out", type=int, default=None,
                        help="held-out prompts every run's greedy accuracy is measured on (default: the task's 200); "
                             "sorting only: fresh problems outside the task's set make up the rest (200 give a "
                             "standard error of 0.035 a run, 1000 about 0.016)")
    parser.add_argument("--judge-warmup", type=int, default=200, help="judge.warmup_steps")
    parser.add_argument("--judge-task-fraction", type=float, default=0.5,
                        help="judge.warmup_task_fraction: the share of each judging warm-up batch that rehearses the "
                             "policy's own greedy answers (0.75 keeps the policy's accuracy where it was, --gap)")
    parser.add_argument("--judge-task", choices=["own", "own_samples", "distill"], default="own",
                        help="judge.warmup_task: what the task share rehearses, the policy's greedy answers (own), "
                             "its sampled ones (own_samples, which keep its distribution) or those samples distilled "
                             "from the warm policy's next-token distributions (distill)")
    parser.add_argument("--judge-separate", action="store_true",
                        help="judge.separate for every recipe but spark (which trains its judge in the policy): "
                             "the judging warm-up trains a judge apart, and the policy starts RL where it was")
    parser.add_argument("--judge-online", type=int, default=0,
                        help="with --judge-separate: judge.online_items of self_judged_grpo, whose judge apart then "
                             "trains on up to this many labelled rollouts a step (0: the fixed judge apart)")
    parser.add_argument("--judge-online-lr", type=float, default=3e-4, help="judge.online_lr (--judge-online)")
    parser.add_argument("--judge-init", choices=["policy", "scratch"], default="policy",
                        help="with --judge-online: judge.init of self_judged_grpo, whose judge apart then starts from "
                             "random weights and its warm-up trains verdicts only (--judge-task* do not apply to it)")
    parser.add_argument("--guard", type=float, default=0.6,
                        help="judge_credit.min_auroc of every recipe but grpo (the guard); the shipped YAMLs of "
                             "self_judged_grpo, spc and self_rewarding guard at 0.8, set for addition's weak judges, "
                             "which on sorting drops a good judge on a quarter of the steps (results: _lr5e5_sjg08)")
    parser.add_argument("--oracle-flip", type=float, default=0.0,
                        help="grpo_oracle_fill: the share of answers its verifier-as-judge gets wrong (0: none)")
    parser.add_argument("--laser-warmup", type=int, default=300, help="laser.warmup_steps")
    parser.add_argument("--rm-warmup", type=int, default=60, help="reward_model.warmup_steps (cooper)")
    parser.add_argument("--train-size", type=int, default=None,
                        help="the runs draw from the train split's first N prompts (default: all 8000 on sorting); "
                             "the fraction labels a share of those, so fewer labelled prompts")
    parser.add_argument("--threads", type=int, default=1, help="train.threads")
    parser.add_argument("--cpus", type=int, default=2, help="ray.num_cpus")
    parser.add_argument("--gap", action="store_true", help="only the verification gap: judging warm-ups")
    parser.add_argument("--label", default="")
    parser.add_argument("--report", action="store_true", help="only print the table from an earlier raw file")
    parser.add_argument("--write", action="store_true", help="with --report: also write its summary section")
    parser.add_argument("--resume", action="store_true", help="keep the runs of an earlier raw file of this label "
                        "and run only the (recipe, fraction, seed) it lacks")
    parser.add_argument("extra", nargs="*", help="overrides for every run (after --)")
    args = parser.parse_args()
    if args.judge_online and not args.judge_separate:
        parser.error("--judge-online trains the judge apart: add --judge-separate")
    if args.judge_init == "scratch" and not args.judge_online:
        parser.error("--judge-init scratch: a judge from scratch is a judge apart that learns: add --judge-separate "
                     "and --judge-online N")
    from runs import export_splits, warm_checkpoint

    name = f"self_judges_{args.task}{'_gap' if args.gap else ''}{args.label}"
    out = raw_path(f"{name}.json")
    if args.report:  # the table of an earlier raw file (several --resume invocations: each one's argv)
        data = json.loads(out.read_text())
        text = gap_table(data["runs"]) if args.gap else table(data["runs"])
        print(text)
        if args.write:
            argv = [" ".join(a) for a in data["meta"].get("argvs", [data["meta"]["argv"]])]
            print(write_summary(summary_file(data["meta"]["splits"]["eval_rows"], name), name, text, raw=[out],
                                protocol=f"from {out.name}: {'; '.join(argv)}"))
        return
    task = TASKS[args.task]
    isolate_ray()
    runs: dict | list = [] if args.gap else {}
    argvs = [sys.argv[1:]]
    if args.resume and out.exists() and not args.gap:
        earlier = json.loads(out.read_text())
        runs = {k: [r for r in rs if "error" not in r] for k, rs in earlier["runs"].items()}
        argvs = [*earlier["meta"].get("argvs", [earlier["meta"]["argv"]]), *argvs]
    with tempfile.TemporaryDirectory(prefix="self-judges-") as tmp:
        work = Path(tmp)
        warm, warm_info = warm_checkpoint(None, work, recipe=task["config"])
        train, eval_, split_info = export_splits(work, task["config"])
        if args.held_out:  # and the warm start measured on all of them (warm_info's is on the task's 200)
            split_info["eval_rows"] = extend_held_out(args.task, train, eval_, args.held_out)
            warm_info = {**warm_info, "warmup/accuracy": held_out_accuracy(task, warm, train, eval_)}
        if args.train_size:  # a smaller pool, after the held-out prompts are fixed: fewer labelled prompts
            split_info["train_rows"] = shrink_train(train, args.train_size)
        sft = warm_info.get("warmup/accuracy")
        meta = {"machine": f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}",
                "python": platform.python_version(), "argv": sys.argv[1:], "argvs": argvs, "warm": str(warm),
                "warm_info": warm_info, "splits": split_info}
        table_of = recipes(task["verifier"], args)
        for seed, fraction in [(s, f) for s in args.seeds for f in args.fractions]:  # seed-major: a cut grid has each f
            base = common(args, task, seed, fraction, warm, train, eval_)
            plan = ([("gap", "self_judged_grpo", "raw")] if args.gap else
                    [(r if r not in args.ablate else f"{r}_{c}", r, c) for r in args.recipes
                     for c in (["raw"] if r == "grpo" else args.credit if r in args.ablate else args.credit[:1])])
            for label, recipe, credit in plan:
                config, overrides = table_of[recipe]
                if args.gap:
                    overrides = [*overrides, "train.max_steps=1", "train.eval_every=1"]
                tag = f"{label}_f{fraction}_s{seed}"
                if not args.gap and any(r["seed"] == seed for r in runs.get(f"{fraction}/{label}", [])):
                    continue  # --resume: measured already
                try:
                    guard = [] if recipe == "grpo" else [f"judge_credit.min_auroc={args.guard}"]
                    run = coevo(config, [*base, *overrides, *guard, *CREDIT[credit], *args.extra], work / tag,
                                work / f"{tag}.log")
                except RuntimeError as e:  # one failed recipe does not end the comparison
                    log = (work / f"{tag}.log").read_text(errors="replace")[-3000:]
                    run = {"config": config, "error": str(e), "log_tail": log}
                    print(f"{tag}: FAILED\n{log}", flush=True)
                run.update(seed=seed, fraction=fraction, sft_accuracy=sft)
                if args.gap:
                    runs.append(run)
                else:
                    runs.setdefault(f"{fraction}/{label}", []).append(run)
                if "error" not in run and not args.gap:
                    s = summarise(run)
                    print(f"{tag}: start {s['start']}, final {s['final']}, judge AUROC {s['judge_auroc_start']} / "
                          f"{s['judge_auroc_first']} -> {s['judge_auroc_last']}, {s['wall_s']:.0f} s, "
                          f"load {run['load_avg']:.1f}", flush=True)
                out.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1, default=str))
    text = gap_table(runs) if args.gap else table(runs)
    print("\n" + text)
    prompts = prompts_as_run(args)
    summary = write_summary(summary_file(split_info["eval_rows"], name), name, text, raw=[out], protocol=(
        f"task {args.task} (SFT warm start {sft}), seeds {args.seeds}, fractions {args.fractions}, {args.steps} steps of "
        f"{prompts} prompts x 8, eval every {args.eval_every} on {split_info['eval_rows']} held-out prompts, "
        f"{args.eval_prompts} judge eval prompts; warm-ups: judge "
        f"{args.judge_warmup} (task share {args.judge_task_fraction}"
        + ("; self_judged_grpo's judge from scratch: none" if args.judge_init == "scratch" else "") + f"), laser {args.laser_warmup}, reward model {args.rm_warmup} steps; guard {args.guard}; credit {' '.join(args.credit)}"
        + (f" (every variant for {args.ablate})" if args.ablate else "")
        + ("; overrides: the command's, after `--`" if args.extra else "; no overrides")))
    print(f"\nraw results: {out}\nsummary: {summary}")


if __name__ == "__main__":
    main()
