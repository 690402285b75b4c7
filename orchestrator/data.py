"""Prompt datasets: built-in tasks with held-out splits, and user files (JSONL or Parquet).

Every prompt table has `prompt_id`, `prompt` and `answer` (string); other columns pass through.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.prompt_set import DatasetError, PromptSet  # noqa: F401  (callers import them from here)

REQUIRED = ("prompt", "answer")


# ---- built-in tasks ---------------------------------------------------------------------------
MAX_LISTED = 2_000_000  # problems an arithmetic task lists in full; past it, data.arithmetic.sample draws some


def arithmetic(digits: int, operators: list[str], eval_size: int, seed: int, analogs: str | None = None,
               sample: int | None = None, operator_digits: dict | None = None) -> PromptSet:
    """All `a op b` with `digits`-digit operands (or `sample` distinct ones drawn at random); a
    seeded, disjoint held-out split. `operator_digits` gives some operators other operand sizes
    (`size_pairs`), e.g. {"*": [1, 3]} beside 4-digit sums; `sample` is then split evenly over the
    operators and an operator's pairs of sizes. With `analogs="commuted"` each problem is paired with its
    commuted twin (`pair_id`, for Co-Reward; the sampler draws twins together)."""
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    if operator_digits:
        unknown = sorted(set(operator_digits) - set(operators))
        if unknown:
            raise DatasetError(f"data.arithmetic.operator_digits names {unknown}, not among the operators {operators}")
        problems = []
        for i, op in enumerate(operators):
            pairs = size_pairs(operator_digits.get(op, digits))
            share = None if sample is None else sample // len(operators) + (i < sample % len(operators))
            for j, (da, db) in enumerate(pairs):
                part = None if share is None else share // len(pairs) + (j < share % len(pairs))
                problems += _problems((da, db), [op], ops, part, seed + 100 * i + j)
    else:
        problems = _problems((digits, digits), operators, ops, sample, seed)
    if eval_size >= len(problems):
        raise DatasetError(f"arithmetic task has {len(problems)} problems; data.eval_size={eval_size} "
                           "leaves none to train on")
    order = np.random.default_rng(seed).permutation(len(problems))
    table = pa.table({"prompt_id": [problems[i][0] for i in order],
                      "prompt": [problems[i][0] for i in order],
                      "answer": [problems[i][1] for i in order]})
    name = f"arithmetic-{digits}d-{''.join(operators)}" + \
        "".join(f"-{op}" + ",".join(f"{a}x{b}" for a, b in size_pairs(d)) for op, d in sorted((operator_digits or {}).items()))
    if analogs is None:
        return PromptSet(train=table.slice(eval_size), eval=table.slice(0, eval_size), name=name)
    if analogs != "commuted":
        raise DatasetError(f"data.analogs {analogs!r}: the arithmetic task knows 'commuted'")
    # The same split as without analogs (the same warm start and held-out set); a problem whose
    # twin was held out is a pair of one in the training split.
    add = lambda t: t.append_column("pair_id", pa.array([commuted_key(p) for p in t.column("prompt").to_pylist()]))  # noqa: E731
    return PromptSet(train=add(table.slice(eval_size)), eval=add(table.slice(0, eval_size)), name=name)


def sorting(length: int, size: int, eval_size: int, seed: int) -> PromptSet:
    """Sort `length` random digits (repeats allowed): prompt `"83127>"`, answer `"12378"`. `size`
    distinct problems (seeded), the first `eval_size` of them held out. A task with a verification
    gap: checking an answer (order, and the same digits) is easier for a small model than producing
    it; the verifier is `sorted_digits` (actors/rewards/sorting.py)."""
    space = 10 ** length
    if size > space // 2:
        raise DatasetError(f"sorting task: data.sorting.size={size} is more than half of the {space} digit "
                           f"strings of length {length}; lower it or raise data.sorting.length")
    if eval_size >= size:
        raise DatasetError(f"sorting task has {size} problems; data.eval_size={eval_size} leaves none to train on")
    rng = np.random.default_rng([seed, 11])
    seen: dict[str, None] = {}
    while len(seen) < size:
        for row in rng.integers(0, 10, size=(size, length)):
            seen.setdefault("".join(map(str, row)), None)
            if len(seen) == size:
                break
    digits = list(seen)
    table = pa.table({"prompt_id": [f"{d}>" for d in digits], "prompt": [f"{d}>" for d in digits],
                      "answer": ["".join(sorted(d)) for d in digits]})
    return PromptSet(train=table.slice(eval_size), eval=table.slice(0, eval_size), name=f"sorting-{length}")


def size_pairs(size) -> list[tuple[int, int]]:
    """The (a's, b's) operand sizes of `operator_digits` value: a number n (n, n); [low, high] (every
    pair of sizes from low to high digits); or a list of [a, b] pairs, e.g. the pairs with one
    4-digit operand and not two: [[4, 1], [4, 2], [4, 3], [1, 4], [2, 4], [3, 4]]."""
    if isinstance(size, int):
        return [(size, size)]
    if all(isinstance(x, int) for x in size):
        low, high = size
        return [(da, db) for da in range(low, high + 1) for db in range(low, high + 1)]
    return [(int(a), int(b)) for a, b in size]


def _problems(digits: tuple[int, int], operators: list[str], ops: dict, sample: int | None,
              seed: int) -> list[tuple[str, str]]:
    """Every `a op b` with operands of `digits` = (a's, b's) digits, or `sample` distinct ones drawn (seeded)."""
    ranges = [range(10 ** (d - 1) if d > 1 else 0, 10 ** d) for d in digits]
    space = len(operators) * len(ranges[0]) * len(ranges[1])
    if sample is not None and sample < space:
        return _drawn(ranges, operators, ops, sample, seed)
    if space > MAX_LISTED:
        raise DatasetError(f"the arithmetic task with {max(digits)} digits has {space:,} problems, too many to "
                           "list: set data.arithmetic.sample to draw some")
    return [(f"{a}{op}{b}=", str(ops[op](a, b))) for op in operators for a, b in itertools.product(*ranges)]


def _drawn(ranges: list[range], operators: list[str], ops: dict, k: int, seed: int) -> list[tuple[str, str]]:
    """`k` distinct problems drawn uniformly (seeded), in a fixed order."""
    rng = np.random.default_rng([seed, 11])
    na, nb = len(ranges[0]), len(ranges[1])
    codes = np.unique(rng.integers(0, len(operators) * na * nb, size=2 * k + 64))
    codes = rng.permutation(codes)[:k]
    while len(codes) < k:  # rare: too few distinct draws
        codes = np.unique(np.concatenate([codes, rng.integers(0, len(operators) * na * nb, size=k)]))[:k]
    out = []
    for c in sorted(codes.tolist()):
        op, rest = divmod(c, na * nb)
        a, b = ranges[0][rest // nb], ranges[1][rest % nb]
        out.append((f"{a}{operators[op]}{b}=", str(ops[operators[op]](a, b))))
    return out


def commuted_key(prompt: str) -> str:
    """`12+34=` and `34+12=` share a key; a non-commutative problem is a pair of one."""
    for op in "+*":
        if op in prompt:
            a, b = prompt.rstrip("=").split(op)
            return f"{min(a, b)}{op}{max(a, b)}"
    return prompt


# ---- user files -------------------------------------------------------------------------------
def read_table(path: str | Path, required: tuple[str, ...] = REQUIRED, text: tuple[str, ...] = ("prompt",),
               what: str = "dataset", conversation: bool = False) -> pa.Table:
    """Read a .jsonl or .parquet file; check the required columns, their nulls, and text columns.
    `conversation`: each JSONL line's prompt is checked (text, or a list of messages) where it is read."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise DatasetError(f"{what} file {str(path)!r} not found")
    if path.suffix == ".parquet":
        table = pq.read_table(path)
    elif path.suffix in (".jsonl", ".json"):
        table = _read_jsonl(path, required, text, conversation)
    else:
        raise DatasetError(f"{what} file {str(path)!r}: use .jsonl or .parquet")
    if table.num_rows == 0:
        raise DatasetError(f"{what} file {str(path)!r} has no rows")
    for col in required:
        if col not in table.schema.names:
            raise DatasetError(f"{what} file {str(path)!r} has no {col!r} column "
                               f"(columns: {table.schema.names})")
        if table.column(col).null_count:
            row = int(np.nonzero(table.column(col).is_null().to_numpy(zero_copy_only=False))[0][0])
            raise DatasetError(f"{what} file {str(path)!r} row {row}: {col!r} is missing or null")
    for col in text:
        if not pa.types.is_string(table.schema.field(col).type):
            raise DatasetError(f"{what} file {str(path)!r}: column {col!r} must be text, "
                               f"got {table.schema.field(col).type}")
    return table


def read_rows(path: str | Path) -> pa.Table:
    """A prompt dataset: `prompt` (text, or a list of {role, content} messages) or `messages`, and
    `answer` (as text); adds `prompt_id` (from `id` if present). A conversation is kept in `messages`;
    its `prompt` is rendered later by the chat template (orchestrator/chat_data.py)."""
    from orchestrator.chat_data import conversation_columns

    path = Path(path).expanduser()
    table = conversation_columns(read_table(path, required=("answer",), text=(), conversation=True), path)
    table = table.set_column(table.schema.get_field_index("answer"), "answer",
                             table.column("answer").cast(pa.string()))
    if "prompt_id" in table.schema.names:
        table = table.drop_columns(["prompt_id"])
    ids = (table.column("id").cast(pa.string()) if "id" in table.schema.names
           else pa.array([f"{path.stem}:{i}" for i in range(table.num_rows)]))
    return table.add_column(0, "prompt_id", ids)


PAIR_COLUMNS = ("prompt", "chosen", "rejected")


def read_pairs(path: str | Path) -> pa.Table:
    """Preference pairs: `prompt`, `chosen`, `rejected` text columns (others pass through)."""
    return read_table(path, required=PAIR_COLUMNS, text=PAIR_COLUMNS, what="pairs")


def _read_jsonl(path: Path, required: tuple[str, ...] = REQUIRED, text: tuple[str, ...] = ("prompt",),
                conversation: bool = False) -> pa.Table:
    rows, offset = [], 0
    # Read bytes and decode line by line, so a decoding error names its line and byte offset.
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DatasetError(f"{path}:{lineno}: not valid UTF-8 at byte {offset + e.start} of the file "
                                   f"({e.reason}); save the file as UTF-8") from None
            offset += len(raw)
            if line.strip():
                rows.append(_jsonl_row(path, lineno, line, required, text, conversation))
    try:
        return pa.Table.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise DatasetError(f"{path}: a column mixes types across rows ({e})") from None


def _jsonl_row(path: Path, lineno: int, line: str, required: tuple[str, ...], text: tuple[str, ...],
               conversation: bool = False) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(row, dict):
        raise DatasetError(f"{path}:{lineno}: each line must be a JSON object, got {type(row).__name__}")
    if conversation:
        from orchestrator.chat_data import check_prompt_field
        check_prompt_field(row, f"{path}:{lineno}")
    for col in required:
        if col not in row:
            raise DatasetError(f"{path}:{lineno}: row has no {col!r} field (keys: {sorted(row)})")
        if row[col] is None:
            raise DatasetError(f"{path}:{lineno}: {col!r} is null; give it a value or drop the row")
    for col in text:
        if not isinstance(row[col], str):
            raise DatasetError(f"{path}:{lineno}: {col!r} must be a string, got {row[col]!r}")
    if "answer" in required:
        if isinstance(row["answer"], (dict, list)):
            raise DatasetError(f"{path}:{lineno}: 'answer' must be a string or number, got {row['answer']!r}")
        row["answer"] = str(row["answer"])
    return row


def user_dataset(path: str, eval_path: str | None, eval_size: int, seed: int) -> PromptSet:
    table = read_rows(path)
    if eval_path:
        return PromptSet(train=table, eval=read_rows(eval_path), name=Path(path).stem)
    if table.num_rows <= eval_size:
        raise DatasetError(f"dataset file {path!r} has {table.num_rows} rows; data.eval_size={eval_size} "
                           "leaves none to train on (lower data.eval_size or set data.eval_path)")
    order = np.random.default_rng(seed).permutation(table.num_rows)
    table = table.take(pa.array(order))
    return PromptSet(train=table.slice(eval_size), eval=table.slice(0, eval_size), name=Path(path).stem)


def with_probes(train: pa.Table, share: float, seed: int) -> pa.Table:
    """`train` with a `probe` column: `share` of its labelled prompts (all of them where it has no
    `labelled` column), fixed per prompt for the run (seeded); a prompt is a probe or trains judges."""
    n = train.num_rows
    pool = (train.column("labelled").to_numpy(zero_copy_only=False).astype(bool)
            if "labelled" in train.schema.names else np.ones(n, bool))
    probe = pool & (np.random.default_rng([seed, 11]).random(n) < share)
    if not probe.any() or probe.sum() == pool.sum():
        raise DatasetError(f"verifier.probe_share={share} holds {int(probe.sum())} of the {int(pool.sum())} labelled "
                           "training prompts out of the judges' training: it needs at least one of each "
                           "(change the share, verifier.fraction or the dataset's size)")
    return train.append_column("probe", pa.array(probe, pa.bool_()))


def load_prompts(data_cfg, seed: int, label_fraction: float = 1.0, model_cfg=None,
                 probe_share: float = 0.0) -> PromptSet:
    """The prompt splits. With `model_cfg` (the run's `model` section) their prompts are rendered by
    the chat template (data.chat_template; orchestrator/chat_data.py), after making the model
    directory where model.bpe asks for one. With `label_fraction` < 1 the training prompts get a `labelled` column:
    which prompts the verifier labels, fixed per prompt for the run (seeded), as when checkable
    answers exist for only part of a dataset. Held-out prompts are always labelled. With `probe_share`
    > 0 they also get a `probe` column: that share of the labelled ones (seeded), which no judge or
    reward model trains on (`verifier.probe_share`)."""
    if data_cfg.path:
        prompts = user_dataset(data_cfg.path, data_cfg.eval_path, data_cfg.eval_size, seed)
    elif data_cfg.task == "sorting":
        if data_cfg.analogs is not None:
            raise DatasetError(f"data.analogs {data_cfg.analogs!r}: the sorting task has no analogous problems")
        s = data_cfg.sorting
        prompts = sorting(s.length, s.size, data_cfg.eval_size, seed)
    elif data_cfg.task == "math_word":
        from orchestrator import math_word
        m = data_cfg.math_word
        train, held_out = math_word.make(m.train_size, data_cfg.eval_size, m.steps, m.max_number, seed)
        prompts = PromptSet(train=train, eval=held_out, name="math_word")
    else:
        a = data_cfg.arithmetic
        prompts = arithmetic(a.digits, a.operators, data_cfg.eval_size, seed, data_cfg.analogs, a.sample,
                             a.operator_digits)
    if label_fraction < 1.0:
        n = prompts.train.num_rows
        labelled = np.random.default_rng([seed, 7]).random(n) < label_fraction
        prompts.train = prompts.train.append_column("labelled", pa.array(labelled, pa.bool_()))
    if probe_share > 0:
        prompts.train = with_probes(prompts.train, probe_share, seed)
    template = data_cfg.prompt_template
    if template != "{prompt}":
        for split in ("train", "eval"):
            t = getattr(prompts, split)
            text = [template.replace("{prompt}", p) for p in t.column("prompt").to_pylist()]
            setattr(prompts, split, t.set_column(t.schema.get_field_index("prompt"), "prompt",
                                                 pa.array(text, pa.string())))
    if model_cfg is not None:
        from orchestrator.chat_data import apply_chat

        prompts = apply_chat(prompts, data_cfg, model_cfg, seed)
    elif "messages" in prompts.train.schema.names:
        raise DatasetError("the dataset's prompts are conversations (messages); they are rendered by the chat "
                           "template of the run's model, which this caller did not give")
    return prompts


class PromptSampler:
    """Epochs over the training prompts without replacement, reshuffled each epoch (seeded), so a
    step never holds the same prompt twice. Its position is part of the loop state for --resume.
    With a `pair_id` column, whole pairs are drawn together (a batch may then hold one fewer)."""

    def __init__(self, table: pa.Table, seed: int, epoch: int = 0, position: int = 0):
        self.table, self.seed, self.epoch, self.position = table, seed, epoch, position
        self.units = self._units(table)
        self._order = self._shuffle()

    @staticmethod
    def _units(table: pa.Table) -> list[np.ndarray]:
        if "pair_id" not in table.schema.names:
            return [np.array([i]) for i in range(table.num_rows)]
        keys = table.column("pair_id").to_pylist()
        rows: dict = {}
        for i, k in enumerate(keys):
            rows.setdefault(k, []).append(i)
        return [np.array(v) for v in rows.values()]

    def _shuffle(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch]).permutation(len(self.units))

    def next(self, k: int) -> pa.Table:
        if k > self.table.num_rows:
            raise DatasetError(f"asked for {k} prompts a step but the training split has "
                               f"{self.table.num_rows}; lower rollout.prompts_per_step")
        rest = sum(len(self.units[u]) for u in self._order[self.position:self.position + k])
        if rest < k and (self.position + k > len(self._order) or rest < k - 1):
            self.epoch, self.position = self.epoch + 1, 0  # the epoch's tail is too short: a new epoch
            self._order = self._shuffle()
        taken, count = [], 0
        while self.position < len(self._order):
            unit = self.units[self._order[self.position]]
            if taken and count + len(unit) > k:
                break
            taken.append(unit)
            count += len(unit)
            self.position += 1
            if count >= k:
                break
        return self.table.take(pa.array(np.concatenate(taken)))

    def state(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}


class StratifiedSampler:
    """`verifier.labelled_share`: each step draws round(share x k) prompts (at least one) from those
    the verifier labels and the rest from the others, each part in epochs of its own (PromptSampler),
    so labelled prompts come at that rate whatever `verifier.fraction` is. Its state is both parts'."""

    def __init__(self, table: pa.Table, seed: int, share: float, labelled: dict | None = None,
                 unlabelled: dict | None = None):
        mask = table.column("labelled").to_numpy(zero_copy_only=False).astype(bool)
        self.share = share
        self.parts = {"labelled": PromptSampler(table.filter(pa.array(mask)), seed, **(labelled or {})),
                      "unlabelled": PromptSampler(table.filter(pa.array(~mask)), seed + 1, **(unlabelled or {}))}

    def next(self, k: int) -> pa.Table:
        n = min(k, max(1, round(self.share * k)))
        for part, want in (("labelled", n), ("unlabelled", k - n)):
            have = self.parts[part].table.num_rows
            if want > have:
                raise DatasetError(f"verifier.labelled_share={self.share} draws {want} {part} prompts a step of {k}, "
                                   f"but the training split has {have} {part} ones (verifier.fraction sets how "
                                   "many): lower rollout.prompts_per_step or change the share or the fraction")
        drawn = [self.parts["labelled"].next(n)] + ([self.parts["unlabelled"].next(k - n)] if k > n else [])
        return pa.concat_tables(drawn)

    def state(self) -> dict:
        return {name: part.state() for name, part in self.parts.items()}


def make_sampler(train: pa.Table, seed: int, labelled_share: float | None = None, state: dict | None = None):
    """The loop's prompt order: epochs over the training prompts, or with `labelled_share` the two
    strata of StratifiedSampler; `state` is a checkpoint's (a resume goes on where it stopped)."""
    state = state or {}
    stratified = labelled_share is not None
    if state and stratified != ("labelled" in state):
        raise DatasetError("the checkpoint's prompt order was written with verifier.labelled_share "
                           f"{'unset' if stratified else 'set'}; resume with the setting it was written with")
    if not stratified:
        return PromptSampler(train, seed, **state)
    if "labelled" not in train.schema.names:
        raise DatasetError(f"verifier.labelled_share={labelled_share} needs the prompts the verifier labels "
                           "(verifier.fraction below 1)")
    return StratifiedSampler(train, seed, labelled_share, **state)
