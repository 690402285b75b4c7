"""`coevo` command line."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from orchestrator.config import ConfigError, load_config

EXIT_CONFIG = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coevo", description="RL post-training of language models on Ray.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run", help="train with a recipe or YAML config",
        description="Train. With no arguments: an embedded local Ray cluster, a tiny model, 2-digit "
                    "addition, SFT warm-up then GRPO. CONFIG is a YAML file or a recipe name in pipelines/. "
                    "Overrides are dotted key=value pairs, e.g. algorithm.lr=5e-5 rollout.samples_per_prompt=4.",
        epilog="examples:\n  coevo run\n  coevo run pipelines/grpo_addition.yaml train.max_steps=50\n"
               "  coevo run data.path=my.jsonl data.task=null 'verifier.rewards=[{name: mine, fn: my_rewards:score}]'",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("config", nargs="?", help="YAML file or recipe name (default: grpo_addition)")
    run.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    run.add_argument("--output-dir", help="run directory (default: runs/<recipe>-<time>)")
    run.add_argument("--seed", type=int, help="random seed (overrides `seed`)")
    run.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a local cluster)")
    run.add_argument("--resume", action="store_true", help="continue the run in --output-dir from its last checkpoint")
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
    from orchestrator.run import actor_error_message, run

    try:
        summary = run(config, resume=args.resume)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except ConfigError as e:  # found once Ray is up (e.g. resources the local cluster lacks)
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except Exception as e:  # noqa: BLE001  (one clear line, the traceback is in the actor logs)
        print(f"error: {actor_error_message(e)}", file=sys.stderr)
        return 1
    _report(summary)
    return 0


def _preflight(config) -> None:
    """Catch what would otherwise fail inside an actor: user reward code and the dataset."""
    from actors.rewards import REWARD_FUNCTIONS
    from orchestrator.data import load_prompts

    for spec in config.verifier.rewards:
        fn = REWARD_FUNCTIONS.get(spec.fn or spec.name)
        if not callable(fn):
            raise ConfigError(f"verifier.rewards[{spec.name}]: {spec.fn or spec.name!r} is not callable")
    load_prompts(config.data, config.seed)
    if config.model.path and not Path(config.model.path).expanduser().is_dir():
        raise ConfigError(f"model.path {config.model.path!r} is not a directory")


def _report(summary: dict) -> None:
    acc = summary.get("eval/accuracy")
    run_dir = summary["run_dir"]
    print(f"\ndone: {summary['steps']} steps in {summary['time/total_s']:.1f}s "
          f"(Ray {summary['time/ray_start_s']:.1f}s, warm-up {summary['time/warmup_s']:.1f}s, "
          f"RL {summary['time/train_s']:.1f}s); held-out accuracy {acc if acc is None else f'{acc:.3f}'}")
    print(f"run directory: {run_dir}")
    print(f"  metrics:     {run_dir}/metrics.jsonl")
    print(f"  tensorboard: tensorboard --logdir {run_dir}/tensorboard")
    print(f"  plots:       {', '.join(summary['plots'])}")
    print(f"  checkpoint:  {summary['final_checkpoint']}  (AutoModelForCausalLM.from_pretrained)")


if __name__ == "__main__":
    sys.exit(main())
