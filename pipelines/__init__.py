"""Recipes: small modules + YAML configs that compose roles into a training method.

Each built-in recipe is registered here, once, by import path (its module is imported only when a
run asks for it); orchestrator.recipes.RECIPES imports this package on its first lookup. A user
recipe is any `module:Class` subclassing `orchestrator.recipes.Recipe`.
"""

from orchestrator.recipes import RECIPES

BUILT_IN = {
    "grpo": "pipelines.grpo:GRPO",
    "reward_model": "pipelines.reward_model:RewardModelTraining",
    "cooper": "pipelines.cooper:Cooper",
    "prime": "pipelines.prime:Prime",
    "ppo": "pipelines.ppo:PPO",
    "dph": "pipelines.dph:DPH",
    "spark": "pipelines.spark:Spark",
    "spc": "pipelines.spc:SPC",
    "self_rewarding": "pipelines.self_rewarding:SelfRewarding",
    "laser": "pipelines.laser:Laser",
}
RECIPES.register_paths(BUILT_IN)
