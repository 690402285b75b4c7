"""Reward models named by a reward source's `model:`: a local directory, or `auto` — the warm policy
with a fresh scalar head, trained for `reward_model.warmup_steps` steps on verifier-labelled pairs
from the warm policy's own samples (recipe reward_model, run nested on the same Ray), and cached
like the SFT warm-up, so a frozen and a co-evolving run can start from the very same reward model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Literal, Optional

from pydantic import Field, field_validator

from orchestrator.config import Config, ConfigError, Section, template_fields, validate_config
from orchestrator.stage_cache import cache_key, probe_key
from orchestrator.stages import Stage, Stopped


class RewardModelConfig(Section):
    """The scalar reward model (Bradley-Terry): its learner (recipes reward_model and cooper) and,
    for rewards with `model: auto`, its cached warm-up on verifier-labelled pairs."""
    init: Optional[str] = None  # recipe reward_model: a local model directory; None: the warm policy
    template: str = "{prompt}{response}"  # text the reward model reads ({answer}: the reference)
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    margin: float = Field(0.0, ge=0)  # Bradley-Terry margin
    batch_pairs: int = Field(256, gt=0)  # pairs per optimizer step
    update_every: int = Field(1, ge=1)  # cooper: one reward-model update every k policy steps
    pair_selection: Literal["hardest", "random"] = "hardest"
    pairs_per_group: int = Field(1, ge=1)
    label_source: Optional[str] = None  # verifier source whose labels build pairs (default: first fn)
    label_threshold: float = 0.5  # a response is correct when its label reward >= this
    # Training from a file of preference pairs (recipe reward_model): JSONL/Parquet with prompt,
    # chosen, rejected. Without it, pairs come from the policy's samples labelled by the verifier.
    pairs_path: Optional[str] = None
    eval_pairs_path: Optional[str] = None
    eval_pairs: int = Field(200, gt=0)  # held-out pairs when no eval file is given
    # `model: auto` rewards start from the warm policy with a fresh scalar head, trained for this
    # many steps on verifier-labelled pairs from `warmup_prompts` training prompts (cached).
    warmup_steps: int = Field(100, ge=1)
    warmup_prompts: Optional[int] = Field(None, gt=0)  # None: all training prompts
    cache: bool = True

    @field_validator("template")
    @classmethod
    def _fields(cls, v: str) -> str:
        return template_fields(v, "reward_model.template")

    def learner_args(self, config) -> dict:
        """A reward-model learner's role arguments (actors/reward_learner.py: RewardLearner's spec)."""
        from actors.reward_learner import RewardModelSpec

        return {"spec": RewardModelSpec(label=config.label_source(self), **self.model_dump(include={
            "template", "lr", "weight_decay", "margin", "batch_pairs", "update_every", "pair_selection",
            "pairs_per_group", "label_threshold", "eval_pairs"}))}

MARKER = "reward_warmup.json"


def cache_path(config) -> Path:
    extra = {"reward_model": config.reward_model.model_dump(exclude={"cache", "pairs_path", "eval_pairs_path"}),
             "rewards": [r.model_dump() for r in config.fn_rewards()], "fraction": config.verifier.fraction, **probe_key(config),
             "rollout": config.rollout.model_dump(), "kind": "reward_model"}
    return Path(config.warmup.cache_dir).expanduser().parent / "reward_models" / cache_key(config, extra)


def warmup_config(cfg):
    """The nested reward_model run that trains an `auto` reward model: the run's verifiers only (they
    label the pairs), none of its aggregation (which may name the reward model itself)."""
    from orchestrator.settings import model_for
    data = cfg.model_dump(mode="json")
    steps = cfg.reward_model.warmup_steps
    data.update(recipe="reward_model", output_dir=None, aggregate={},
                rewards=[r for r in data["rewards"]
                         if r.get("model") is None and not r.get("judge") and not r.get("laser")],
                roles={k: v for k, v in data["roles"].items() if k in ("generator", "verifier", "rm_learner")})
    accepted = model_for(data, Config).model_fields  # the run's recipe may own sections it lacks
    data = {k: v for k, v in data.items() if k in accepted}
    data["reward_model"].update(pairs_path=None, init=None)
    # held-out pair accuracy once, at the end: the only one that is kept (in the cache's marker) and
    # shown; every steps // 4 it was a quarter of the warm-up's time (measured: 18 s of 72)
    data["train"].update(max_steps=steps, eval_every=steps, checkpoint_every=0,
                         max_staleness=0, stop_at_accuracy=None, dump_rollouts=False)
    data["algorithm"]["off_policy"] = None
    return validate_config(data)


class RewardModels(Stage):
    """Every `model:` reward source's directory into `sources.reward_models`; an `auto` one trained
    first by a nested reward_model run (one cache entry serves every `auto` source)."""
    name, label, marker = "reward_models", "reward model", MARKER
    borrows = ()  # the nested run builds its own pools
    settings = {"reward_model": RewardModelConfig}
    rewards = ("model",)  # its section only where a reward source is `model:`

    def enabled(self, config, recipe) -> bool:
        return bool(config.model_rewards())

    def cache_path(self, config, sources) -> Path | None:
        _given_models(config)  # a wrong directory is reported before anything trains
        return cache_path(config) if _auto(config) else None

    def caching(self, config) -> bool:
        return config.reward_model.cache

    def output_dir(self, config, cache_path: Path, run_dir: Path) -> Path:
        return cache_path  # the nested run lives there either way

    def cached_message(self, config, path: Path, info: dict) -> str:
        names = ", ".join(repr(s.name) for s in _auto(config))
        return f"reward model {names}: using cached {path} (held-out pair accuracy {info.get('eval/pair_accuracy')})"

    async def train(self, ctx, out_dir: Path, sources) -> dict:
        """The nested run, on this run's Ray and progress display."""
        from orchestrator.run import Run

        cfg = ctx.config
        rm = cfg.reward_model
        ctx.progress.print(
            f"reward model {_auto(cfg)[0].name!r}: warm-up: {rm.warmup_steps} Bradley-Terry steps "
            f"(reward_model.warmup_steps), each on up to {rm.batch_pairs} (correct, wrong) pairs of the warm policy's "
            f"samples of {cfg.rollout.prompts_per_step} prompts x {cfg.rollout.samples_per_prompt}, labelled by the "
            f"verifier; held-out pair accuracy at the end; a nested reward_model run, cached in {out_dir}")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        sub = Run(warmup_config(cfg), out_dir / "run", resume=False)
        sub.progress, sub._pending_stop = ctx.progress, ctx.stop_requested
        sub.gpus_usable = ctx.run.gpus_usable  # the parent's verdict on this machine's CUDA
        ctx.run.nested.append(sub)  # a Ctrl-C reaches it
        try:
            summary = await sub.main(nested=True)
        finally:
            ctx.run.nested.remove(sub)
        if summary["stopped_by"]:  # a partly trained reward model is no cache entry
            raise Stopped(summary["stopped_by"], f"stopped by {summary['stopped_by']} during the reward-model "
                          f"warm-up, at step {summary['steps']}; nothing was saved; the same command starts it "
                          "again (reusing an --output-dir)")
        shutil.copytree(Path(summary["final_checkpoint"]) / "rm_learner", out_dir, dirs_exist_ok=True)
        (out_dir / MARKER).write_text(json.dumps(summary, indent=1))
        return summary

    def apply(self, config, sources, out_dir: Path | None, info: dict) -> dict:
        sources.reward_models.update(_given_models(config))
        sources.reward_models.update({spec.name: str(out_dir) for spec in _auto(config)})
        return {}  # the nested run's summary stays in its marker, out of this run's summary


def _auto(config) -> list:
    return [spec for spec in config.model_rewards() if spec.model == "auto"]


def _given_models(config) -> dict[str, str]:
    """The reward sources whose `model:` is a directory: name -> its resolved path."""
    out = {}
    for spec in config.model_rewards():
        if spec.model != "auto":
            path = Path(spec.model).expanduser()
            if not (path / "config.json").is_file():
                raise ConfigError(f"rewards[{spec.name}].model {spec.model!r} is not a model directory "
                                  "(no config.json); use a reward model saved by `coevo run reward_model` or 'auto'")
            out[spec.name] = str(path.resolve())
    return out
