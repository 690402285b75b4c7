"""Reward functions by name (built-ins) or by `module:function` path (user code).

A reward function scores one sample: `fn(prompt: str, response: str, **columns) -> float`, where
`columns` are the dataset's pass-through columns (e.g. `answer`).
"""

from actors.registry import Registry

REWARD_FUNCTIONS = Registry("reward function", plugins=("actors.rewards.builtins",))  # built-ins on first lookup


def group_reward(fn):
    """Mark `fn` as a group reward: it scores all responses to one prompt at once,
    `fn(prompt: str, responses: list[str], **columns) -> list[float]` (one value per response;
    columns are the group's dataset columns). Use it with `@REWARD_FUNCTIONS.register(name)`."""
    fn.reward_scope = "group"
    return fn


def label_free_reward(fn):
    """Mark `fn` as label-free (`fn.label_free`): it reads no reference answer (majority vote reads
    only the group's responses), so where the verifier labels a fraction of the prompts
    (`verifier.fraction`) it still scores every prompt's responses, and can stand in for the
    verifier on the others (`aggregate.fill`). Unmarked functions score the labelled prompts alone."""
    fn.label_free = True
    return fn


def process_reward(fn):
    """Mark `fn` as a process reward: it scores each reasoning step of one response,
    `fn(prompt: str, response: str, steps: list[str], **columns) -> list[float]` (one value per
    step). The verifier splits the response at the source's `step_delimiter` and writes the values
    at each step's last token into `token_rewards.<source>` (see actors/rewards/aggregate.py)."""
    fn.reward_scope = "process"
    return fn
