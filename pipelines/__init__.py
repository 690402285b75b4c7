"""Recipes: small modules + YAML configs that wire actors into a training method."""

RECIPES = {"grpo": "pipelines.grpo:GRPO"}
