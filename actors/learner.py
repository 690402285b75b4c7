"""Policy learner actor: owns the policy, its optimizer, its frozen reference and its checkpoints, and
hosts one or more objectives (actors/objectives/): policy_gradient (the RL step on the advantages
the credit step wrote), preference, sft, and whatever a recipe's role spec adds (laser_align, value,
rehearsal, self_judge), each built with its options as typed arguments. The RL step, the
preference step and the SFT warm-up have methods here; a recipe reaches its own objectives' methods
through `call_objective`. Versioned weights are published for the generators. See docs/learner.md."""

from __future__ import annotations

import copy
from pathlib import Path

import pyarrow as pa
import ray
import torch

from actors import lora
from actors.objectives import Objective, build
from actors.trainable import Trainable, adamw

REFERENCE_DIR = "reference"


DEFAULT_OBJECTIVES = ("policy_gradient", "preference", "sft")  # a role that names none: the RL step, the warm-ups


class Learner(Trainable):
    def __init__(self, config, model_source: str | None = None, role: dict | None = None,
                 objectives: list | None = None, lr: float | None = None, reference: bool = True,
                 fresh: bool = False):
        """`objectives`: names or `{"name": ..., **options}` entries (a role's kwargs); None: DEFAULT_OBJECTIVES.
        `lr`: the optimizer's learning rate (default algorithm.lr); `reference`: keep the frozen KL
        reference when algorithm.kl_coef > 0 (a critic does not need one); `fresh`: the model's
        architecture with random weights (seeded by the run's seed), not its trained ones."""
        from actors import modeling

        self._setup(config, role)
        self.algo = config.algorithm
        self.sampling = dict(temperature=config.rollout.temperature, top_k=config.rollout.top_k,
                             top_p=config.rollout.top_p)
        from actors import chat

        self.model, self.tokenizer = modeling.build(config.model, config.seed)
        chat.configure(self.tokenizer, config.data.chat_template)  # supervised answers end with its end-of-turn
        self.model_source = model_source  # objectives read their files saved beside the model
        if model_source:
            self.model = modeling.load_model(model_source, attn=config.model.attn_implementation)
        if fresh:
            self.model = modeling.reinitialised(self.model, config.seed + 7919)
        self.model.to(self.device).train()
        self.lora = config.learner.lora is not None  # adapters train in RL (actors/lora.py)
        if self.lora:
            self.model = lora.wrap(self.model, config.learner.lora)
        self._engine_setup()
        self.reference = None
        self.lr = lr or self.algo.lr
        self.wants_reference = reference and self.algo.kl_coef > 0
        if self.wants_reference:  # frozen copy of the starting policy (replaced on resume)
            self.reference = lora.AdapterOff(self.model) if self.lora else \
                copy.deepcopy(self.model).eval().requires_grad_(False).to(self.frozen_dtype())
        self.skipped_steps = 0
        self._sft_optimizer = self._sft_lr = self._teacher = None
        self.objectives = build(DEFAULT_OBJECTIVES if objectives is None else objectives, self)
        self.optimizer = self._new_optimizer(self.lr)

    def objective(self, name: str, method: str) -> Objective:
        if name not in self.objectives:
            raise RuntimeError(f"learner method {method!r} needs the {name!r} objective, but this learner hosts "
                               f"{list(self.objectives)}; list it in the role's `objectives`")
        return self.objectives[name]

    def call_objective(self, name: str, method: str, *args, **kwargs):
        """A hosted objective's own public method (a recipe's: the critic's `values_of`, the
        rehearsal's `set`, LaSeR's `align_steps`), so this class lists no recipe's methods. Through a
        pool: `pool.call("call_objective", "value", "values_of", table)`."""
        objective = self.objective(name, method)
        fn = getattr(objective, method, None) if not method.startswith("_") else None
        if not callable(fn) or method in vars(Objective):
            public = sorted(m for m in dir(type(objective)) if not m.startswith("_") and m not in vars(Objective)
                            and callable(getattr(objective, m)))
            raise AttributeError(f"the {name!r} objective ({type(objective).__name__}) has no method {method!r} to "
                                 f"call; its own methods: {public}")
        return fn(*args, **kwargs)

    def trained_parameters(self) -> list[torch.nn.Parameter]:
        """The model's parameters (with LoRA: those that train now, the adapters in RL), then those of the
        objectives' own modules (a value head)."""
        own = [p for p in self.model.parameters() if p.requires_grad] if self.lora else list(self.model.parameters())
        return own + [p for o in self.objectives.values() for p in o.parameters()]

    # ---- LoRA (actors/lora.py): merged weights out, the adapter in checkpoints, the base as reference ---
    def full_state(self) -> dict[str, torch.Tensor]:
        return lora.merged_state(self.model) if self.lora else super().full_state()

    def save_model(self, model: torch.nn.Module, out: Path, tokenizer: bool = True) -> None:
        """With LoRA: the merged model (or, for the reference view, the base) as plain transformers loads it."""
        if not (self.lora and (model is self.model or isinstance(model, lora.AdapterOff))):
            return super().save_model(model, out, tokenizer)
        if self.ranks.is_main:
            state = lora.merged_state(self.model) if model is self.model else lora.base_state(self.model)
            self.model.get_base_model().save_pretrained(out, state_dict=state)
            if tokenizer:
                self.tokenizer.save_pretrained(out)

    def frozen_copy(self) -> torch.nn.Module:
        """With LoRA: the adapters folded into the base (where they moved), and the base as the reference."""
        if not self.lora:
            return super().frozen_copy()
        if not lora.adapters_zero(self.model):
            lora.fold(self.model)
        return lora.AdapterOff(self.model)

    def save_reference(self, path: str) -> str | None:
        """With LoRA the base is saved whether or not a KL term reads it: a resume rebuilds the policy
        from it and the checkpoint's adapter."""
        if self.lora:
            self.save_model(lora.AdapterOff(self.model), Path(path), tokenizer=False)
            return path
        return super().save_reference(path)

    def load_reference(self, path: str) -> None:
        if not self.lora:
            return super().load_reference(path)
        from actors import modeling
        lora.load_base_state(self.model, modeling.load_model(path).state_dict())
        if self.wants_reference:
            self.reference = lora.AdapterOff(self.model)

    def _new_optimizer(self, lr: float) -> torch.optim.Optimizer:
        return adamw(self.trained_parameters(), lr=lr, weight_decay=self.algo.weight_decay)

    # ---- checkpoints -----------------------------------------------------------------------------
    def save(self, path: str, optimizer: bool = True) -> str:
        out = super().save(path, optimizer)
        if self.lora and optimizer and self.ranks.is_main:
            lora.save_adapter(self.model, Path(out))
        if self.ranks.is_main:
            for objective in self.objectives.values():
                objective.save(Path(out))
        if optimizer and getattr(self, "_reference_moves", False):
            self.save_model(self.reference, Path(out) / REFERENCE_DIR, tokenizer=False)
        return out

    def restore(self, path: str) -> int:
        if self.lora:  # the base comes back with load_reference (the run's saved base)
            lora.load_adapter(self.model, Path(path))
        version = super().restore(path)
        if (Path(path) / REFERENCE_DIR / "config.json").is_file():
            self.load_reference(str(Path(path) / REFERENCE_DIR))
            self._reference_moves = True
        return version

    def extra_state(self) -> dict:
        state = {"skipped_steps": self.skipped_steps}
        for objective in self.objectives.values():
            state.update(objective.state_dict())
        return state

    def load_extra_state(self, state: dict) -> None:
        self.skipped_steps = state.get("skipped_steps", 0)
        for objective in self.objectives.values():
            objective.load_state_dict(state)

    def reset_optimizer(self) -> None:
        """A fresh AdamW for RL after warm-up (its own learning rate, no carried-over moments)."""
        self.optimizer = self._new_optimizer(self.lr)
        if self.wants_reference:  # the reference is the policy RL starts from
            self.reference = self.frozen_copy()

    def snapshot_reference(self, path: str | None = None) -> int:
        """Freeze the current weights as the reference of an iteration's preference loss (and save
        them to `path`, the iteration's snapshot)."""
        self.reference = self.frozen_copy()
        self._reference_moves = True  # saved with every checkpoint, not once per run
        if path:
            self.save_model(self.model, Path(path))
        return self.version

    # ---- the objectives' steps -------------------------------------------------------------------
    def train_step(self, *tables: pa.Table, dump_path: str | None = None) -> dict[str, float]:
        """RL: `algorithm.mini_batches` optimizer steps on the concatenated batches (one row per sampled
        response, with the credit step's per-token `advantages`). Returns metrics, with `version` the
        learner's version after the update."""
        return self.objective("policy_gradient", "train_step").train_step(*tables, dump_path=dump_path)

    @ray.method(num_returns=2)
    def train_step_published(self, *tables: pa.Table, dump_path: str | None = None) -> tuple[dict | None, dict]:
        """`train_step`, then the new weights as `publish` makes them, so an object-store channel sends
        them on without a second call to the learner (a round trip a step)."""
        metrics = self.train_step(*tables, dump_path=dump_path)
        return self.publish(), metrics

    def train_preference(self, pairs: pa.Table, loss: str = "dpo", params: dict | None = None,
                         nll_weight: float = 0.0, examples: pa.Table | None = None) -> dict:
        """One optimizer step on preference pairs (prompt, chosen, rejected) with a loss from the
        registry (dpo, ipo, simpo), or `raft`: supervised fine-tuning on the chosen responses.
        `nll_weight` adds that times the chosen responses' NLL to a preference loss (RPO).
        `examples`: labelled samples the learner's riders (a self_judge objective) train on in the same step."""
        return self.objective("preference", "train_preference").step(pairs, loss, params, nll_weight, examples)

    def sft_steps(self, batches: list[pa.Table], lr: float) -> float:
        """Several warm-up steps in one call (fewer round trips); returns the last loss. The warm-up
        runs alone, so it takes every core even where async training shares them with generators."""
        from actors.runtime import torch_threads

        with torch_threads(self.alone_threads):
            return [self.sft_step(b, lr) for b in batches][-1]["warmup/loss"]

    def sft_step(self, prompts: pa.Table, lr: float) -> dict[str, float]:
        """Token-mean cross-entropy on the reference answers (+ EOS) given the prompts."""
        sft = self.objective("sft", "sft_step")
        return sft.step(prompts, self.warmup_optimizer(lr))

    def answer_accuracy(self, prompts: pa.Table) -> float:
        """The fraction of prompts whose reference answer + EOS greedy decoding would produce exactly
        (teacher-forced): a cheap lower bound on greedy accuracy the SFT warm-up watches."""
        return self.objective("sft", "answer_accuracy").answer_accuracy(prompts)

    def warmup_optimizer(self, lr: float) -> torch.optim.Optimizer:
        """The warm-ups' own AdamW (SFT, LaSeR's alignment), kept across their calls at one learning rate.
        With LoRA a warm-up trains the base (the adapters, still zero, join in RL)."""
        if self.lora and self._sft_lr is None:
            lora.train_base(self.model)
        if self._sft_lr != lr:
            self._sft_optimizer = adamw(self.trained_parameters(), lr=lr)
            self._sft_lr = lr
        return self._sft_optimizer

    def warmup_teacher(self) -> torch.nn.Module:
        """A frozen copy of the policy as it was when a warm-up first asked for it (the SFT objective's
        `distill` rows: judge.warmup_task=distill), held until the warm-up ends."""
        if self._teacher is None:
            if self.ranks.sharded:
                raise RuntimeError("a distilled warm-up holds a whole frozen copy of the policy; it does not run "
                                   "under learner.strategy=fsdp2")
            self._teacher = copy.deepcopy(self.model).eval().requires_grad_(False)
        return self._teacher

    def end_warmup(self) -> None:
        self._sft_optimizer = self._sft_lr = self._teacher = None
        if self.lora:
            lora.train_adapters(self.model)
        self.reset_optimizer()


LearnerActor = ray.remote(Learner)
