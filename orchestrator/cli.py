"""`coevo` command line."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from orchestrator import run_dir as run_dirs
from orchestrator.config import ConfigError, load_config

EXIT_CONFIG = 2
# Each line is also loaded by a test, so none drifts from what the config accepts.
EXAMPLES = """examples:
  coevo run
  coevo run laser --seed 1
  coevo run pipelines/grpo_addition.yaml train.max_steps=50
  coevo run data.path=my.jsonl data.task=null 'rewards=[{name: mine, fn: "my_rewards:score"}]'
  coevo run --resume --output-dir runs/try1 train.max_steps=300"""


def _parser() -> argparse.ArgumentParser:
    from orchestrator import __version__
    from orchestrator.recipe_list import recipes_help

    parser = argparse.ArgumentParser(prog="coevo", description="RL post-training of language models on Ray.")
    parser.add_argument("--version", action="version", version=f"coevo {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run", help="train with a recipe or YAML config",
        description="Train. With no arguments: an embedded local Ray cluster, a tiny model, 2-digit "
                    "addition, an SFT warm-up then PSR (GRPO's positive half; algorithm.advantage=grpo for "
                    "GRPO). CONFIG is a YAML file or a recipe name in pipelines/. Overrides are dotted "
                    "key=value pairs, e.g. algorithm.lr=5e-5 rollout.samples_per_prompt=4. A first run also "
                    "pays for its recipe's warm-ups, cached for later runs: the list below says what each "
                    "costs. The default job's first run takes about a minute on 2 idle CPU cores.",
        epilog=recipes_help() + "\n\n" + EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("config", nargs="?", help="YAML file or recipe name (default: grpo_addition)")
    run.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    run.add_argument("--output-dir", help="run directory (default: runs/<recipe>-<time>)")
    run.add_argument("--seed", type=int, help="random seed (overrides `seed`)")
    run.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a local cluster)")
    run.add_argument("--resume", action="store_true", help="continue the run in --output-dir from its last checkpoint")
    status = sub.add_parser(
        "status", help="the coevo runs on a Ray cluster",
        description="The coevo runs on a Ray cluster: roles, replicas (live/min/max), weight versions, "
                    "staleness, throughput, last held-out accuracy (docs/metrics.md#coevo-status).")
    status.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else the local cluster)")
    return parser


def main(argv: list[str] | None = None) -> int:
    # `module:function` reward code in the current directory must import here as it does in the
    # actors (which get the cwd on PYTHONPATH); a console script's sys.path lacks the cwd. Appended,
    # so an installed coevo still wins over a copy in the cwd.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    parser = _parser()
    # Overrides may come after flags (`coevo run cfg.yaml --seed 1 a.b=2`): collect the leftovers.
    args, extra = parser.parse_known_args(argv)
    if args.command == "status":
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        from orchestrator.status_cli import status_main
        return status_main(args.address)
    unknown = [e for e in extra if e.startswith("-") or "=" not in e]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    config_arg, overrides = args.config, list(args.overrides) + extra
    if config_arg and "=" in config_arg:  # `coevo run key=value` without a config file
        config_arg, overrides = None, [config_arg, *overrides]
    if args.resume and not args.output_dir:
        print("error: --resume needs --output-dir RUN_DIR", file=sys.stderr)
        return EXIT_CONFIG
    if args.resume and config_arg is None and (Path(args.output_dir) / "config.yaml").is_file():
        config_arg = str(Path(args.output_dir) / "config.yaml")
    if (not args.resume and args.output_dir is None and run_dirs.is_saved_config(config_arg)
            and not any(o.startswith("output_dir=") for o in overrides)):
        # A run directory's saved config names that directory: rerunning it is a new run.
        overrides.append("output_dir=null")
        print(f"{config_arg}: an earlier run's config; this run gets a new directory (--output-dir to choose one)")
    for flag, key in ((args.seed, "seed"), (args.output_dir, "output_dir"), (args.address, "ray.address")):
        if flag is not None:
            overrides.append(f"{key}={flag}")
    try:
        config = load_config(config_arg, overrides)
        _preflight(config)
    except (ConfigError, ImportError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONFIG

    if not (config.ray.address or os.environ.get("RAY_ADDRESS")):
        # The embedded cluster serves this process only: bind it to loopback (read at ray import).
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    from orchestrator.errors import actor_error_message
    from orchestrator.run import run
    from orchestrator.stages import Stopped

    try:
        summary = run(config, resume=args.resume)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Stopped as e:  # in a warm-up stage: nothing to resume, the same command goes on
        import shlex
        import signal
        print(str(e), file=sys.stderr)
        print(f"start it again with:  {submitted(shlex.join(['coevo', *(sys.argv[1:] if argv is None else argv)]))}",
              file=sys.stderr)
        return 128 + getattr(signal, e.signame)
    except (ConfigError, FileNotFoundError) as e:  # found once Ray is up (e.g. resources it lacks)
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except Exception as e:  # noqa: BLE001  (one clear line, the traceback is in the actor logs)
        print(f"error: {actor_error_message(e)}", file=sys.stderr)
        return 1
    _report(summary)
    if summary.get("stopped_by"):
        import signal
        return 128 + getattr(signal, summary["stopped_by"])
    return 0


def _preflight(config) -> None:
    """Catch before Ray starts what would otherwise fail inside an actor: every import-path plug-in
    (reward functions, estimators, losses, the recipe), the datasets and the model directory."""
    from actors.algorithms import ADVANTAGES, OFF_POLICY, POLICY_LOSSES
    from actors.rewards import REWARD_FUNCTIONS
    from orchestrator.data import load_prompts
    from orchestrator.recipes import RECIPES, Recipe

    for spec in config.fn_rewards() + config.process_rewards():
        try:
            fn = REWARD_FUNCTIONS.get(spec.fn or spec.name)
        except ImportError as e:
            raise ConfigError(f"rewards[{spec.name}].fn: {e}") from None
        if not callable(fn):
            raise ConfigError(f"rewards[{spec.name}]: {spec.fn or spec.name!r} is not callable")
    for key, registry, name in (("algorithm.advantage", ADVANTAGES, config.algorithm.advantage),
                                ("algorithm.policy_loss", POLICY_LOSSES, config.algorithm.policy_loss),
                                ("algorithm.off_policy", OFF_POLICY, config.algorithm.off_policy)):
        if name is not None and not callable(registry.get(name)):
            raise ConfigError(f"{key}: {name!r} is not callable")
    recipe = RECIPES.get(config.recipe)
    if not (isinstance(recipe, type) and issubclass(recipe, Recipe)):
        raise ConfigError(f"recipe {config.recipe!r} is not a subclass of orchestrator.recipes.Recipe")
    if config.model.path:  # before the datasets: a chat template is read from its tokenizer
        from orchestrator.model_check import check_model_dir
        _check_generation_config(check_model_dir(config.model.path))
    load_prompts(config.data, config.seed, model_cfg=config.model.model_copy(deep=True))  # chat templates too
    if config.recipe == "reward_model" and config.reward_model.pairs_path:
        from orchestrator.pair_source import load_pair_splits
        load_pair_splits(config.reward_model, config.seed)


def _check_generation_config(path: Path) -> None:
    """A loaded model's generation_config may set sampling processors that the learner cannot
    reproduce; refuse them by name rather than train on wrong behaviour log-probs."""
    if not (path / "generation_config.json").is_file():
        return
    from transformers import GenerationConfig

    from actors.sampling import unsupported_settings

    found = unsupported_settings(GenerationConfig.from_pretrained(str(path)))
    if found:
        raise ConfigError(f"{path}/generation_config.json sets {found}: coevo samples with rollout.temperature, "
                          "top_p and top_k only, and its learner cannot reproduce these; remove them from that file")


def held_out_text(summary: dict) -> str:
    """The held-out results of a run's summary; accuracy beside the warm start's, which a stage
    measured the same way (greedy decoding, the same held-out prompts)."""
    parts = []
    acc, warm = summary.get("eval/accuracy"), summary.get("warm_start/accuracy")
    if acc is not None:
        at = f" (step {summary['eval/step']})" if summary.get("eval/step") is not None else ""
        prompts = f" on {summary['eval/prompts']} prompts" if summary.get("eval/prompts") else ""
        after = ("the model as given: its warm-up was skipped, already at the target" if summary.get("warm_start/skipped")
                 else f"after the {summary.get('warm_start/stage', 'warm-up')}")
        start = f"{warm:.3f} (warm start, {after}) -> " if warm is not None else ""
        parts.append(f"held-out greedy accuracy{prompts} {start}{acc:.3f}{at}")
    if summary.get("eval/pair_accuracy") is not None:
        parts.append(f"held-out pair accuracy {summary['eval/pair_accuracy']:.3f}")
    return "; ".join(parts) or "no evaluation"


def loader_text(model_dir: Path) -> str:
    """How a saved model loads with plain transformers: the Auto class of its architecture (from its
    config.json), and the extra file a value head lives in."""
    import json

    archs = json.loads((model_dir / "config.json").read_text()).get("architectures") or []
    kinds = {"ForCausalLM": "AutoModelForCausalLM", "ForSequenceClassification": "AutoModelForSequenceClassification",
             "ForTokenClassification": "AutoModelForTokenClassification"}
    auto = next((auto for arch in archs for suffix, auto in kinds.items() if arch.endswith(suffix)), "AutoModel")
    text = f"{auto}.from_pretrained"
    from actors.objectives.value import VALUE_HEAD_FILE
    if (model_dir / VALUE_HEAD_FILE).is_file():
        text += f", value head in {VALUE_HEAD_FILE} (torch.load: a Linear(hidden_size, 1) state dict)"
    return text


def _report(summary: dict) -> None:
    run_dir = summary["run_dir"]
    evals = held_out_text(summary)
    stopped = summary.get("stopped_by")
    from orchestrator.session import timing_text

    head = f"stopped by {stopped}:" if stopped else "done:"
    print(f"\n{head} {timing_text(summary)}; {evals}")
    print(f"run directory: {run_dir}")
    print(f"  metrics:     {run_dir}/metrics.jsonl")
    print(f"  tensorboard: tensorboard --logdir {run_dir}/tensorboard")
    print(f"  plots:       {', '.join(summary['plots'])}")
    ckpt = summary["final_checkpoint"]
    learners = sorted(p for p in Path(ckpt).iterdir() if (p / "config.json").is_file())
    print(f"  checkpoint:  {ckpt}")
    for path in learners:
        print(f"    {path.name + '/':16} {loader_text(path)}")
    if stopped:
        print(f"resume with:  {resume_command(run_dir)}")


def resume_command(run_dir: str) -> str:
    return submitted(f"coevo run --resume --output-dir {run_dir}")


def submitted(command: str) -> str:
    """A command to run again: inside a Ray job (`ray job stop` stopped it), as a job submitted to the
    same cluster; else as it is."""
    from orchestrator import cluster
    from orchestrator.run import in_ray_job

    if not in_ray_job():
        return command
    return f"ray job submit --address {cluster.DASHBOARD or 'http://<head>:8265'} --working-dir . -- {command}"


if __name__ == "__main__":
    sys.exit(main())
