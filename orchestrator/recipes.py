"""Recipes by name: a recipe declares the roles it needs, the weight channels between them and the
stages a batch goes through; the one loop (orchestrator.loop) runs every recipe.

Built-in recipes live in pipelines/ and are named here by import path, so the orchestrator never
imports them until one is asked for; a user recipe is any `module:Class` subclassing `Recipe`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from actors.registry import Registry

BUILT_IN = {
    "grpo": "pipelines.grpo:GRPO",
    "reward_model": "pipelines.reward_model:RewardModelTraining",
    "cooper": "pipelines.cooper:Cooper",
    "prime": "pipelines.prime:Prime",
    "self_rewarding": "pipelines.self_rewarding:SelfRewarding",
    "laser": "pipelines.laser:Laser",
}


class _Lazy(Registry):
    """Registry whose built-in entries are import paths, imported on first use."""

    def get(self, name: str):
        item = super().get(name)
        if isinstance(item, str):
            from actors.registry import import_path
            item = import_path(item, what=f"recipe {name!r}")
            self._items[name] = item
        return item


RECIPES = _Lazy("recipe")
for _name, _path in BUILT_IN.items():
    RECIPES.register(_name)(_path)


@dataclass
class Sources:
    """Model directories the run's actors start from, resolved before the pools are built."""
    policy: str | None = None  # the warm policy (or a checkpoint's policy on resume)
    reward_models: dict[str, str] = field(default_factory=dict)  # reward source name -> directory
    learners: dict[str, str] = field(default_factory=dict)  # learner role -> checkpoint dir on resume
    references: dict[str, str] = field(default_factory=dict)  # learner role -> its saved frozen reference


class Recipe:
    """Base class. Subclasses override what differs; see pipelines/grpo.py for the simplest."""

    name = "recipe"
    policy = True  # trains the policy (and so needs the SFT warm-up)

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
