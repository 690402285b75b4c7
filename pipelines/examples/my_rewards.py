"""An example of user reward code. Your own module in the working directory is named `my_rewards:closeness`;
this shipped copy is `pipelines.examples.my_rewards:closeness` (as `coevo run subtraction_jsonl` names it).

A reward function gets the prompt, the response and the dataset row's other columns as keyword
arguments, and returns a float. If it raises or runs past its time limit, that sample gets a null
`reward.<name>` and a `reward_error.<name>` message, and the run goes on.
"""

import re


def closeness(prompt: str, response: str, answer: str, **row) -> float:
    """1 for the exact answer, partial credit for near misses, 0 for no number at all."""
    found = re.match(r"\s*(-?\d+)", response)
    if found is None:
        return 0.0
    error = abs(int(found.group(1)) - int(answer))
    return 1.0 if error == 0 else max(0.0, 0.5 - error / 20)
