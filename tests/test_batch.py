"""The Arrow batch contract (orchestrator/batch.py): builders, validation errors, padding."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

from actors import batch as B


def make_table(**overrides) -> pa.Table:
    kwargs = dict(
        uid=["u0", "u1", "u2"],
        prompt_id=["p0", "p0", "p1"],
        prompt=["1+1=", "1+1=", "2+2="],
        response=["2", "3", "4"],
        prompt_ids=pa.array([[1, 2, 3], [1, 2, 3], [4, 5]], pa.list_(pa.int32())),
        response_ids=pa.array([[7], [8, 9], [10, 11, 12]], pa.list_(pa.int32())),
        behavior_logprobs=pa.array([[-0.1], [-0.2, -0.3], [-0.4, -0.5, -0.6]], pa.list_(pa.float32())),
        policy_version=3,
        finish_reason=["stop", "length", "stop"],
        extra={"answer": pa.array(["2", "2", "4"])},
    )
    kwargs.update(overrides)
    return B.rollout_table(**kwargs)


def replace_column(table: pa.Table, name: str, arr) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, arr)


# ---- builder -----------------------------------------------------------------------------------
def test_rollout_table_schema_and_version():
    t = make_table()
    assert t.num_rows == 3
    assert t.schema.metadata[B.VERSION_KEY] == B.SCHEMA_VERSION.encode()
    for name, typ in B.CORE_FIELDS.items():
        assert t.schema.field(name).type == typ, name
    assert t.column("policy_version").to_pylist() == [3, 3, 3]
    assert t.column("finish_reason").cast(pa.string()).to_pylist() == ["stop", "length", "stop"]
    assert t.column("answer").to_pylist() == ["2", "2", "4"]  # pass-through column
    B.validate(t)


def test_rollout_table_rejects_extra_clashing_with_core_column():
    with pytest.raises(B.BatchError, match="'prompt'"):
        make_table(extra={"prompt": pa.array(["a", "b", "c"])})


def test_rollout_table_rejects_unknown_finish_reason():
    with pytest.raises(B.BatchError, match="finish_reason"):
        make_table(finish_reason=["stop", "weird", "stop"])


# ---- validate ------------------------------------------------------------------------------------
def test_validate_missing_column():
    t = make_table().drop_columns(["behavior_logprobs"])
    with pytest.raises(B.BatchError, match="missing column 'behavior_logprobs'"):
        B.validate(t)


def test_validate_required_optional_column():
    t = make_table()
    with pytest.raises(B.BatchError, match="missing column 'reward'"):
        B.validate(t, required=[*B.CORE_FIELDS, "reward"])


def test_validate_wrong_type():
    t = replace_column(make_table(), "policy_version", pa.array([1, 2, 3], pa.int32()))
    with pytest.raises(B.BatchError, match="column 'policy_version' has type int32"):
        B.validate(t)


def test_validate_wrong_type_reward_source():
    t = make_table().append_column("reward.x", pa.array([1.0, 0.0, 1.0], pa.float64()))
    with pytest.raises(B.BatchError, match="'reward.x'"):
        B.validate(t)


def test_validate_null_in_core_column_names_row():
    t = replace_column(make_table(), "response", pa.array(["a", "b", None], pa.string()))
    with pytest.raises(B.BatchError, match=r"column 'response' is null at row 2"):
        B.validate(t)


def test_validate_per_token_length_mismatch_names_column_and_row():
    bad = pa.array([[-0.1], [-0.2, -0.3], [-0.4, -0.5]], pa.list_(pa.float32()))
    t = replace_column(make_table(), "behavior_logprobs", bad)
    with pytest.raises(B.BatchError) as e:
        B.validate(t)
    msg = str(e.value)
    assert "'behavior_logprobs'" in msg and "row 2" in msg


def test_validate_schema_version_mismatch():
    t = make_table()
    t = t.replace_schema_metadata({B.VERSION_KEY: b"999"})
    with pytest.raises(B.BatchError, match="999"):
        B.validate(t)


# ---- to_padded / from_padded -----------------------------------------------------------------
LISTS = [[1, 2, 3], [4], [], [5, 6]]


def test_to_padded_right():
    arr = pa.array(LISTS, pa.list_(pa.int32()))
    x, lengths = B.to_padded(arr, pad_value=-1)
    expected = torch.tensor([[1, 2, 3], [4, -1, -1], [-1, -1, -1], [5, 6, -1]], dtype=torch.int32)
    assert torch.equal(x, expected)
    assert lengths.tolist() == [3, 1, 0, 2]


def test_to_padded_left_and_dtype():
    arr = pa.array(LISTS, pa.list_(pa.int32()))
    x, lengths = B.to_padded(arr, pad_value=0, dtype=torch.long, left=True)
    expected = torch.tensor([[1, 2, 3], [0, 0, 4], [0, 0, 0], [0, 5, 6]], dtype=torch.long)
    assert x.dtype == torch.long
    assert torch.equal(x, expected)
    assert lengths.tolist() == [3, 1, 0, 2]


def test_to_padded_explicit_width_and_too_narrow():
    arr = pa.array([[1.5], [2.5, 3.5]], pa.list_(pa.float32()))
    x, _ = B.to_padded(arr, 0.0, width=4)
    assert torch.equal(x, torch.tensor([[1.5, 0, 0, 0], [2.5, 3.5, 0, 0]], dtype=torch.float32))
    with pytest.raises(B.BatchError, match="width 1"):
        B.to_padded(arr, 0.0, width=1)


def test_to_padded_sliced_list_array():
    arr = pa.array([[9, 9, 9, 9], *LISTS, [8, 8]], pa.list_(pa.int32())).slice(1, 4)
    assert arr.offset == 1  # really a slice sharing the parent's values
    x, lengths = B.to_padded(arr, pad_value=0)
    assert torch.equal(x, torch.tensor([[1, 2, 3], [4, 0, 0], [0, 0, 0], [5, 6, 0]], dtype=torch.int32))
    assert lengths.tolist() == [3, 1, 0, 2]
    x, _ = B.to_padded(arr.slice(1, 3), pad_value=0, left=True)  # slice of a slice
    assert torch.equal(x, torch.tensor([[0, 4], [0, 0], [5, 6]], dtype=torch.int32))


def test_to_padded_sliced_table_column():
    t = make_table().slice(1, 2)
    x, lengths = B.to_padded(t.column("response_ids"), pad_value=0)
    assert torch.equal(x, torch.tensor([[8, 9, 0], [10, 11, 12]], dtype=torch.int32))
    assert lengths.tolist() == [2, 3]
    lp, _ = B.to_padded(t.column("behavior_logprobs"), 0.0, left=True)
    assert torch.allclose(lp, torch.tensor([[0.0, -0.2, -0.3], [-0.4, -0.5, -0.6]]))


def test_to_padded_chunked_column():
    chunked = pa.chunked_array([pa.array(LISTS[:2], pa.list_(pa.int32())),
                                pa.array(LISTS[2:], pa.list_(pa.int32()))])
    assert chunked.num_chunks == 2
    x, lengths = B.to_padded(chunked, pad_value=0)
    assert torch.equal(x, torch.tensor([[1, 2, 3], [4, 0, 0], [0, 0, 0], [5, 6, 0]], dtype=torch.int32))
    assert lengths.tolist() == [3, 1, 0, 2]
    x, _ = B.to_padded(chunked, pad_value=0, left=True)
    assert torch.equal(x, torch.tensor([[1, 2, 3], [0, 0, 4], [0, 0, 0], [0, 5, 6]], dtype=torch.int32))


def test_to_padded_chunked_of_sliced_chunks():
    base = pa.array([[0], *LISTS, [0]], pa.list_(pa.int32()))
    chunked = pa.chunked_array([base.slice(1, 2), base.slice(3, 2)])
    x, _ = B.to_padded(chunked, pad_value=-1)
    assert torch.equal(x, torch.tensor([[1, 2, 3], [4, -1, -1], [-1, -1, -1], [5, 6, -1]],
                                       dtype=torch.int32))


@pytest.mark.parametrize("left", [False, True])
def test_from_padded_round_trip(left):
    arr = pa.array([[0.5, -1.0], [], [2.0, 3.0, 4.0], [7.0]], pa.list_(pa.float32()))
    x, lengths = B.to_padded(arr, pad_value=99.0, left=left)
    back = B.from_padded(x, lengths, pa.float32(), left=left)
    assert back.type == pa.list_(pa.float32())
    assert back.to_pylist() == arr.to_pylist()
    # and through a sliced column too
    sliced = arr.slice(1, 3)
    x, lengths = B.to_padded(sliced, pad_value=0.0, left=left)
    assert B.from_padded(x, lengths, pa.float32(), left=left).to_pylist() == sliced.to_pylist()


def test_list_column_from_flat_values():
    col = B.list_column(np.array([1, 2, 3, 4], np.int32), np.array([1, 0, 3]), pa.int32())
    assert col.to_pylist() == [[1], [], [2, 3, 4]]


def test_concat_unifies_and_keeps_version():
    a, b = make_table(), make_table(finish_reason=["length", "length", "error"])
    t = B.concat([a, b])
    assert t.num_rows == 6
    assert t.schema.metadata[B.VERSION_KEY] == B.SCHEMA_VERSION.encode()
    assert t.column("finish_reason").cast(pa.string()).to_pylist() == [
        "stop", "length", "stop", "length", "length", "error"]
    B.validate(t)


def test_reward_sources():
    t = make_table().append_column("reward.a", pa.array([1.0, 0.0, 1.0], pa.float32()))
    t = t.append_column("reward_error.a", pa.array([None, None, None], pa.string()))
    t = t.append_column("reward", pa.array([1.0, 0.0, 1.0], pa.float32()))
    assert B.reward_sources(t) == ["a"]


def test_dump_parquet_pandas_round_trip(tmp_path):
    t = make_table()
    path = B.dump_parquet(t, tmp_path / "deep" / "step_1.parquet")
    assert path.is_file()
    df = pd.read_parquet(path)
    assert len(df) == t.num_rows
    assert list(df["uid"]) == ["u0", "u1", "u2"]
    assert list(df["response"]) == ["2", "3", "4"]
    assert [list(x) for x in df["response_ids"]] == [[7], [8, 9], [10, 11, 12]]
    assert np.allclose(df["behavior_logprobs"].iloc[2], [-0.4, -0.5, -0.6])
    assert [str(x) for x in df["finish_reason"]] == ["stop", "length", "stop"]
    assert list(df["answer"]) == ["2", "2", "4"]
    assert list(df["policy_version"]) == [3, 3, 3]
