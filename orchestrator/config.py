"""Typed run configuration (pydantic): YAML file + dotted `key=value` overrides.

Validation lives next to the field it checks. Unknown keys are errors that list the accepted keys.
`Config` holds the sections every run has; a recipe and its stages add their own sections
(`Recipe.settings`, `Stage.settings`: orchestrator.settings), so `validate_config` checks a config
against the model of its recipe.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

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


def template_fields(value: str, key: str) -> str:
    """A text template a model reads must place the prompt and the response."""
    for field in ("{prompt}", "{response}"):
        if field not in value:
            raise ValueError(f"{key} must contain {field}")
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
    # Weight-init std. HF's 0.02 is a large-model default: at hidden 128 the warm-up sits for
    # hundreds of steps on a plateau whose length depends on the seed; about 1/sqrt(hidden) does not
    # (benchmarks/warmup_sweep.py).
    init_std: float = Field(0.08, gt=0)

    @model_validator(mode="after")
    def _heads_divide(self) -> "TinyModelConfig":
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError("model.tiny: hidden_size must be divisible by num_heads, "
                             "and num_heads by num_kv_heads")
        return self


class BpeModelConfig(Section):
    vocab_size: int = Field(512, ge=300)  # 256 bytes, 3 special tokens, then merges
    pad_token: bool = True  # False: the tokenizer ships without a pad token (as many do)
    cache_dir: str = "~/.cache/coevo/models"


class ModelConfig(Section):
    path: Optional[str] = None  # a local HF model directory; None builds the tiny model
    tiny: TinyModelConfig = TinyModelConfig()
    # transformers' attention kernel for every copy of the policy (generators, learners, references),
    # so the learner recomputes the generator's log-probs with the same kernel. None: transformers'
    # choice (sdpa). On CPU with sequences of tens of tokens `eager` made the learner 14% faster
    # and generation 11% slower (docs/benchmarks.md); sdpa is the usual choice on GPUs.
    attn_implementation: Optional[Literal["eager", "sdpa", "flash_attention_2"]] = None
    # The dtype of every copy of the model that does not train: generators, judges, frozen KL
    # references and reward models (a learner keeps float32 master weights). auto: bfloat16 where
    # the copy runs on a GPU, float32 on a CPU. Weight updates are cast to it as they load
    # (docs/gpu.md).
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # With no `path`: make a chat model directory locally instead of the character-level tiny model, a
    # byte-level BPE tokenizer trained on the task's text with a ChatML template and a model.tiny-shaped
    # Qwen2 model (actors/local_model.py), cached under ~/.cache/coevo/models and used as model.path
    bpe: Optional[BpeModelConfig] = None

    @model_validator(mode="after")
    def _one_model(self) -> "ModelConfig":
        if self.path and self.bpe is not None:
            raise ValueError("model: set model.path (your model directory) or model.bpe (a model made "
                             "locally), not both")
        return self


class MathWordConfig(Section):
    """Multi-step word problems (orchestrator/math_word.py): `train_size` + data.eval_size problems."""
    train_size: int = Field(4000, ge=1)
    steps: list[int] = [2, 3]  # how many operations a problem chains, drawn per problem
    max_number: int = Field(9, ge=2)  # quantities in the problems are 1..max_number

    @field_validator("steps")
    @classmethod
    def _steps(cls, v: list[int]) -> list[int]:
        if not v or min(v) < 1:
            raise ValueError(f"data.math_word.steps {v}: give one or more step counts, each >= 1")
        return v


class ArithmeticConfig(Section):
    digits: int = Field(2, ge=1, le=6)
    operators: list[Literal["+", "-", "*"]] = ["+"]
    # None: every problem (digits <= 3); a number: that many distinct problems drawn at random (seeded),
    # for spaces too large to list (4 digits: 81 million pairs an operator)
    sample: Optional[int] = Field(None, gt=0)
    # other operand sizes for some operators: a number, [low, high] (every pair of sizes between), or a
    # list of [a, b] size pairs (orchestrator/data.py size_pairs), e.g. {"*": [1, 3]} beside digits: 4;
    # sample is split evenly over the operators; {}: every operator has `digits`
    operator_digits: dict[Literal["+", "-", "*"], Union[int, tuple[int, int], list[tuple[int, int]]]] = {}

    @field_validator("operator_digits")
    @classmethod
    def _digit_range(cls, v: dict) -> dict:
        for op, d in v.items():
            if isinstance(d, tuple) and d[0] > d[1]:
                raise ValueError(f"operator_digits[{op!r}] = {list(d)}: [low, high] needs low <= high")
            sizes = [d] if isinstance(d, int) else list(d) if isinstance(d, tuple) else [x for p in d for x in p]
            if not sizes or not all(1 <= x <= 6 for x in sizes):
                raise ValueError(f"operator_digits[{op!r}] = {d}: operand sizes are 1 to 6 digits")
        return v


class SortingConfig(Section):
    """The sorting task (a verification gap: orchestrator/data.py `sorting`): sort `length` digits."""
    length: int = Field(6, ge=2, le=12)
    size: int = Field(8200, ge=2)  # distinct problems, the held-out ones (data.eval_size) included


class DataConfig(Section):
    task: Optional[Literal["arithmetic", "sorting", "math_word"]] = "arithmetic"  # a built-in task, or None with `path`
    arithmetic: ArithmeticConfig = ArithmeticConfig()
    sorting: SortingConfig = SortingConfig()
    math_word: MathWordConfig = MathWordConfig()
    path: Optional[str] = None  # user dataset: .jsonl or .parquet with `prompt` and `answer`
    eval_path: Optional[str] = None  # held-out split; if None, `eval_size` rows of `path`
    eval_size: int = Field(200, ge=1)
    prompt_template: str = "{prompt}"
    # Conversational prompts (docs/your-model.md): auto applies the tokenizer's chat template where it
    # has one (a string prompt becomes one user message), none keeps prompts as raw text, or the path
    # of a Jinja template file. A row's prompt may be a list of {role, content} messages (column
    # `messages`, or `prompt` itself)
    chat_template: str = "auto"
    # a system message put before each string prompt (needs a chat template)
    system_prompt: Optional[str] = None
    # built-in task: pair each problem with an analogous one (`pair_id`, for co_reward); user data
    # brings its own `pair_id` column
    analogs: Optional[Literal["commuted"]] = None

    @model_validator(mode="after")
    def _one_source(self) -> "DataConfig":
        if self.path is None and self.task is None:
            raise ValueError("data: set either data.task (built-in) or data.path (your file)")
        if "{prompt}" not in self.prompt_template:
            raise ValueError("data.prompt_template must contain '{prompt}'")
        return self


class RolloutConfig(Section):
    backend: str = "hf"
    prompts_per_step: int = Field(32, gt=0)  # prompt groups per train batch
    samples_per_prompt: int = Field(8, gt=0)  # the group size
    max_new_tokens: int = Field(8, gt=0)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)  # 0: no top-k truncation
    # Prompts per generate call; None: the batch split evenly over the generator replicas. Smaller
    # pieces let scoring start earlier and spread over replicas; a piece is never split later.
    chunk_prompts: Optional[int] = Field(None, gt=0)
    # DAPO's dynamic sampling (Yu et al. 2025): drop the prompt groups whose samples all got the same
    # rewards (no group-relative signal), counted as samples/dropped/uniform_reward, and sample more
    # prompts in their place, until a train batch holds prompts_per_step informative groups ...
    dynamic_sampling: bool = False
    # ... or until this many times prompts_per_step groups were generated for it; past that bound,
    # uniform groups are kept (and counted: samples/uniform_kept_at_bound)
    max_sampling_tries: int = Field(3, ge=1)
    # A sample also ends (finish_reason "stop") at the first token after which its text contains one
    # of these; its tokens are kept up to that one, and the response text ends before the string
    # (vLLM's default, include_stop_str_in_output=False). Both backends (docs/vllm.md).
    stop: list[str] = []
    # Colocation, rollout.backend=vllm on a GPU: the engine sleeps while the learner trains (1:
    # weights offloaded to CPU, 2: weights discarded and reloaded from the next update); 0: never.
    # Strict on-policy only (train.max_staleness=0). On CPU it does nothing, with a warning.
    vllm_sleep_level: int = Field(0, ge=0, le=2)
    # rollout.backend=hf: decode over a static KV cache, each step one compiled CUDA graph
    # (actors/generation/static_cache.py). None (auto): on a GPU for single-turn rollouts of 64 or
    # more new tokens (not for the default job's 8, nor for multi-turn episodes, whose batches shrink
    # turn by turn); the first call of each batch shape compiles, later ones replay.
    hf_static_cache: Optional[bool] = None

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        from actors.generation import BACKENDS
        return registered(v, BACKENDS)

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop_string(cls, v):
        return [v] if isinstance(v, str) else v  # `stop: "\n"` as vLLM takes it

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, v: list[str]) -> list[str]:
        for i, s in enumerate(v):
            if not s:  # an empty string is in every text: every sample would stop at its first token
                raise ValueError(f"rollout.stop[{i}] is {s!r}: stop strings must be non-empty")
        return v

    @model_validator(mode="after")
    def _sleep_backend(self) -> "RolloutConfig":
        if self.vllm_sleep_level and self.backend != "vllm":
            raise ValueError(f"rollout.vllm_sleep_level={self.vllm_sleep_level} applies to rollout.backend=vllm, "
                             f"not {self.backend!r}; set it to 0")
        if self.hf_static_cache and self.backend != "hf":
            raise ValueError(f"rollout.hf_static_cache=true applies to rollout.backend=hf, not {self.backend!r} "
                             "(vLLM captures its own CUDA graphs); remove it")
        return self


class RewardSpec(Section):
    """One reward source, written to column `reward.<name>`: a verifier function (`fn`), a reward
    model (`model`), or the policy judging its own samples (`judge: true`, see the judge section)."""
    name: str
    fn: Optional[str] = None  # built-in name or `module:function`; defaults to `name`
    model: Optional[str] = None  # a scalar reward model: a local directory, or "auto" (see reward_model)
    judge: bool = False
    laser: bool = False  # LaSeR's last-token self-reward, computed by the generators (see laser)
    # the environment's reward of each episode (the sum of its turns' rewards), from the generators (see env)
    env: bool = False
    args: dict[str, Any] = {}  # extra keyword arguments for `fn`
    weight: float = 1.0  # in the aggregated `reward`; 0 logs the source without training on it
    normalize: Literal["none", "group", "running"] = "none"
    timeout_s: float = Field(5.0, gt=0)
    # group functions: the column whose equal values form one call (default: the prompt's group);
    # e.g. a pair column, so a question and its analogue are scored together (co_reward)
    group_by: Optional[str] = None
    # process functions (@process_reward): where a reasoning step ends ("" = every token is a step);
    # their step rewards go to token_rewards.<name>, not to the scalar reward
    step_delimiter: Optional[str] = None

    @model_validator(mode="after")
    def _one_kind(self) -> "RewardSpec":
        if (self.fn is not None) + (self.model is not None) + self.judge + self.laser + self.env > 1:
            raise ValueError(f"rewards[{self.name}]: set one of fn (a verifier function), model "
                             "(a reward model), judge, laser or env")
        if self.kind == "fn":
            from actors.rewards import REWARD_FUNCTIONS
            registered(self.fn or self.name, REWARD_FUNCTIONS)
        elif self.args:
            raise ValueError(f"rewards[{self.name}]: args apply to fn rewards only")
        if self.step_delimiter is not None and not self.is_process:
            raise ValueError(f"rewards[{self.name}]: step_delimiter applies to process reward functions "
                             "(@process_reward, e.g. step_pattern) only")
        if self.is_process and self.normalize != "none":
            raise ValueError(f"rewards[{self.name}]: a process reward is not normalised per sample; "
                             "shape its steps with aggregate.process instead")
        return self

    def _function(self):
        """The reward function of a `fn` source (None for other kinds, or one whose import fails:
        the plug-in check reports that, by name)."""
        if self.kind != "fn":
            return None
        from actors.rewards import REWARD_FUNCTIONS
        try:
            return REWARD_FUNCTIONS.get(self.fn or self.name)
        except Exception:
            return None

    @property
    def is_process(self) -> bool:
        """A process (per-step) reward function, writing token_rewards.<name>."""
        return getattr(self._function(), "reward_scope", "sample") == "process"

    @property
    def label_free(self) -> bool:
        """A function that reads no reference answer (`@label_free_reward`): scored on every prompt, the
        ones `verifier.fraction` leaves unlabelled included."""
        return bool(getattr(self._function(), "label_free", False))

    @property
    def delimiter(self) -> str:
        return "\n" if self.step_delimiter is None else self.step_delimiter

    @property
    def kind(self) -> str:
        return ("model" if self.model is not None else "judge" if self.judge else "laser" if self.laser
                else "env" if self.env else "fn")


class VerifierConfig(Section):
    on_error: float = 0.0  # reward used in the aggregate when a source fails for a sample
    accuracy_source: Optional[str] = None  # eval/accuracy = mean of this fn source (default: the first)
    # Fraction of training prompts the verifier labels (chosen per prompt, seeded); the others get a
    # null verifier reward with no error, except from label-free functions (@label_free_reward:
    # majority_vote, co_reward), which score every prompt. Held-out prompts are always labelled.
    fraction: float = Field(1.0, ge=0, le=1)
    # which prompts those are (orchestrator/label_select.py): random (fixed per prompt, seeded) or,
    # picked after generation among each piece's groups, distinct (the most distinct responses) or
    # judge_unsure (the judge's scores closest to 0.5; needs a `judge: true` reward)
    select: Literal["random", "distinct", "judge_unsure"] = "random"
    # the share of each step's prompts drawn from those the verifier labels (None: drawn as they come,
    # at `fraction`; 1: the labelled ones alone, GRPO on the labelled prompts; between: a judge's
    # reward stands in on the rest). Needs the dataset's fixed subset (select: random)
    labelled_share: Optional[float] = Field(None, gt=0, le=1)
    # the share of the labelled training prompts held out of every judge's and reward model's training
    # (the judging warm-ups, the online judge learner, SPARK's judge loss, SPC's critic items, a reward
    # model's pairs, LaSeR's alignment): the policy still trains on them with the verifier's reward,
    # and the guard and calibration of judge_credit (and self_rewarding's guard) read the learned
    # reward on them alone, so they see its quality on prompts it has not learned (0: none)
    probe_share: float = Field(0.0, ge=0, lt=1)
    workers: int = Field(2, ge=1)  # sandboxed reward worker processes per verifier replica
    # extra workers stand in for stuck ones, so hanging samples overlap: about one time limit per batch
    max_workers: int = Field(32, ge=1)
    memory_mb: Optional[int] = Field(2048, gt=0)  # address space a reward worker may add
    cpu_time_s: Optional[float] = Field(None, gt=0)  # CPU seconds per sample (the wall limit is timeout_s)
    # a reward source that fails on every sample this many steps in a row stops the run (0: never)
    max_failed_steps: int = Field(3, ge=0)


class EnvConfig(Section):
    """Multi-turn episodes (docs/environments.md): each sample is an episode in which the policy's turns
    and the environment's observations alternate; None: one response per prompt."""
    name: Optional[str] = None  # a registered environment (calculator, python, kv_store) or `module:Class`
    args: dict[str, Any] = {}  # the environment's keyword arguments
    # how the policy writes a tool call (actors/envs/tool_calls.py): tags (<calc>1+2</calc>) or hermes
    # (the <tool_call>{json}</tool_call> of Hermes/Qwen chat templates); given to environments that take it
    tool_format: str = "tags"
    max_turns: int = Field(4, ge=1)  # policy turns per episode
    # token budget of an episode after its prompt: every turn and observation (a turn's own limit is
    # rollout.max_new_tokens); the model's context length bounds it too
    max_tokens: int = Field(128, gt=0)
    observation_tokens: Optional[int] = Field(64, gt=0)  # an observation's text is cut to this many tokens
    # the environment's per-turn rewards as dense rewards at each turn's last token (token_rewards:
    # process advantages in the credit step) instead of summed into the `env: true` reward sources
    turn_rewards: bool = False

    @field_validator("name")
    @classmethod
    def _known_env(cls, v: Optional[str]) -> Optional[str]:
        if v is None:
            return v
        from actors.envs import ENVIRONMENTS
        return registered(v, ENVIRONMENTS)

    @field_validator("tool_format")
    @classmethod
    def _known_format(cls, v: str) -> str:
        from actors.envs.tool_calls import TOOL_FORMATS
        return registered(v, TOOL_FORMATS)

    @model_validator(mode="after")
    def _args_fit(self) -> "EnvConfig":
        if self.name is None:
            if self.args:
                raise ValueError("env.args are given but env.name is not set")
            return self
        from actors.envs.make import check_args
        check_args(self.name, self.args)
        return self


class ReplicaRange(Section):
    """An elastic role: it starts at `min` replicas and grows to `max` while it is the bottleneck
    (docs/elastic.md)."""
    min: int = Field(1, ge=1)
    max: int = Field(..., ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> "ReplicaRange":
        if self.max < self.min:
            raise ValueError(f"replicas: max {self.max} is below min {self.min}")
        return self


class ReplicaRole(Section):
    """Resources of one named role: a pool of Ray actors."""
    # independent replicas; a learner's are the ranks of one torch.distributed group (docs/learners.md).
    # {min, max}: an elastic pool (not for learners) that the loop grows while the role is the
    # bottleneck and shrinks when replicas sit idle (docs/elastic.md). A verifier left unset gets
    # one replica per 8 of the generator's (docs/elastic.md)
    replicas: Annotated[int, Field(ge=1)] | ReplicaRange = 1
    # elastic pools: a replica idle this long is released (down to min)
    idle_timeout_s: float = Field(60.0, gt=0)
    # elastic pools: grow while the role is busier than this fraction of a step ...
    scale_up_busy_frac: float = Field(0.9, gt=0, le=1)
    # ... and the learner waited on rollouts for at least this fraction of the step
    scale_up_wait_frac: float = Field(0.1, ge=0, le=1)
    num_cpus: float = Field(1, ge=0)
    # GPUs per replica; a fraction shares a GPU with other roles. auto: where the cluster has GPUs
    # when the run starts, the roles that run models (generators and judges, learners, reward
    # models) get them, sharing a GPU where there are fewer GPUs than such replicas; none on a
    # CPU-only cluster (docs/gpu.md). A number is used as given.
    num_gpus: Union[Annotated[float, Field(ge=0)], Literal["auto"]] = "auto"
    threads: int = Field(0, ge=0)  # torch threads per replica; 0: train.threads
    max_restarts: int = Field(10, ge=-1)  # Ray restarts a dead replica this often (-1: always)
    # a call that takes longer counts as a hung replica: restarted, its work retried once; unset:
    # the role kind's default (orchestrator.roles.DEFAULT_TIMEOUT_S); null or 0: no limit
    timeout_s: Optional[float] = Field(None, ge=0)
    # Ray custom resources per replica, e.g. {cpu_worker: 1}: places the role on the node types
    # that declare them (cluster.yaml), which the autoscaler then starts for it.
    resources: dict[str, float] = {}
    # A learner's replicas are the ranks of one torch.distributed group, in a placement group:
    # pack them onto as few nodes as possible (fast collectives) or spread them over nodes.
    placement: Literal["pack", "spread"] = "pack"


class LoraSettings(Section):
    r: int = Field(8, gt=0)  # the adapters' rank
    alpha: float = Field(16.0, gt=0)  # their scale is alpha / r
    dropout: float = Field(0.0, ge=0, lt=1)  # 0 keeps the learner's log-probs the generator's exactly
    # module names (peft's target_modules) or "all-linear": every linear layer but the output layer
    target_modules: Union[list[str], Literal["all-linear"]] = "all-linear"

    @field_validator("target_modules")
    @classmethod
    def _not_the_head(cls, v):
        if isinstance(v, list):
            if not v:
                raise ValueError("learner.lora.target_modules is empty: name modules (q_proj, v_proj, ...) or "
                                 "give all-linear")
            head = [m for m in v if m in ("lm_head", "embed_tokens")]
            if head:
                raise ValueError(f"learner.lora.target_modules: {head[0]!r} is not supported (the learner computes "
                                 "log-probs from the output layer's own weight); adapt the decoder layers")
        return v


class LearnerConfig(Section):
    """How a learner role with `roles.<name>.replicas: N` trains as N ranks (docs/learners.md)."""
    # ddp: every rank holds the model, gradients are averaged; fsdp2: parameters, gradients and
    # optimizer state sharded over the ranks (torch.distributed.fsdp.fully_shard)
    strategy: Literal["ddp", "fsdp2"] = "ddp"
    backend: Literal["auto", "gloo", "nccl"] = "auto"  # auto: nccl on GPU, gloo on CPU
    # Compute dtype of the learner's forward and backward passes, at any world size: auto is bf16 on
    # a CUDA GPU (autocast; fp32 master weights and optimizer state), fp32 on a CPU (docs/learner.md)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    mixed_precision: Optional[Literal["bf16", "fp16"]] = None  # the old name of precision (fsdp2 only); kept
    # Padding-free packed micro-batches (varlen attention): auto is on a GPU, off on a CPU, where
    # padded micro-batches sharing each group's prompt forward are faster for short rows
    packing: Literal["auto", "on", "off"] = "auto"
    # recompute each decoder layer's activations in the backward pass: less memory, ~1/3 more compute
    gradient_checkpointing: bool = False
    # the device's dense peak TFLOP/s for perf/mfu (None: known GPUs by name, bf16 or fp32/tf32)
    peak_tflops: Optional[float] = Field(None, gt=0)
    cpu_offload: bool = False  # fsdp2 on GPU: parameters and optimizer state in host memory
    # a collective that waits longer (a rank died or hangs) fails instead of blocking for ever
    timeout_s: float = Field(600.0, gt=0)
    # LoRA adapters (peft): only they train in RL and sit in the optimizer; generators get the merged
    # weights; the KL reference is the base with the adapters off (docs/your-model.md#lora). None: the
    # whole model trains
    lora: Optional[LoraSettings] = None

    @model_validator(mode="after")
    def _lora_strategy(self) -> "LearnerConfig":
        if self.lora is not None and self.strategy == "fsdp2":
            raise ValueError("learner.lora is not supported with learner.strategy=fsdp2 (peft's adapters are "
                             "not sharded here); use learner.strategy=ddp, or train the whole model with fsdp2")
        return self

    @model_validator(mode="after")
    def _old_precision_name(self) -> "LearnerConfig":
        if self.mixed_precision and self.precision == "auto":
            self.precision = self.mixed_precision
        return self


# Each method's own loss aggregation, where it is not the token mean, by policy loss then advantage:
# Dr.GRPO (Liu et al. 2025) a constant normaliser instead of each response's length; GSPO and GMPO
# are sequence-level objectives (a response's token mean is its objective); TOPR's is the sum of a
# response's token log-probs (its log-likelihood).
OWN_LOSS_AGG = {"dr_grpo": "seq_sum_constant", "gspo": "seq_mean_token_mean", "gmpo": "seq_mean_token_mean",
                "topr": "seq_mean_token_sum"}


class AlgorithmConfig(Section):
    advantage: str = "grpo"
    policy_loss: str = "ppo_clip"
    # Off-policy correction: "none" (on-policy PPO clip against the behaviour log-probs), "tis"
    # (truncated importance sampling) or "decoupled_ppo" (proximal policy recomputed). Required
    # explicitly when train.max_staleness > 0.
    off_policy: Optional[str] = None
    is_cap: float = Field(2.0, gt=0)  # truncation of the behaviour importance weight
    clip_eps: float = Field(0.2, gt=0)
    clip_eps_high: Optional[float] = Field(None, gt=0)  # DAPO clip-higher; None: clip_eps
    # the policy loss's own options, e.g. clip_cov {ratio, lower, upper}, kl_cov {ratio, coef}
    # (actors/algorithms/policy_losses.py)
    loss_params: dict[str, float] = {}
    # a bonus of this times each token's entropy under the sampling distribution (0: off)
    entropy_coef: float = Field(0.0, ge=0)
    kl_coef: float = Field(0.0, ge=0)  # > 0 keeps a frozen reference model
    # the KL term's estimator: k3 (gradient of the forward KL(ref || pi)), k2 (of the reverse
    # KL(pi || ref)) or k1 (zero expected gradient); actors/algorithms/losses.py
    kl_estimator: str = "k3"
    # How the per-token loss becomes one number per optimizer update. None: the advantage
    # method's own (dr_grpo: seq_sum_constant; gspo, gmpo: seq_mean_token_mean; topr:
    # seq_mean_token_sum; the others: token_mean). token_mean: over every
    # token; seq_mean_token_mean: each response's token mean, averaged over responses (GRPO's
    # paper); seq_mean_token_sum: each response's token sum, averaged over responses;
    # seq_sum_constant: token sums over responses / (responses x rollout.max_new_tokens) (Dr.GRPO).
    loss_agg: Optional[Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_sum_constant"]] = None
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    micro_batch_size: int = Field(256, gt=0)  # at most this many rows per forward/backward
    # at most this many tokens per forward/backward (prompt + response; padded ones where rows are
    # padded): the memory knob. Rows are never split; a longer row runs alone (docs/learner.md#packing)
    micro_batch_tokens: Optional[int] = Field(16384, gt=0)
    mini_batches: int = Field(1, ge=1)  # optimizer steps per train batch, of near-equal size
    # Skip the forward/backward of groups whose samples all got the same reward: with a
    # group-relative advantage they carry no gradient (the token-mean keeps the whole batch's count,
    # so the update is unchanged).
    skip_uniform_groups: bool = True

    @field_validator("advantage")
    @classmethod
    def _known_adv(cls, v: str) -> str:
        from actors.algorithms import ADVANTAGES
        return registered(v, ADVANTAGES)

    @field_validator("kl_estimator")
    @classmethod
    def _known_kl(cls, v: str) -> str:
        from actors.algorithms import KL_ESTIMATORS
        return registered(v, KL_ESTIMATORS)

    @model_validator(mode="after")
    def _loss_params_fit(self) -> "AlgorithmConfig":
        if self.loss_params:
            import inspect

            from actors.algorithms import POLICY_LOSSES
            fn = POLICY_LOSSES.get(self.policy_loss)
            fixed = {"logprobs", "old_logprobs", "advantages", "clip_eps", "clip_eps_high", "mask"}
            accepted = [p for p in inspect.signature(fn).parameters if p not in fixed]
            unknown = sorted(set(self.loss_params) - set(accepted))
            if unknown:
                raise ValueError(f"algorithm.loss_params: policy loss {self.policy_loss!r} takes no {unknown[0]!r}; "
                                 f"it takes {accepted or 'no options'}")
        return self

    def aggregation(self) -> str:
        """The loss aggregation in effect: `loss_agg`, else the advantage estimator's own."""
        return self.loss_agg or OWN_LOSS_AGG.get(self.policy_loss) or OWN_LOSS_AGG.get(self.advantage, "token_mean")

    @field_validator("policy_loss")
    @classmethod
    def _known_loss(cls, v: str) -> str:
        from actors.algorithms import POLICY_LOSSES
        return registered(v, POLICY_LOSSES)

    @field_validator("off_policy")
    @classmethod
    def _known_correction(cls, v: Optional[str]) -> Optional[str]:
        from actors.algorithms import OFF_POLICY
        return v if v is None else registered(v, OFF_POLICY)


class WarmupConfig(Section):
    """Supervised warm-up on reference answers until a held-out accuracy target is reached."""
    enabled: bool = True
    target_accuracy: float = Field(0.3, ge=0, le=1)
    max_steps: int = Field(3000, gt=0)
    batch_size: int = Field(64, gt=0)
    lr: float = Field(3e-3, gt=0)
    # the teacher-forced check every this many steps (a forward pass over the held-out prompts: 3%
    # of 10 steps' time, measured): it stops within this many steps of the target (at 50, up to 49
    # steps past it)
    eval_every: int = Field(10, gt=0)
    cache: bool = True
    cache_dir: str = "~/.cache/coevo/warmup"
    # Another task to warm up on (None: the run's data). target_accuracy is then reached on its held-out
    # split, and the run's task is measured once at the end (warmup/accuracy): a warm-up that teaches
    # a format (the tool-call protocol, with env) without seeing the task RL is to learn
    data: Optional[DataConfig] = None


class TrainConfig(Section):
    max_steps: int = Field(200, gt=0)
    stop_at_accuracy: Optional[float] = Field(None, ge=0, le=1)  # end early once eval reaches it
    eval_every: int = Field(5, gt=0)
    # 0 = strict on-policy; k > 0 lets generation run up to k policy versions ahead of the learner.
    max_staleness: int = Field(0, ge=0)
    checkpoint_every: int = Field(50, ge=0)  # 0: only the final checkpoint (and on SIGTERM/SIGINT)
    # also after the first step that ends this many seconds after the last checkpoint (or the loop's
    # start), so long steps do not leave hours of work unprotected; None: by step count only
    checkpoint_every_s: Optional[float] = Field(None, gt=0)
    # a learner that dies or hangs (kill -9, out of memory, a lost node) restarts, with the other learner
    # roles, from the newest checkpoint (with none yet: from the first step) this many times, while the
    # other roles keep running; 0: the run ends
    learner_restarts: int = Field(2, ge=0)
    keep_checkpoints: int = Field(2, ge=1)  # the newest K step checkpoints are kept
    dump_rollouts: bool = False  # rollouts/step_N.parquet
    threads: int = Field(0, ge=0)  # torch threads per actor; 0 = the node's cores


class RayConfig(Section):
    address: Optional[str] = None  # else RAY_ADDRESS, else an embedded local cluster
    num_cpus: Optional[int] = Field(None, gt=0)  # local cluster only
    # local cluster only: the GPUs it offers (None: what Ray detects; 0 keeps every role on the CPU)
    num_gpus: Optional[int] = Field(None, ge=0)
    dashboard: bool = False  # local cluster only; clusters started with `ray start` have one


class WeightsConfig(Section):
    """How a weight channel carries a learner's published versions to its target replicas
    (docs/weights.md)."""
    # object_store: one payload per publish, every replica maps it (zero-copy on a node). collective:
    # the learner broadcasts over a process group with the replicas (gloo/nccl), in buckets
    transport: Literal["object_store", "collective"] = "object_store"
    bucket_mb: float = Field(256.0, gt=0)  # bucket size of the collective broadcast, MiB
    # auto: nccl when the learner and every target replica have a GPU, else gloo
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    # object_store: a replica on the learner's own GPU (colocated, one learner rank) takes each
    # version through CUDA IPC handles to a copy on that GPU instead, falling back to the object
    # store where that fails (docs/weights.md)
    cuda_ipc: bool = True
    # a collective publish (forming the group, or one broadcast) that takes longer fails; the
    # channel then sends that version through the object store and forms a new group next time
    timeout_s: float = Field(300.0, gt=0)
    # forming a new group: every replica must arrive within this; one that does not (it died before
    # joining) is dropped to the object store for that version, counted (channel/<name>/join_failures)
    join_timeout_s: float = Field(30.0, gt=0)


class Config(Section):
    recipe: str = "grpo"  # a registered recipe (pipelines) or `module:Class`
    seed: int = 0  # data order, sampling and model init
    output_dir: Optional[str] = None  # the run directory; None: runs/<recipe>-<time> (or --output-dir)
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    rollout: RolloutConfig = RolloutConfig()
    rewards: list[RewardSpec] = [RewardSpec(name="integer_match")]
    verifier: VerifierConfig = VerifierConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    warmup: WarmupConfig = WarmupConfig()
    train: TrainConfig = TrainConfig()
    learner: LearnerConfig = LearnerConfig()
    env: EnvConfig = EnvConfig()  # multi-turn episodes with an environment (docs/environments.md)
    # Extra aggregation stages over the reward sources (G-RA gates, PAR, Parrot selection, process
    # rewards): see actors/rewards/aggregate.py. Weights and normalisation come from `rewards`.
    aggregate: dict[str, Any] = {}
    roles: dict[str, ReplicaRole] = {}  # resources per role; the recipe names its roles
    ray: RayConfig = RayConfig()
    weights: WeightsConfig = WeightsConfig()  # how learners reach their replicas (docs/weights.md)

    @field_validator("recipe")
    @classmethod
    def _known_recipe(cls, v: str) -> str:
        from orchestrator.recipes import RECIPES
        return registered(v, RECIPES)

    @field_validator("rewards")
    @classmethod
    def _unique(cls, v: list[RewardSpec]) -> list[RewardSpec]:
        names = [r.name for r in v]
        if not names:
            raise ValueError("rewards needs at least one reward source")
        if len(set(names)) != len(names):
            raise ValueError(f"rewards names must be unique, got {names}")
        return v

    def _label_checks(self) -> None:
        """verifier.select: a recipe that scores its pieces so, a fraction to spend, a judge to read, a
        subset fixed before generation and unlabelled prompts where a share of each step is drawn."""
        select = self.verifier.select
        share = self.verifier.labelled_share
        if share is not None and select != "random":
            raise ValueError(f"verifier.labelled_share={share} draws from the prompts the dataset labels, but "
                             f"verifier.select={select} picks them after generation: use verifier.select=random")
        if share is not None and self.verifier.fraction >= 1:
            raise ValueError(f"verifier.labelled_share={share} splits each step between labelled and unlabelled "
                             "prompts, but verifier.fraction=1 labels every one: set a fraction below 1")
        probes = self.verifier.probe_share
        from orchestrator.recipes import RECIPES

        learns = getattr(RECIPES.get(self.recipe), "learns_rewards", False)
        if probes and not (learns or self.judge_rewards() or self.model_rewards() or self.laser_rewards()):
            raise ValueError(f"verifier.probe_share={probes} holds labelled prompts out of a judge's or reward "
                             "model's training, but no reward source is learned (judge: true, model:, laser: "
                             "true): drop it")
        if probes and select != "random":
            raise ValueError(f"verifier.probe_share={probes} holds out prompts the dataset labels, but "
                             f"verifier.select={select} picks them after generation: use verifier.select=random")
        if select == "random":
            return
        if not getattr(RECIPES.get(self.recipe), "selects_labels", False):
            raise ValueError(f"verifier.select={select}: recipe {self.recipe!r} labels its prompts as the dataset "
                             "fixes them (verifier.select=random); picking them after generation works with "
                             "grpo's family (grpo, spark, spc, laser, cooper, ppo, prime, dph)")
        if self.verifier.fraction >= 1:
            raise ValueError(f"verifier.select={select} picks which prompts the verifier labels, but "
                             "verifier.fraction=1 labels every one: set a fraction below 1")
        if select == "judge_unsure" and not self.judge_rewards():
            raise ValueError("verifier.select=judge_unsure labels the groups the judge is least sure of, but no "
                             "reward source is `judge: true`; add one or use verifier.select=distinct")

    @model_validator(mode="after")
    def _cross_checks(self) -> "Config":
        fn_names = [r.name for r in self.fn_rewards()]
        owned = [name for name in type(self).model_fields if name not in Config.model_fields]
        sources = [("verifier.accuracy_source", self.verifier.accuracy_source)]
        sources += [(f"{name}.label_source", getattr(self, name).label_source) for name in owned
                    if hasattr(getattr(self, name), "label_source")]
        for key, value in sources:
            if value is not None and value not in fn_names:
                raise ValueError(f"{key} {value!r} is not a verifier (fn) reward; accepted: {fn_names}")
        self._env_checks()
        self._label_checks()
        for reward in self.rewards:
            needs = {"model": "reward_model", "judge": "judge", "laser": "laser"}.get(reward.kind)
            if needs and needs not in type(self).model_fields:
                raise ValueError(f"rewards[{reward.name}]: a {reward.kind} reward needs the {needs!r} settings, "
                                 f"which recipe {self.recipe!r} does not declare (its stages or its settings)")
        for name in owned:  # a recipe's section checks what it reads from the rest of the config
            check = getattr(getattr(self, name), "cross_check", None)
            if check is not None:
                check(self)
        if self.process_rewards() and not self.fn_rewards():
            raise ValueError("rewards: every verifier is a process reward; add an outcome (scalar) verifier, "
                             "e.g. {name: correct, fn: integer_match}, which also measures held-out accuracy")
        from actors.algorithms import ADVANTAGES
        group_relative = getattr(ADVANTAGES.get(self.algorithm.advantage), "group_relative", False)
        if group_relative and self.rollout.samples_per_prompt < 2:
            raise ValueError(f"algorithm.advantage {self.algorithm.advantage!r} compares the samples of "
                             "a prompt with each other: rollout.samples_per_prompt must be >= 2, got "
                             f"{self.rollout.samples_per_prompt}")
        if self.rollout.vllm_sleep_level and self.train.max_staleness > 0:
            raise ValueError(f"rollout.vllm_sleep_level={self.rollout.vllm_sleep_level} sleeps the generators while "
                             f"the learner trains, but train.max_staleness={self.train.max_staleness} overlaps "
                             "generation with training; use one or the other")
        if self.train.max_staleness > 0 and self.algorithm.off_policy in (None, "none"):
            raise ValueError("train.max_staleness > 0 trains on samples from older policies: choose an "
                             "off-policy correction explicitly, algorithm.off_policy=tis or decoupled_ppo")
        from actors.rewards.aggregate import Aggregator
        try:
            Aggregator(self.aggregate_spec(), sources=[r.name for r in self.rewards])
        except ValueError as e:
            raise ValueError(f"aggregate: {e}") from None
        if "weights" in self.aggregate or "on_error" in self.aggregate:
            raise ValueError("aggregate.weights / aggregate.on_error: set rewards[].weight and "
                             "verifier.on_error instead")
        from orchestrator.recipes import RECIPES, Sources
        # the recipe's credit step checks that it fits algorithm.advantage (orchestrator.credit.check_advantages);
        # a bare Config (the defaults every run shares) has none of its recipe's sections to build it from
        if owned or getattr(ADVANTAGES.get(self.algorithm.advantage), "needs_values", False):
            RECIPES.get(self.recipe).credit(self, Sources())
        kinds = RECIPES.get(self.recipe).role_kinds(self)
        known = list(kinds)
        unknown = sorted(set(self.roles) - set(known))
        if unknown:
            raise ValueError(f"roles: recipe {self.recipe!r} has no role {unknown[0]!r}; its roles: {known}")
        for name, role in self.roles.items():
            if kinds[name] == "learner" and isinstance(role.replicas, ReplicaRange):
                raise ValueError(f"roles.{name}.replicas={{min: {role.replicas.min}, max: {role.replicas.max}}}: "
                                 f"{name} is a learner, whose replicas are the ranks of one torch.distributed "
                                 "group; it cannot grow or shrink mid-run (give an int)")
        chunk = self.rollout.chunk_prompts
        if chunk is not None and self.rollout.prompts_per_step % chunk:
            raise ValueError(f"rollout.chunk_prompts={chunk} must divide rollout.prompts_per_step="
                             f"{self.rollout.prompts_per_step}")
        return self

    def _env_checks(self) -> None:
        """What multi-turn episodes need of the rest of the config."""
        env_rewards = [r.name for r in self.rewards if r.kind == "env"]
        if env_rewards and self.env.name is None:
            raise ValueError(f"rewards[{env_rewards[0]}]: an env reward needs an environment: set env.name")
        if self.env.name is None:
            return
        if self.env.turn_rewards and not env_rewards:
            raise ValueError("env.turn_rewards places the environment's rewards on tokens; it needs a reward "
                             "source {name: ..., env: true} (its weight scales them)")
        if self.laser_rewards():
            raise ValueError("env.name: LaSeR's self-reward reads the token after a single response; it does not "
                             "apply to multi-turn episodes (remove the laser reward or env.name)")
        from actors.algorithms import ADVANTAGES
        if getattr(ADVANTAGES.get(self.algorithm.advantage), "needs_values", False):
            raise ValueError(f"env.name: algorithm.advantage={self.algorithm.advantage} needs a critic's values per "
                             "token, which multi-turn episodes do not have (observation tokens are no actions); use "
                             "an outcome estimator such as grpo")

    def __reduce__(self):
        # The class is built per recipe (orchestrator.settings), so a pickle (an actor's copy)
        # carries the values and is checked again against its recipe's model where it is loaded.
        return validate_config, (self.model_dump(mode="python"),)

    def aggregate_spec(self) -> dict:
        """The reward aggregation spec: each source's weight and normalisation, plus `aggregate:`."""
        process = self.process_rewards()
        scalar = [r for r in self.rewards if r not in process]
        spec: dict[str, Any] = {"weights": {r.name: r.weight for r in scalar},
                                "on_error": self.verifier.on_error}
        normalize = {r.name: r.normalize for r in scalar if r.normalize != "none"}
        if normalize:
            spec["normalize"] = normalize
        spec.update(self.aggregate)
        if process:  # every process source is shaped (default: as is) with its rewards[] weight
            given = dict(self.aggregate.get("process") or {})
            spec["process"] = {**given, **{r.name: {"weight": r.weight, **(given.get(r.name) or {})}
                                           for r in process}}
        return spec

    def fn_rewards(self) -> list[RewardSpec]:
        """Outcome verifiers (one scalar per sample): process functions are listed separately."""
        return [r for r in self.rewards if r.kind == "fn" and not r.is_process]

    def process_rewards(self) -> list[RewardSpec]:
        """Per-token reward sources (token_rewards.<name>): process verifiers, and the environment's
        per-turn rewards with env.turn_rewards."""
        return [r for r in self.rewards if r.is_process or (r.kind == "env" and self.env.turn_rewards)]

    def model_rewards(self) -> list[RewardSpec]:
        return [r for r in self.rewards if r.kind == "model"]

    def judge_rewards(self) -> list[RewardSpec]:
        return [r for r in self.rewards if r.kind == "judge"]

    def laser_rewards(self) -> list[RewardSpec]:
        return [r for r in self.rewards if r.kind == "laser"]

    def accuracy_source(self) -> Optional[str]:
        fns = self.fn_rewards()
        return self.verifier.accuracy_source or (fns[0].name if fns else None)

    def label_source(self, section) -> Optional[str]:
        fns = self.fn_rewards()
        return section.label_source or (fns[0].name if fns else None)


# Keys that moved, so an old config gets pointed at the new place instead of a bare "unknown key".
MOVED = {
    "verifier.rewards": "rewards (a top-level list)",
    "verifier.num_cpus": "roles.verifier.num_cpus",
    "rollout.replicas": "roles.generator.replicas",
    "rollout.num_cpus": "roles.generator.num_cpus",
    "rollout.num_gpus": "roles.generator.num_gpus",
    "rollout.chunks_per_replica": "rollout.chunk_prompts",
    "algorithm.num_cpus": "roles.policy_learner.num_cpus",
    "algorithm.num_gpus": "roles.policy_learner.num_gpus",
}


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
    data = read_config_file(source)
    data = apply_overrides(data, overrides or [])
    given = tuple(".".join(parse_override(item)[0]) for item in overrides or [])
    return validate_config(data, source=str(source), overridden=given)


def read_config_file(source: Path, _seen: tuple[Path, ...] = ()) -> dict:
    """A YAML config as a mapping, its `base:` folded in: `base: NAME` (a recipe in pipelines/) or a
    path (relative to this file) whose config this one states only the differences from. Mappings
    merge key by key, at any depth; anything else (a list, a value) replaces the base's."""
    try:
        data = yaml.safe_load(source.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections")
    data = resolve_file_paths(data, source.resolve().parent)  # each file's paths beside that file
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"{source}: base must be a recipe name or a YAML path, got {base!r}")
    beside = source.resolve().parent / base
    try:
        parent = beside if Path(base).suffix in (".yaml", ".yml") and beside.is_file() else recipe_path(base)
    except ConfigError as e:
        raise ConfigError(f"{source}: base {base!r}: {e}") from None
    if parent.resolve() in _seen or parent.resolve() == source.resolve():
        chain = " -> ".join(str(p) for p in (*_seen, source.resolve(), parent.resolve()))
        raise ConfigError(f"{source}: base {base!r} leads back to itself ({chain})")
    return merge_config(read_config_file(parent, (*_seen, source.resolve())), data)


def merge_config(base: dict, changes: dict) -> dict:
    """`base` with `changes` over it: mappings merged key by key, anything else replaced."""
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_config(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# Keys whose values are files or directories (rewards[].model too, unless "auto").
PATH_KEYS = (("data", "path"), ("data", "eval_path"), ("model", "path"), ("reward_model", "pairs_path"),
             ("reward_model", "eval_pairs_path"), ("reward_model", "init"))


def resolve_file_paths(data: dict, base: Path) -> dict:
    """A relative path written in a YAML file names a file beside that file when one is there (so
    `coevo run code_tasks` finds its data from any directory); else it stays relative to the working
    directory, as a path given on the command line is. Found ones become absolute, so the run's
    saved config.yaml reruns from anywhere."""
    def beside(value):
        if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
            found = base / value
            if found.exists():
                return str(found)
        return value

    data = copy.deepcopy(data)
    for section, key in PATH_KEYS:
        if isinstance(data.get(section), dict) and key in data[section]:
            data[section][key] = beside(data[section][key])
    for reward in data.get("rewards") or []:
        if isinstance(reward, dict) and reward.get("model") not in (None, "auto"):
            reward["model"] = beside(reward["model"])
    return data


def validate_config(data: dict, source: str = "config", overridden: tuple[str, ...] = ()) -> Config:
    """`data` checked against its recipe's config model; `source` names it in errors, and `overridden`
    the dotted keys that came from the command line rather than from it."""
    from orchestrator.settings import model_for
    try:
        model = model_for(data, Config)
    except ImportError as e:  # a user recipe that cannot load
        raise ConfigError(f"{source}: recipe {data.get('recipe')!r}: {e} (a recipe module is imported from the "
                          f"working directory, {os.getcwd()}, and PYTHONPATH)") from None
    except ValueError as e:  # it declares a bad section
        raise ConfigError(f"{source}: recipe {data.get('recipe')!r}: {e}") from None
    data = drop_unused_sections(data, model, source, overridden)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{source}: invalid config\n" + describe_errors(e, model, data.get("recipe", "grpo"))) from None


EXAMPLE_SOURCE = {"judge": "{name: judge, judge: true}", "laser": "{name: self, laser: true}",
                  "model": "{name: rm, model: auto}"}  # a reward source of each learned kind, for messages


def drop_unused_sections(data: dict, model: type[BaseModel], source: str, overridden: tuple[str, ...] = ()) -> dict:
    """`data` without the sections of stages its reward sources do not call for (orchestrator.settings:
    a config holds the sections of the stages it can run). One that holds only defaults goes quietly
    (a run's config.yaml saved before sections depended on the rewards); one that sets a value is an
    error naming it, since nothing would read it."""
    from orchestrator.settings import reward_kinds, unused_sections
    unused = unused_sections(data, model, Config) if isinstance(data, dict) else {}
    if not unused:
        return data
    data = dict(data)
    for key, (stage, section) in unused.items():
        value = data.pop(key)
        if isinstance(value, BaseModel):  # a config built in code
            value = value.model_dump()
        if value is None or value == {}:
            continue
        changed = _set_keys(key, value, section)
        if not changed:
            continue
        where = " (on the command line)" if all(k.split("=")[0] in overridden or key in overridden
                                                   for k in changed) else ""
        wanted = " or ".join(f"a {k} reward source ({EXAMPLE_SOURCE.get(k, k)})" for k in stage.rewards)
        have = ", ".join(sorted(reward_kinds(data, Config))) or "none"
        raise ConfigError(f"{source}: section {key!r} sets {', '.join(changed)}{where}, but it is read only with "
                          f"{wanted}, which this config's rewards lack (their kinds: {have}); add one, or drop "
                          f"the section ({key}=null on the command line, `{key}: null` in a YAML file, which also "
                          f"drops one that a `base:` brings)")
    return data


def _set_keys(key: str, value, section: type[BaseModel]) -> list[str]:
    """`key.k=v` for each value in a section's raw `value` that differs from the section's default,
    or is no key of it."""
    if not isinstance(value, dict):
        return [f"{key}={value!r}"]
    default, out = section(), []
    for k, v in value.items():
        if k not in section.model_fields:
            out.append(f"{key}.{k}={v!r} (no such key)")
            continue
        try:
            given = getattr(section.model_validate({**default.model_dump(), k: v}), k)
        except ValidationError:
            out.append(f"{key}.{k}={v!r}")
            continue
        if given != getattr(default, k):
            out.append(f"{key}.{k}={given!r}")
    return out


def describe_errors(exc: ValidationError, model: Optional[type[BaseModel]] = None, recipe: str = "grpo") -> str:
    from orchestrator.settings import section_owners
    model = model or Config
    lines = []
    for err in exc.errors():
        loc = [p for p in err["loc"]]
        key = ".".join(str(p) for p in loc) or "(top level)"
        if err["type"] == "extra_forbidden" and key in MOVED:
            lines.append(f"  {key!r} has moved: use {MOVED[key]}")
        elif err["type"] == "extra_forbidden" and len(loc) == 1 and section_owners(key, Config):
            owners = section_owners(key, Config)
            lines.append(f"  section {key!r} belongs to recipe{'s' * (len(owners) > 1)} {', '.join(owners)}, not to "
                         f"recipe {recipe!r} (its sections: {', '.join(model.model_fields)})")
        elif err["type"] == "extra_forbidden":
            accepted = _fields_at(model, loc[:-1])
            lines.append(f"  unknown key {key!r}; accepted keys here: {', '.join(accepted)}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            got = err.get("input")
            if err["type"] == "value_error" and (isinstance(got, dict) or not loc):  # a whole section's cross-check names its values
                lines.append(f"  {key}: {msg}")
            else:
                lines.append(f"  {key}: {msg} (got {got!r})")
    return "\n".join(lines)


def _fields_at(model: type[BaseModel], loc: list) -> list[str]:
    """Field names of the config section at `loc` in `model` (list indices are skipped)."""
    parts = iter(loc)
    for part in parts:
        if isinstance(part, int) or part not in model.model_fields:
            continue
        ann = model.model_fields[part].annotation
        if getattr(ann, "__origin__", None) is dict:  # roles.<name>: skip the key
            ann = ann.__args__[1]
            next(parts, None)
        ann = getattr(ann, "__args__", (ann,))[0] if not isinstance(ann, type) else ann
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            break
        model = ann
    return list(model.model_fields)


def dump_config(config: Config, path: Path) -> None:
    path.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
