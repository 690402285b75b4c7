"""Typed run configuration (pydantic): YAML file + dotted `key=value` overrides.

Validation lives next to the field it checks. Unknown keys are errors that list the accepted keys.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

PIPELINES_DIR = Path(__file__).resolve().parent.parent / "pipelines"
DEFAULT_RECIPE = "grpo_addition"


def registered(value: str, registry) -> str:
    """A name must be in its registry (or be a `module:function` path)."""
    if value not in registry:
        raise ValueError(f"unknown {registry.kind} {value!r}; accepted: {registry.names()} "
                         "(or a 'module:function' path)")
    return value


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TinyModelConfig(Section):
    arch: Literal["qwen2", "llama"] = "qwen2"
    hidden_size: int = Field(128, gt=0)
    num_layers: int = Field(4, gt=0)
    num_heads: int = Field(4, gt=0)
    num_kv_heads: int = Field(2, gt=0)
    intermediate_size: int = Field(512, gt=0)

    @model_validator(mode="after")
    def _heads_divide(self) -> "TinyModelConfig":
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError("model.tiny: hidden_size must be divisible by num_heads, "
                             "and num_heads by num_kv_heads")
        return self


class ModelConfig(Section):
    path: Optional[str] = None  # a local HF model directory; None builds the tiny model
    tiny: TinyModelConfig = TinyModelConfig()


class ArithmeticConfig(Section):
    digits: int = Field(2, ge=1, le=6)
    operators: list[Literal["+", "-", "*"]] = ["+"]


class DataConfig(Section):
    task: Optional[Literal["arithmetic"]] = "arithmetic"  # a built-in task, or None with `path`
    arithmetic: ArithmeticConfig = ArithmeticConfig()
    path: Optional[str] = None  # user dataset: .jsonl or .parquet with `prompt` and `answer`
    eval_path: Optional[str] = None  # held-out split; if None, `eval_size` rows of `path`
    eval_size: int = Field(200, ge=1)
    prompt_template: str = "{prompt}"

    @model_validator(mode="after")
    def _one_source(self) -> "DataConfig":
        if self.path is None and self.task is None:
            raise ValueError("data: set either data.task (built-in) or data.path (your file)")
        if "{prompt}" not in self.prompt_template:
            raise ValueError("data.prompt_template must contain '{prompt}'")
        return self


class RolloutConfig(Section):
    backend: str = "hf"
    prompts_per_step: int = Field(32, gt=0)
    samples_per_prompt: int = Field(8, gt=0)
    max_new_tokens: int = Field(8, gt=0)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    replicas: int = Field(1, ge=1)  # generator actors sharing each step's prompts
    chunks_per_replica: int = Field(1, ge=1)  # smaller pieces let verification start earlier
    num_cpus: float = Field(1, ge=0)
    num_gpus: float = Field(0, ge=0)

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        from actors.generation import BACKENDS
        return registered(v, BACKENDS)


class RewardSpec(Section):
    name: str  # the reward source: column reward.<name>
    fn: Optional[str] = None  # built-in name or `module:function`; defaults to `name`
    weight: float = 1.0
    timeout_s: float = Field(5.0, gt=0)

    @model_validator(mode="after")
    def _known_fn(self) -> "RewardSpec":
        from actors.rewards import REWARD_FUNCTIONS
        registered(self.fn or self.name, REWARD_FUNCTIONS)
        return self


class VerifierConfig(Section):
    rewards: list[RewardSpec] = [RewardSpec(name="integer_match")]
    on_error: float = 0.0  # reward used in the aggregate when a source fails for a sample
    accuracy_source: Optional[str] = None  # eval/accuracy = mean of this source (default: `reward`)
    num_cpus: float = Field(0, ge=0)

    @model_validator(mode="after")
    def _known_source(self) -> "VerifierConfig":
        names = [r.name for r in self.rewards]
        if self.accuracy_source is not None and self.accuracy_source not in names:
            raise ValueError(f"verifier.accuracy_source {self.accuracy_source!r} is not a reward name; "
                             f"accepted: {names}")
        return self

    @field_validator("rewards")
    @classmethod
    def _unique(cls, v: list[RewardSpec]) -> list[RewardSpec]:
        names = [r.name for r in v]
        if not names:
            raise ValueError("verifier.rewards needs at least one reward")
        if len(set(names)) != len(names):
            raise ValueError(f"verifier.rewards names must be unique, got {names}")
        return v


class AlgorithmConfig(Section):
    advantage: str = "grpo"
    policy_loss: str = "ppo_clip"
    clip_eps: float = Field(0.2, gt=0)
    kl_coef: float = Field(0.0, ge=0)  # > 0 keeps a frozen reference model (k3 estimator)
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    micro_batch_size: int = Field(256, gt=0)  # rows per forward/backward (memory)
    mini_batches: int = Field(1, ge=1)  # optimizer steps per train batch (PPO-style updates)
    num_cpus: float = Field(1, ge=0)
    num_gpus: float = Field(0, ge=0)

    @field_validator("advantage")
    @classmethod
    def _known_adv(cls, v: str) -> str:
        from actors.algorithms import ADVANTAGES
        return registered(v, ADVANTAGES)

    @field_validator("policy_loss")
    @classmethod
    def _known_loss(cls, v: str) -> str:
        from actors.algorithms import POLICY_LOSSES
        return registered(v, POLICY_LOSSES)


class WarmupConfig(Section):
    """Supervised warm-up on reference answers until a held-out accuracy target is reached."""
    enabled: bool = True
    target_accuracy: float = Field(0.3, ge=0, le=1)
    max_steps: int = Field(3000, gt=0)
    batch_size: int = Field(64, gt=0)
    lr: float = Field(3e-3, gt=0)
    eval_every: int = Field(50, gt=0)
    cache: bool = True
    cache_dir: str = "~/.cache/coevo/warmup"


class TrainConfig(Section):
    max_steps: int = Field(200, gt=0)
    stop_at_accuracy: Optional[float] = Field(None, ge=0, le=1)  # end early once eval reaches it
    eval_every: int = Field(5, gt=0)
    checkpoint_every: int = Field(0, ge=0)  # 0: only the final checkpoint
    dump_rollouts: bool = False  # rollouts/step_N.parquet
    threads: int = Field(0, ge=0)  # torch threads per actor; 0 = the node's cores


class RayConfig(Section):
    address: Optional[str] = None  # else RAY_ADDRESS, else an embedded local cluster
    num_cpus: Optional[int] = Field(None, gt=0)  # local cluster only
    dashboard: bool = False  # local cluster only; clusters started with `ray start` have one


class Config(Section):
    recipe: Literal["grpo"] = "grpo"
    seed: int = 0
    output_dir: Optional[str] = None
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    rollout: RolloutConfig = RolloutConfig()
    verifier: VerifierConfig = VerifierConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    warmup: WarmupConfig = WarmupConfig()
    train: TrainConfig = TrainConfig()
    ray: RayConfig = RayConfig()


class ConfigError(ValueError):
    """A config problem a user can fix; the message names the key and the accepted values."""


def recipe_path(name_or_path: str | None) -> Path:
    """A YAML path, or the name of a recipe in pipelines/ (default: the GRPO addition recipe)."""
    if name_or_path is None:
        return PIPELINES_DIR / f"{DEFAULT_RECIPE}.yaml"
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} not found")
        return path
    candidate = PIPELINES_DIR / f"{name_or_path}.yaml"
    if candidate.is_file():
        return candidate
    recipes = sorted(p.stem for p in PIPELINES_DIR.glob("*.yaml"))
    raise ConfigError(f"no config file or recipe named {name_or_path!r}; recipes: {recipes}")


def parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key.sub=value")
    key, _, raw = item.partition("=")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as e:
        raise ConfigError(f"override {item!r}: value is not valid YAML ({e})") from None
    return key.strip().split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    data = copy.deepcopy(data)
    for item in overrides:
        keys, value = parse_override(item)
        node = data
        for i, k in enumerate(keys[:-1]):
            child = node.get(k)
            if child is None:
                child = node[k] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {'.'.join(keys[:i + 1])} is not a section")
            node = child
        node[keys[-1]] = value
    return data


def load_config(path: str | None = None, overrides: list[str] | None = None) -> Config:
    source = recipe_path(path)
    try:
        data = yaml.safe_load(source.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections")
    data = apply_overrides(data, overrides or [])
    return validate_config(data, source=str(source))


def validate_config(data: dict, source: str = "config") -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{source}: invalid config\n" + describe_errors(e)) from None


def describe_errors(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = [p for p in err["loc"]]
        key = ".".join(str(p) for p in loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            accepted = _fields_at(loc[:-1])
            lines.append(f"  unknown key {key!r}; accepted keys here: {', '.join(accepted)}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"  {key}: {msg} (got {err.get('input')!r})")
    return "\n".join(lines)


def _fields_at(loc: list) -> list[str]:
    """Field names of the config section at `loc` (list indices are skipped)."""
    model: type[BaseModel] = Config
    for part in loc:
        if isinstance(part, int):
            continue
        ann = model.model_fields[part].annotation
        ann = getattr(ann, "__args__", (ann,))[0] if not isinstance(ann, type) else ann
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            break
        model = ann
    return list(model.model_fields)


def dump_config(config: Config, path: Path) -> None:
    path.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
