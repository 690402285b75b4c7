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
    "dapo": "DAPO: clip-higher, token-mean loss, dynamic sampling, overlong penalty (base: grpo_addition)",
    "subtraction_jsonl": "a user JSONL dataset and a user reward function (pipelines/examples/)",
}


# What a first run adds from a cold cache: the warm-up stages, cached for later runs with the same
# settings (docs/recipes.md#what-a-first-run-costs has the measurements). On 2 idle CPU cores the SFT
# warm-up to 0.5-0.6 is about 200 steps and 20-25 s, the self-verification warm-up 1200 steps and
# 2.5 min; a busy machine takes several times that.
SFT = "SFT warm-up to {} (~200 steps, ~25 s)"
FIRST_RUN = {
    "grpo_addition": SFT.format(0.5),
    "reward_model": SFT.format(0.6),
    "cooper": SFT.format(0.6) + " + 10 reward-model steps (~0.15x the SFT's time)",
    "prime": SFT.format(0.6),
    "ppo": SFT.format(0.6),
    "dph": SFT.format(0.6),
    "spark": SFT.format(0.6),
    "spc": SFT.format(0.6),
    "self_rewarding": SFT.format(0.6) + " + 300 judging steps (~3x the SFT's time)",
    "self_judged_grpo": SFT.format(0.6) + " + 300 judging steps (~3x the SFT's time)",
    "laser": SFT.format(0.6) + " + 1200 self-verification steps (~2.5 min)",
    "majority_vote": "SFT warm-up to 0.8 (more steps than to 0.6)",
    "co_reward": "SFT warm-up to 0.8 (more steps than to 0.6)",
    "mixed_rewards": SFT.format(0.6) + " + 10 reward-model steps (~0.15x the SFT's time)",
    "process_hacking": SFT.format(0.6),
    "code_tasks": "SFT warm-up to 0.3 on the code data (at most 600 steps)",
    "subtraction_jsonl": "SFT warm-up to 0.3 on the subtraction data",
    "dapo": SFT.format(0.5) + ", the default's own (one cache entry)",
}


def recipes_help() -> str:
    width = max(map(len, RECIPE_LINES))
    return ("recipes (coevo run NAME loads pipelines/NAME.yaml); a first run also pays for the warm-ups after\n"
            "'first run:' (times on 2 idle CPU cores; cached, later runs skip them):\n" + "\n".join(
                f"  {name:{width}}  {line}\n  {'':{width}}    first run: {FIRST_RUN[name]}"
                for name, line in RECIPE_LINES.items()))
