"""The Arrow batch contract: every batch that crosses an actor boundary follows this module.

One row per sampled response. Token and log-prob columns are Arrow lists; the conversions to and
from padded torch tensors work on the lists' offsets and flat values, never row by row.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

if TYPE_CHECKING:  # torch is imported where tensors are made, so the verifier process stays light
    import torch

SCHEMA_VERSION = "2"
VERSION_KEY = b"coevo.schema_version"

REWARD_PREFIX = "reward."
CORRECT_AT = 0.5  # a verifier reward of at least this marks a correct response (judges' labels)
REWARD_ERROR_PREFIX = "reward_error."
# SFT rows (prompt, answer) whose answer is a teacher's sample: trained towards the teacher's whole
# next-token distribution, not the sampled token (actors/objectives/sft.py, judge.warmup_task=distill)
DISTILL = "distill"
FINISH_REASONS = ("stop", "length", "error")
# an actor's info key for what a batch adds to statistics the driver holds (orchestrator.held_state)
DELTA_KEY = "state_delta"  # {"batch": str | None, "state": the actor's delta}

# Columns every rollout batch has, with their types. Later stages add the optional ones.
CORE_FIELDS: dict[str, pa.DataType] = {
    "uid": pa.string(),
    "group_id": pa.string(),  # one sampling of one prompt: the advantage group
    "prompt_id": pa.string(),
    "prompt": pa.string(),
    "response": pa.string(),
    "prompt_ids": pa.list_(pa.int32()),
    "response_ids": pa.list_(pa.int32()),
    "behavior_logprobs": pa.list_(pa.float32()),
    "policy_version": pa.int64(),
    "finish_reason": pa.dictionary(pa.int8(), pa.string()),
}
OPTIONAL_FIELDS: dict[str, pa.DataType] = {
    "reward": pa.float32(),
    "reward_model_version": pa.int64(),  # the reward model's version where one scored the row
    "judge_version": pa.int64(),  # the policy version that judged the row (self-rewarding)
    "laser_logprob": pa.float32(),  # LaSeR: log pi(z | prompt, response), read by the generator
    "labelled": pa.bool_(),  # whether the verifier labels this prompt (verifier.fraction)
    "probe": pa.bool_(),  # a labelled prompt no judge or reward model trains on (verifier.probe_share)
    "token_rewards": pa.list_(pa.float32()),
    "ref_logprobs": pa.list_(pa.float32()),
    # written by the credit step (orchestrator/credit.py), read by the learners
    "advantages": pa.list_(pa.float32()),  # what the policy loss weighs each response token by
    "old_values": pa.list_(pa.float32()),  # a critic's value of the state before each response token
    "returns": pa.list_(pa.float32()),  # GAE's returns, the critic's targets
    "reward_mask": pa.bool_(),  # False: the row does not train (Parrot's dominated samples)
    "laser_c": pa.float64(),  # LaSeR: the offset c of the self-reward beta * (log pi(z | x, y) - c)
    # multi-turn episodes (actors/envs/rollout.py): response_ids hold every turn and observation
    "loss_mask": pa.list_(pa.bool_()),  # True on the tokens the policy sampled: the only ones that train
    "transcript": pa.string(),  # the episode's text after the prompt (`response` is its last turn)
    "turns": pa.int32(),
    "tool_calls": pa.int32(),
    "tool_errors": pa.int32(),
    "episode_end": pa.string(),  # done / max_turns / token_budget / env_error
    "env_error": pa.string(),
    "turn_rewards": pa.list_(pa.float32()),  # the environment's reward of each turn (null: none given)
}
# List columns that hold one value per response token.
PER_RESPONSE_TOKEN = ("behavior_logprobs", "token_rewards", "ref_logprobs", "advantages", "old_values", "returns",
                      "loss_mask")


class BatchError(ValueError):
    """A batch breaks the contract; the message names the column (and row) at fault."""


def with_version(table: pa.Table) -> pa.Table:
    meta = dict(table.schema.metadata or {})
    meta[VERSION_KEY] = SCHEMA_VERSION.encode()
    return table.replace_schema_metadata(meta)


def list_column(values: np.ndarray, lengths: np.ndarray, value_type: pa.DataType) -> pa.ListArray:
    """Build a list column from flat values and per-row lengths (no per-row Python)."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, value_type))


def rollout_table(
    *,
    uid: Iterable[str],
    prompt_id: Iterable[str],
    group_id: Iterable[str] | None = None,
    prompt: Iterable[str],
    response: Iterable[str],
    prompt_ids: pa.Array,
    response_ids: pa.Array,
    behavior_logprobs: pa.Array,
    policy_version: int,
    finish_reason: Iterable[str],
    extra: dict[str, pa.Array] | None = None,
) -> pa.Table:
    """Assemble a validated rollout table; `extra` holds pass-through dataset columns."""
    uid, prompt_id = list(uid), list(prompt_id)
    cols = {
        "uid": pa.array(uid, pa.string()),
        "group_id": pa.array(list(group_id) if group_id is not None else prompt_id, pa.string()),
        "prompt_id": pa.array(prompt_id, pa.string()),
        "prompt": pa.array(list(prompt), pa.string()),
        "response": pa.array(list(response), pa.string()),
        "prompt_ids": prompt_ids,
        "response_ids": response_ids,
        "behavior_logprobs": behavior_logprobs,
        "policy_version": pa.array(np.full(len(uid), policy_version, dtype=np.int64)),
        "finish_reason": pa.array(list(finish_reason), pa.string()).dictionary_encode().cast(
            CORE_FIELDS["finish_reason"]),
    }
    for name, arr in (extra or {}).items():
        if name in cols:
            raise BatchError(f"dataset column {name!r} clashes with a core rollout column")
        cols[name] = arr
    table = with_version(pa.table(cols))
    validate(table)
    return table


def validate(table: pa.Table | pa.RecordBatch, required: Iterable[str] = CORE_FIELDS) -> None:
    """Check columns, types, nulls and per-token lengths; raise BatchError naming the fault."""
    schema = table.schema
    version = (schema.metadata or {}).get(VERSION_KEY)
    if version is not None and version.decode() != SCHEMA_VERSION:
        raise BatchError(f"batch schema version {version.decode()!r} != supported {SCHEMA_VERSION!r}")
    for name in required:
        if name not in schema.names:
            raise BatchError(f"batch is missing column {name!r}; it has {schema.names}")
    for name in schema.names:
        want = CORE_FIELDS.get(name) or OPTIONAL_FIELDS.get(name)
        if name.startswith(REWARD_PREFIX):
            want = pa.float32()
        elif name.startswith(REWARD_ERROR_PREFIX):
            want = pa.string()
        got = schema.field(name).type
        if want is not None and got != want:
            raise BatchError(f"column {name!r} has type {got}, expected {want}")
        if name in CORE_FIELDS and table.column(name).null_count:
            row = _first_true(table.column(name).is_null())
            raise BatchError(f"column {name!r} is null at row {row}")
    if "response_ids" in schema.names:
        n_tokens = _lengths(table.column("response_ids"))
        for name in PER_RESPONSE_TOKEN:
            if name in schema.names:
                other = _lengths(table.column(name))
                bad = np.nonzero(other != n_tokens)[0]
                if len(bad):
                    r = int(bad[0])
                    raise BatchError(f"column {name!r} row {r} has {other[r]} values but "
                                     f"response_ids has {n_tokens[r]} tokens")
    if "finish_reason" in schema.names:
        values = set(table.column("finish_reason").unique().to_pylist()) - {None}
        unknown = values - set(FINISH_REASONS)
        if unknown:
            raise BatchError(f"column 'finish_reason' has {sorted(unknown)}; allowed {FINISH_REASONS}")


def _first_true(mask: pa.ChunkedArray) -> int:
    return int(np.nonzero(mask.to_numpy(zero_copy_only=False))[0][0])


def _combined(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks()
    return column


def _lengths(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    arr = _combined(column)
    return arr.value_lengths().fill_null(0).to_numpy().astype(np.int64)


def to_padded(
    column: pa.ChunkedArray | pa.Array,
    pad_value: float = 0,
    dtype: torch.dtype | None = None,
    left: bool = False,
    width: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """List column -> (padded [rows, width] tensor, lengths). Works on offsets/values directly."""
    import torch

    arr = _combined(column)
    lengths = _lengths(arr)
    values = arr.flatten().to_numpy(zero_copy_only=False)  # respects slicing of the list array
    width = int(lengths.max(initial=0)) if width is None else width
    if lengths.max(initial=0) > width:
        raise BatchError(f"a row has {lengths.max()} values, more than width {width}")
    out = np.full((len(lengths), width), pad_value, dtype=values.dtype if len(values) else np.float32)
    cols = np.arange(width)
    mask = (cols >= (width - lengths)[:, None]) if left else (cols < lengths[:, None])
    out[mask] = values
    tensor = torch.from_numpy(out)
    return (tensor.to(dtype) if dtype is not None else tensor), torch.from_numpy(lengths)


def response_mask(table: pa.Table) -> torch.Tensor:
    """[rows, longest response] bool: True at each row's response tokens (the learner's `r_mask`)."""
    import torch

    lengths = torch.from_numpy(_lengths(table.column("response_ids")))
    return torch.arange(int(lengths.max()) if len(lengths) else 0)[None, :] < lengths[:, None]


def loss_mask(table: pa.Table) -> torch.Tensor:
    """[rows, longest response] bool: the response tokens that train, `response_mask` and, in
    multi-turn episodes, the `loss_mask` column (False on the tokens an environment added)."""
    mask = response_mask(table)
    if "loss_mask" in table.schema.names:
        own, _ = to_padded(table.column("loss_mask"), False, width=mask.shape[1])
        mask = mask & own.bool()
    return mask


def from_padded(tensor: torch.Tensor, lengths: torch.Tensor | np.ndarray, value_type: pa.DataType,
                left: bool = False) -> pa.ListArray:
    """Padded [rows, width] tensor + lengths -> list column (inverse of `to_padded`)."""
    data = tensor.detach().cpu().numpy()
    lengths = np.asarray(lengths, dtype=np.int64)
    cols = np.arange(data.shape[1] if data.ndim == 2 else 0)
    mask = (cols >= (data.shape[1] - lengths)[:, None]) if left else (cols < lengths[:, None])
    return list_column(data[mask], lengths, value_type)


def concat(tables: list[pa.Table]) -> pa.Table:
    """Concatenate batches from several actors; dictionary columns are unified."""
    table = pa.concat_tables(tables, promote_options="default")
    return with_version(table.unify_dictionaries())


def replace_column(table: pa.Table, name: str, column: pa.Array) -> pa.Table:
    """Set column `name` (appended, or replacing an existing one)."""
    if name in table.schema.names:
        table = table.drop_columns([name])
    return table.append_column(name, column)


def decode_texts(table: pa.Table, name: str) -> tuple[list[str | None], list[str | None]]:
    """Texts of a string column, and per row why it cannot be read (None if it can). Rows that are
    not valid UTF-8 (Arrow can hold such bytes) are reported instead of raising."""
    raw = table.column(name).cast(pa.binary()).to_pylist()
    texts, problems = [], []
    for i, value in enumerate(raw):
        if value is None:
            texts.append(None)
            problems.append(f"{name} is null")
            continue
        try:
            texts.append(value.decode("utf-8"))
            problems.append(None)
        except UnicodeDecodeError as e:
            texts.append(None)
            problems.append(f"{name} is not valid UTF-8 (byte {value[e.start]:#04x} at offset {e.start})")
    return texts, problems


def group_index(table: pa.Table) -> np.ndarray:
    """Dense group number per row (0..G-1, in order of first appearance) from `group_id`."""
    column = table.column("group_id" if "group_id" in table.schema.names else "prompt_id")
    return pc.dictionary_encode(column).combine_chunks().indices.to_numpy().astype(np.int64)


def uniform_groups(table: pa.Table) -> np.ndarray:
    """Per row: its group's number if every sample of the group got the same value from every reward
    source (nulls equal only nulls), else -1. Such a group has no group-relative signal."""
    groups = group_index(table)
    out = np.full(len(groups), -1, dtype=np.int64)
    if not len(groups):
        return out
    same = np.ones(int(groups.max()) + 1, dtype=bool)
    for name in reward_sources(table):
        col = table.column(REWARD_PREFIX + name).to_numpy(zero_copy_only=False).astype(np.float64)
        value = np.where(np.isnan(col), np.inf, col)  # null -> +inf: a value of its own
        hi = np.full(len(same), -np.inf)
        lo = np.full(len(same), np.inf)
        np.maximum.at(hi, groups, value)
        np.minimum.at(lo, groups, value)
        same &= hi == lo
    uniform = same[groups]
    out[uniform] = groups[uniform]
    return out


def reward_sources(table: pa.Table) -> list[str]:
    return [n[len(REWARD_PREFIX):] for n in table.schema.names if n.startswith(REWARD_PREFIX)]


def reward_error_counts(table: pa.Table) -> dict[str, int]:
    """Samples each reward source failed on: `errors/<source>` -> count of non-null messages."""
    return {f"errors/{name[len(REWARD_ERROR_PREFIX):]}": int(table.num_rows - table.column(name).null_count)
            for name in table.schema.names if name.startswith(REWARD_ERROR_PREFIX)}


def dump_parquet(table: pa.Table, path: str | Path) -> Path:
    """Write a step's batch so a user can open it with pandas (`pd.read_parquet`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


# ---- preference pairs --------------------------------------------------------------------------
PAIR_FIELDS: dict[str, pa.DataType] = {"prompt": pa.string(), "chosen": pa.string(), "rejected": pa.string()}


def pair_table(prompt: Iterable[str], chosen: Iterable[str], rejected: Iterable[str],
               extra: dict[str, pa.Array] | None = None) -> pa.Table:
    """Preference pairs travel as Arrow tables too: prompt, chosen, rejected (+ any extra columns)."""
    cols = {"prompt": pa.array(list(prompt), pa.string()), "chosen": pa.array(list(chosen), pa.string()),
            "rejected": pa.array(list(rejected), pa.string()), **(extra or {})}
    table = with_version(pa.table(cols))
    validate_pairs(table)
    return table


def validate_pairs(table: pa.Table, where: str = "pair table") -> None:
    for name, want in PAIR_FIELDS.items():
        if name not in table.schema.names:
            raise BatchError(f"{where} is missing column {name!r}; it has {table.schema.names}")
        if not pa.types.is_string(table.schema.field(name).type) and not pa.types.is_large_string(
                table.schema.field(name).type):
            raise BatchError(f"{where}: column {name!r} has type {table.schema.field(name).type}, expected {want}")
        if table.column(name).null_count:
            raise BatchError(f"{where}: column {name!r} is null at row {_first_true(table.column(name).is_null())}")
