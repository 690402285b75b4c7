"""Recipes by name: a recipe declares the roles it needs, the weight channels between them, the
stages a batch goes through and its credit step (orchestrator.credit); the one loop
(orchestrator.loop) runs every recipe.

Built-in recipes live in pipelines/ and register themselves there (pipelines/__init__.py), by import
path, so no recipe module is imported until one is asked for; a user recipe is any `module:Class`
subclassing `Recipe`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from actors.registry import LazyRegistry
from orchestrator.roles import RoleSpec
from orchestrator.stages import DEFAULT

# The built-in recipes register themselves in pipelines/__init__.py, imported on the first lookup:
# the control plane imports no recipe, and names none.
RECIPES = LazyRegistry("recipe", plugins=("pipelines",))


def policy_roles(sources: "Sources", generator_args: dict | None = None) -> dict[str, RoleSpec]:
    """The generator, verifier and policy learner of a policy-gradient recipe: GRPO's roles, and
    what a stage borrows where a recipe lacks one of them (`Recipe.stage_roles`). `generator_args`:
    the generator's typed arguments (`Recipe.generator_args`)."""
    return {
        "generator": RoleSpec("actors.generator:Generator", (sources.policy,), dict(generator_args or {}),
                              kind="generator", num_cpus=1),
        "verifier": RoleSpec("actors.verifier:Verifier", kind="verifier", num_cpus=0),
        "policy_learner": RoleSpec("actors.learner:Learner", (sources.learners.get("policy_learner", sources.policy),),
                                   kind="learner", num_cpus=1),
    }


@dataclass
class Sources:
    """Model directories the run's actors start from, resolved before the pools are built."""
    policy: str | None = None  # the warm policy (or a checkpoint's policy on resume)
    reward_models: dict[str, str] = field(default_factory=dict)  # reward source name -> directory
    learners: dict[str, str] = field(default_factory=dict)  # learner role -> checkpoint dir on resume
    references: dict[str, str] = field(default_factory=dict)  # learner role -> its saved frozen reference
    judge: str | None = None  # judge.separate: the judge-warmed model (where a judge learner starts)
    judge_vector: str | None = None  # judge.separate: what the judge adds to the policy (actors/judge_vector.py)


class Recipe:
    """Base class. Subclasses override what differs; see pipelines/grpo.py for the simplest."""

    name = "recipe"
    policy = True  # trains the policy (and so needs the SFT warm-up)
    separate_judge = False  # can judge apart from the policy (judge.separate: a judge pool of its own)
    online_judge = False  # can train that judge apart as it runs (judge.online_items: a judge learner)
    selects_labels = False  # its per-piece scoring spends the labels after generation (verifier.select)
    learns_rewards = False  # trains a reward model from the verifier's labels with no learned reward source
    stage_names: tuple[str, ...] = DEFAULT  # registered stages (orchestrator.stages), in order
    # Config sections this recipe owns: name -> pydantic model (orchestrator.settings). Its stages'
    # sections come with them; a subclass inherits its bases' sections.
    settings: dict = {}

    @classmethod
    def judge_learns(cls, config) -> bool:
        """A judge apart that trains as the run goes (judge.online_items, which needs judge.separate)."""
        judge = getattr(config, "judge", None)
        return bool(cls.online_judge and config.judge_rewards() and judge is not None and judge.online_items)

    @classmethod
    def role_names(cls, config) -> list[str]:
        return list(cls.roles(config, Sources()))

    @classmethod
    def role_kinds(cls, config) -> dict[str, str]:
        """Role name -> its declared kind (orchestrator.roles.KINDS)."""
        return {name: spec.kind for name, spec in cls.roles(config, Sources()).items()}

    @classmethod
    def roles(cls, config, sources: Sources) -> dict:
        raise NotImplementedError

    @classmethod
    def needs_warm_policy(cls, config) -> bool:
        """Whether an actor starts from the warm policy (so the SFT warm-up runs first)."""
        names = cls.role_names(config)
        return "generator" in names or "policy_learner" in names

    @classmethod
    def stages(cls, config) -> list:
        """What runs before the loop, in order (orchestrator.stages); each runs only if it is enabled
        for this config. Default: `stage_names`, i.e. the reward-model, SFT, judging and
        self-verification warm-ups."""
        from orchestrator.stages import STAGES
        return [STAGES.get(name)() for name in cls.stage_names]

    @classmethod
    def stage_roles(cls, config, sources: Sources) -> dict:
        """Roles a stage borrows where the recipe has none of that name (temporary pools)."""
        return policy_roles(sources, cls.generator_args(config))

    @classmethod
    def generator_args(cls, config) -> dict:
        """The typed arguments of this recipe's generators (actors/generator.py: `judging`, `laser`):
        what each of its config sections gives through its own `generator_args(config, args)`
        method (the judge section a JudgingSpec, LaSeR's its token), in the config's section order
        (orchestrator.settings: its stages', then its classes' from the base down), each seeing the
        arguments so far, so a recipe's section may refine a stage's (SPARK's judging format)."""
        args: dict = {}
        for name in type(config).model_fields:
            hook = getattr(getattr(config, name, None), "generator_args", None)
            if hook is not None:
                args.update(hook(config, args))
        return args

    def step_budget(self, config) -> tuple[int, bool]:
        """At most how many loop steps a run takes, and whether it may end before them (the progress
        estimate's basis): train.max_steps, ending early at train.stop_at_accuracy."""
        return config.train.max_steps, config.train.stop_at_accuracy is not None

    @classmethod
    def credit(cls, config, sources: Sources):
        """The credit step between scoring and learning (orchestrator.credit.Credit: aggregation,
        advantages, process weights), which the loop runs on each train batch and checkpoints; None
        where the batches train as they are (pairs, a reward model's rollouts)."""
        return None

    def channels(self, ctx) -> dict:
        return {}

    def make_source(self, ctx, state: dict | None):
        """Where train batches come from: by default, generated and scored rollouts."""
        from orchestrator.rollouts import Rollouts
        return Rollouts(ctx, self, state)

    async def prepare(self, ctx) -> None:
        """Once before the loop (e.g. build held-out sets)."""

    async def score_piece(self, ctx, table):
        """Per-piece scoring as soon as a piece is generated (verifiers). Returns (table_ref, info)."""
        return table, {}

    async def score_batch(self, ctx, tables: list) -> list:
        """Scoring that must see one version across the whole batch (reward models)."""
        return tables

    async def learn(self, ctx, tables: list, dump_path: str | None) -> dict:
        raise NotImplementedError

    async def evaluate(self, ctx) -> dict:
        return {}
