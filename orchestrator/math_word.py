"""The `math_word` task: multi-step arithmetic word problems made procedurally (seeded), each with
its answer (checked by `math_verify` in `\\boxed{}`) and a worked solution (the SFT warm-up's target).

    Mia has 7 shells. She finds 5 more. Then she gives away 3. How many shells now?
    7 + 5 = 12. 12 - 3 = 9. \\boxed{9}
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

NAMES = [("Mia", "She"), ("Tom", "He"), ("Ava", "She"), ("Leo", "He"), ("Zoe", "She"), ("Sam", "He"),
         ("Ivy", "She"), ("Max", "He"), ("Eva", "She"), ("Ben", "He"), ("Lily", "She"), ("Jack", "He")]
ITEMS = ["apples", "shells", "stickers", "marbles", "books", "coins", "cards", "pencils", "stamps", "eggs"]
# (phrase, operator): the first step's phrase is used as is, later ones after "Then"
GAIN = ["buys {n} more", "finds {n} more", "gets {n} more", "is given {n} more"]
LOSS = ["gives away {n}", "loses {n}", "sells {n}", "uses {n}"]
TIMES = ["doubles them", "triples them"]


def problem(rng: np.random.Generator, steps: int, max_number: int) -> tuple[str, str, str]:
    """(question, answer, worked solution) of one problem with `steps` operations; every running total
    stays between 0 and 10 x max_number."""
    name, pronoun = NAMES[rng.integers(len(NAMES))]
    item = ITEMS[rng.integers(len(ITEMS))]
    total = int(rng.integers(2, max_number + 1))
    sentences, lines = [f"{name} has {total} {item}."], []
    for k in range(steps):
        kind = rng.choice(3, p=[0.45, 0.4, 0.15])
        if kind == 2 and total * 3 > 10 * max_number:
            kind = 0
        if kind == 1 and total < 2:
            kind = 0
        if kind == 0:
            n = int(rng.integers(1, max_number + 1))
            phrase, new, line = GAIN[rng.integers(len(GAIN))].format(n=n), total + n, f"{total} + {n}"
        elif kind == 1:
            n = int(rng.integers(1, total + 1))
            phrase, new, line = LOSS[rng.integers(len(LOSS))].format(n=n), total - n, f"{total} - {n}"
        else:
            factor = int(rng.integers(2, 4))
            phrase, new, line = TIMES[factor - 2], total * factor, f"{total} * {factor}"
        sentences.append(f"{pronoun if k == 0 else 'Then ' + pronoun.lower()} {phrase}.")
        lines.append(f"{line} = {new}.")
        total = new
    question = " ".join(sentences) + f" How many {item} now?"
    solution = " ".join(lines) + f" \\boxed{{{total}}}"
    return question, str(total), solution


def make(train_size: int, eval_size: int, steps: list[int], max_number: int, seed: int) -> tuple[pa.Table, pa.Table]:
    """`train_size` training and `eval_size` held-out problems, all distinct (seeded): columns
    prompt_id, prompt (the question), answer and solution."""
    rng = np.random.default_rng([seed, 4217])
    seen: dict[str, tuple[str, str]] = {}
    want, misses = train_size + eval_size, 0
    while len(seen) < want:
        q, a, s = problem(rng, int(rng.choice(steps)), max_number)
        misses = misses + 1 if q in seen else 0
        if misses > 5000:  # the space of problems is about used up
            raise ValueError(f"data.math_word: only {len(seen)} distinct problems found for {want} wanted; "
                             "raise data.math_word.max_number or add steps")
        seen.setdefault(q, (a, s))
    questions = list(seen)
    table = pa.table({"prompt_id": [f"math_word:{i}" for i in range(want)], "prompt": questions,
                      "answer": [seen[q][0] for q in questions], "solution": [seen[q][1] for q in questions]})
    return table.slice(eval_size), table.slice(0, eval_size)
