"""One line per shipped recipe (pipelines/NAME.yaml), for `coevo run --help`. A test keeps this
list and the YAML files in step."""

from __future__ import annotations

RECIPE_LINES = {
    "grpo_addition": "(default) PSR, GRPO's positive half, on 2-digit addition after a cached SFT warm-up",
    "reward_model": "a Bradley-Terry reward model from the warm policy's verifier-labelled samples",
    "cooper": "policy and reward model trained together (Cooper)",
    "prime": "dense implicit process rewards (PRIME)",
    "ppo": "PPO with a critic and GAE",
    "dph": "DPH-RL: GRPO plus a JS / forward-KL rehearsal of the initial policy's samples",
    "spark": "SPARK: the policy also trains as its own judge on its verified rollouts, and is rewarded by it",
    "spc": "SPC: a sneaky generator and a critic play an adversarial game; the critic rewards the policy",
    "self_rewarding": "iterative DPO on the policy's own judgments (Self-Rewarding LM)",
    "self_judged_grpo": "GRPO rewarded by the policy's own online judgment (SSR-Zero-style)",
    "laser": "LaSeR: a last-token self-reward aligned with the verifier where it labels",
    "majority_vote": "label-free: agreement with the group's majority answer",
    "co_reward": "label-free: agreement with an analogous question's majority answer (Co-Reward)",
    "mixed_rewards": "verifier + reward model + format reward with G-RA gates",
    "process_hacking": "a naive per-step process reward and its Clipping / Delta shaping",
    "code_tasks": "one-line Python functions rewarded by running their unit tests",
    "subtraction_jsonl": "a user JSONL dataset and a user reward function (pipelines/examples/)",
    "tool_calculator": "agentic RL: 4-digit multiplication over several turns with a calculator tool",
}


def recipes_help() -> str:
    width = max(map(len, RECIPE_LINES))
    return "recipes (coevo run NAME loads pipelines/NAME.yaml):\n" + "\n".join(
        f"  {name:{width}}  {line}" for name, line in RECIPE_LINES.items())
