"""Reward models named by a reward source's `model:`: a local directory, or `auto` — the warm policy
with a fresh scalar head, trained for `reward_model.warmup_steps` steps on verifier-labelled pairs
from the warm policy's own samples (recipe reward_model, run nested on the same Ray), and cached
like the SFT warm-up, so a frozen and a co-evolving run can start from the very same reward model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from orchestrator.config import Config, ConfigError
from orchestrator.warmup import cache_key

MARKER = "reward_warmup.json"


def cache_path(config) -> Path:
    extra = {"reward_model": config.reward_model.model_dump(exclude={"cache", "pairs_path", "eval_pairs_path"}),
             "rewards": [r.model_dump() for r in config.fn_rewards()], "fraction": config.verifier.fraction,
             "rollout": config.rollout.model_dump(), "kind": "reward_model"}
    return Path(config.warmup.cache_dir).expanduser().parent / "reward_models" / cache_key(config, extra)


def warmup_config(cfg: Config) -> Config:
    """The nested reward_model run that trains an `auto` reward model: the run's verifiers only (they
    label the pairs), none of its aggregation (which may name the reward model itself)."""
    data = cfg.model_dump(mode="json")
    steps = cfg.reward_model.warmup_steps
    data.update(recipe="reward_model", output_dir=None, aggregate={},
                rewards=[r for r in data["rewards"]
                         if r.get("model") is None and not r.get("judge") and not r.get("laser")],
                roles={k: v for k, v in data["roles"].items() if k in ("generator", "verifier", "rm_learner")})
    data["reward_model"].update(pairs_path=None, init=None)
    data["train"].update(max_steps=steps, eval_every=max(1, steps // 4), checkpoint_every=0,
                         max_staleness=0, stop_at_accuracy=None, dump_rollouts=False)
    data["algorithm"]["off_policy"] = None
    return Config.model_validate(data)


async def resolve_reward_models(run, sources) -> None:
    """Fill `sources.reward_models` (source name -> directory), training `auto` ones if needed."""
    from orchestrator.run import Run

    cfg = run.config
    for spec in cfg.model_rewards():
        if spec.model != "auto":
            path = Path(spec.model).expanduser()
            if not (path / "config.json").is_file():
                raise ConfigError(f"rewards[{spec.name}].model {spec.model!r} is not a model directory "
                                  "(no config.json); use a reward model saved by `coevo run reward_model` or 'auto'")
            sources.reward_models[spec.name] = str(path.resolve())
            continue
        path = cache_path(cfg)
        if not (cfg.reward_model.cache and (path / MARKER).is_file()):
            run.progress.print(f"reward model {spec.name!r}: warm-up on verifier-labelled pairs "
                               f"({cfg.reward_model.warmup_steps} steps) -> {path}")
            sub_cfg = warmup_config(cfg)
            if path.exists():
                shutil.rmtree(path)
            sub = Run(sub_cfg, path / "run", resume=False)
            sub.progress = run.progress
            summary = await sub.main(nested=True)
            shutil.copytree(Path(summary["final_checkpoint"]) / "rm_learner", path, dirs_exist_ok=True)
            (path / MARKER).write_text(json.dumps(summary, indent=1))
        else:
            info = json.loads((path / MARKER).read_text())
            run.progress.print(f"reward model {spec.name!r}: using cached {path} "
                               f"(held-out pair accuracy {info.get('eval/pair_accuracy')})")
        sources.reward_models[spec.name] = str(path)
    run._reward_model_sources = dict(sources.reward_models)
