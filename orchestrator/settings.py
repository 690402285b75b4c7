"""Recipe-owned config sections. A recipe declares its settings beside its code:

    class PrimeConfig(Section): beta: float = Field(0.05, gt=0) ...
    class Prime(GRPO): settings = {"prime": PrimeConfig}

and a stage does the same (`Stage.settings`: the judge, LaSeR and reward-model warm-ups own `judge`,
`laser` and `reward_model`). A config is validated against its recipe's model: the sections every
run has (orchestrator.config.Config) plus those of the recipe, its base classes and its stages, so
a user recipe (`recipe: my_module:MyRecipe`) brings its own section the same way, and unknown keys
inside it are named with the accepted ones like any built-in section's.
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import BaseModel, Field, create_model


def sections_of(recipe_cls, common, kinds: frozenset[str] | None = None) -> dict[str, type[BaseModel]]:
    """Section name -> model: the recipe's stages first, then its classes from base to most derived,
    so a subclass can replace a section with an extended model. `common`: the sections every run has.
    `kinds`: the config's reward kinds (reward_kinds), which leave out the sections of the stages that
    serve none of them (`Stage.rewards`); None: every section the recipe can have."""
    from orchestrator.stages import STAGES
    stages = [STAGES.get(name) for name in recipe_cls.stage_names]
    if kinds is not None:
        stages = [stage for stage in stages if serves(stage, kinds)]
    owners = stages + list(reversed(recipe_cls.__mro__))
    found: dict[str, type[BaseModel]] = {}
    for owner in owners:
        for key, model in (vars(owner).get("settings") or {}).items():
            where = f"{owner.__module__}.{owner.__qualname__}"
            if key in common:
                raise ValueError(f"{where}.settings: {key!r} is a section every run has; name the "
                                  f"recipe's section otherwise")
            if not (isinstance(model, type) and issubclass(model, BaseModel)):
                raise ValueError(f"{where}.settings[{key!r}] must be a pydantic model class "
                                  f"(e.g. a subclass of orchestrator.config.Section), got {model!r}")
            found[key] = model
    return found


def serves(stage, kinds: frozenset[str]) -> bool:
    """Whether a stage's sections belong to a config with these reward kinds."""
    wanted = getattr(stage, "rewards", ())
    return not wanted or bool(set(wanted) & kinds)


def reward_kinds(data: dict, base: type[BaseModel]) -> frozenset[str]:
    """The kinds of a raw config's reward sources (RewardSpec.kind: fn, model, judge, laser, env), read
    before validation: which stages can run decides which sections the config has. An entry that is
    no mapping is left to validation, which names it."""
    rewards = data.get("rewards", base.model_fields["rewards"].default)
    spec = base.model_fields["rewards"].annotation.__args__[0]  # RewardSpec
    kinds = set()
    for reward in rewards if isinstance(rewards, list) else ():
        if isinstance(reward, dict):
            try:  # as validation will read it (judge: "false" is no judge)
                reward = spec.model_validate(reward)
            except ValueError:  # validation names what is wrong with it; its kind as written
                reward = spec.model_construct(**reward)
        if hasattr(reward, "kind"):
            kinds.add(reward.kind)
    return frozenset(kinds)


@lru_cache(maxsize=None)
def config_model(recipe: str, base: type[BaseModel], kinds: frozenset[str] | None = None) -> type[BaseModel]:
    """The config model of a recipe (by registered name or `module:Class`): `base` (the sections every
    run has, orchestrator.config.Config) plus the recipe's, those of its stages only for a config with
    `kinds` of reward sources they serve (None: all of them); built once per process."""
    from orchestrator.recipes import RECIPES
    sections = sections_of(RECIPES.get(recipe), base.model_fields, kinds)
    fields = {key: (model, Field(default_factory=model)) for key, model in sections.items()}
    model = create_model("Config", __base__=base, __module__=base.__module__, **fields)
    model.__qualname__ = f"Config[{recipe}]"
    return model


def model_for(data, base: type[BaseModel]) -> type[BaseModel]:
    """The model to validate `data` with. An unknown recipe name falls back to `base`, whose `recipe`
    check lists the registered ones; a user recipe that cannot load raises ImportError/ValueError."""
    recipe = data.get("recipe", base.model_fields["recipe"].default) if isinstance(data, dict) else None
    from orchestrator.recipes import RECIPES
    if not isinstance(recipe, str) or recipe not in RECIPES:
        return base
    return config_model(recipe, base, reward_kinds(data, base))


def unused_sections(data: dict, model: type[BaseModel], base: type[BaseModel]) -> dict[str, tuple]:
    """The sections in `data` that its recipe's stages own but that `model` (the config's, from its
    reward kinds) leaves out: name -> (the stage, its section model). Validation drops one that holds
    only defaults (a config saved before sections depended on the rewards) and refuses one that sets
    anything, since nothing would read it."""
    recipe = data.get("recipe", base.model_fields["recipe"].default)
    from orchestrator.recipes import RECIPES
    from orchestrator.stages import STAGES
    if not isinstance(recipe, str) or recipe not in RECIPES:
        return {}
    found = {}
    for name in RECIPES.get(recipe).stage_names:
        stage = STAGES.get(name)
        for key, section in (vars(stage).get("settings") or {}).items():
            if key in data and key not in model.model_fields:
                found[key] = (stage, section)
    return found


def section_owners(key: str, base: type[BaseModel]) -> list[str]:
    """Registered recipes whose settings (or whose stages' settings) include section `key`."""
    from orchestrator.recipes import RECIPES
    owners = []
    for name in RECIPES.names():
        try:
            if key in sections_of(RECIPES.get(name), base.model_fields):
                owners.append(name)
        except (ImportError, ValueError):
            continue
    return owners
