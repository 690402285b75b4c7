"""Recipes: small modules + YAML configs that compose roles into a training method.

Registered by name in orchestrator.recipes (grpo, reward_model, cooper, prime); a user recipe is
any `module:Class` subclassing `orchestrator.recipes.Recipe`.
"""
