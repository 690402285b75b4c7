"""Built-in reward functions, registered by name on the first lookup in `REWARD_FUNCTIONS`.

By theme (each function's docstring has its arguments and a one-line YAML example):

- text.py: exact_match, normalized_match, integer_match, multiple_choice, regex_match,
  format_reward, overlong_penalty (also registered as length_penalty)
- maths.py: math_verify (symbolic equivalence, last \\boxed{} answer)
- structured.py: json_schema, iou
- similarity.py: bmas, embedding_cosine (small sentence encoder, loaded on first use)
- code.py: code_tests (unit tests in sandboxed subprocesses: pass fraction, all-pass or VeRPO)
- label_free.py: majority_vote, co_reward (group functions: agreement among the policy's own samples)
- process.py: step_pattern (a process function: one reward per reasoning step)
- sorting.py: sorted_digits (the sorting task's check: the prompt's digits, in order)
"""

from actors.rewards.code import code_tests  # noqa: F401
from actors.rewards.label_free import co_reward, majority_vote  # noqa: F401
from actors.rewards.process import step_pattern  # noqa: F401
from actors.rewards.maths import last_boxed, math_equivalence  # noqa: F401
from actors.rewards.similarity import bmas, embedding_cosine  # noqa: F401
from actors.rewards.sorting import sorted_digits  # noqa: F401
from actors.rewards.structured import iou, json_schema  # noqa: F401
from actors.rewards.text import (  # noqa: F401
    exact_match,
    format_reward,
    integer_match,
    multiple_choice,
    normalize_text,
    normalized_match,
    overlong_penalty,
    regex_match,
)
