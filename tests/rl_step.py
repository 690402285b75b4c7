"""One RL step as the loop takes it, for the in-process tests: the recipe's credit step on the driver
(orchestrator/credit.py: `reward`, per-token `advantages`), then the policy learner's `train_step`."""

from __future__ import annotations

import pyarrow as pa


def credited(config, *tables: pa.Table) -> tuple[pa.Table, dict]:
    """The batch as the loop hands it to the policy learner, and the credit step's metrics."""
    from orchestrator.recipes import RECIPES, Sources

    return RECIPES.get(config.recipe).credit(config, Sources()).apply(*tables)


def train(learner, *tables: pa.Table, config=None, **kwargs) -> dict:
    """The credit step (with `config`, default the learner's), then `learner.train_step`; their
    metrics as one row, as metrics.jsonl has them."""
    table, metrics = credited(config or learner.config, *tables)
    return {**metrics, **learner.train_step(table, **kwargs)}


def generator(config, model_source: str | None = None):
    """A Generator as the config's recipe declares it: with its typed role arguments (a judge's
    JudgingSpec, LaSeR's token: `Recipe.generator_args`)."""
    from actors.generator import Generator
    from orchestrator.recipes import RECIPES

    return Generator(config, model_source, **RECIPES.get(config.recipe).generator_args(config))
