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


def sections_of(recipe_cls, common) -> dict[str, type[BaseModel]]:
    """Section name -> model: the recipe's stages first, then its classes from base to most derived,
    so a subclass can replace a section with an extended model. `common`: the sections every run has."""
    from orchestrator.stages import STAGES
    owners = [STAGES.get(name) for name in recipe_cls.stage_names] + list(reversed(recipe_cls.__mro__))
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


@lru_cache(maxsize=None)
def config_model(recipe: str, base: type[BaseModel]) -> type[BaseModel]:
    """The config model of a recipe (by registered name or `module:Class`): `base` (the sections every
    run has, orchestrator.config.Config) plus the recipe's; built once per process."""
    from orchestrator.recipes import RECIPES
    sections = sections_of(RECIPES.get(recipe), base.model_fields)
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
    return config_model(recipe, base)


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
