"""Prompt datasets: built-in arithmetic, user JSONL/Parquet files with clear errors, the sampler."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.config import DataConfig
from orchestrator.data import (DatasetError, PromptSampler, arithmetic, load_prompts, read_rows,
                               user_dataset)


# ---- arithmetic ------------------------------------------------------------------------------
@pytest.mark.parametrize("digits, operators", [(1, ["+"]), (2, ["+", "-", "*"])])
def test_arithmetic_splits_disjoint_and_correct(digits, operators):
    ps = arithmetic(digits, operators, eval_size=20, seed=0)
    n_numbers = 10 if digits == 1 else 90
    assert ps.train.num_rows + ps.eval.num_rows == len(operators) * n_numbers ** 2
    assert ps.eval.num_rows == 20
    train_ids = set(ps.train.column("prompt_id").to_pylist())
    eval_ids = set(ps.eval.column("prompt_id").to_pylist())
    assert not train_ids & eval_ids
    assert len(train_ids) == ps.train.num_rows  # no duplicates either
    for split in (ps.train, ps.eval):
        for prompt, answer in zip(split.column("prompt").to_pylist(), split.column("answer").to_pylist()):
            assert prompt.endswith("=")
            expr = prompt[:-1]
            assert int(answer) == eval(expr), prompt  # noqa: S307 (digits and one operator)
            a, b = (int(x) for x in expr.replace("*", "+").replace("-", "+").split("+", 1))
            assert len(str(a)) == digits and len(str(b)) == digits


def test_arithmetic_seeded():
    a = arithmetic(2, ["+"], eval_size=50, seed=1)
    b = arithmetic(2, ["+"], eval_size=50, seed=1)
    c = arithmetic(2, ["+"], eval_size=50, seed=2)
    assert a.eval.equals(b.eval)
    assert a.eval.column("prompt").to_pylist() != c.eval.column("prompt").to_pylist()


def test_arithmetic_eval_size_too_large():
    with pytest.raises(DatasetError, match="eval_size=100"):
        arithmetic(1, ["+"], eval_size=100, seed=0)


def test_arithmetic_sample_draws_distinct_problems_of_the_right_size():
    ps = arithmetic(4, ["*"], eval_size=50, seed=0, sample=500)
    prompts = ps.train.column("prompt").to_pylist() + ps.eval.column("prompt").to_pylist()
    assert len(prompts) == len(set(prompts)) == 500
    assert all(len(x) == 4 for p in prompts for x in p.rstrip("=").split("*"))
    with pytest.raises(DatasetError, match="set data.arithmetic.sample"):
        arithmetic(4, ["*"], eval_size=50, seed=0)


def test_operator_digits_give_operators_their_own_operand_sizes():
    """A warm-up that shows the tool protocol on neighbouring problems: 4-digit sums, and products
    with one 4-digit operand and not two (the recipe's task)."""
    pairs = [[4, 1], [4, 2], [4, 3], [1, 4], [2, 4], [3, 4]]
    ps = arithmetic(4, ["+", "*"], eval_size=20, seed=0, sample=1200, operator_digits={"*": pairs})
    sizes = {}
    for split in (ps.train, ps.eval):
        for prompt, answer in zip(split.column("prompt").to_pylist(), split.column("answer").to_pylist()):
            op = "*" if "*" in prompt else "+"
            a, b = prompt.rstrip("=").split(op)
            assert int(answer) == (int(a) * int(b) if op == "*" else int(a) + int(b))
            sizes.setdefault(op, set()).add((len(a), len(b)))
    assert sizes["+"] == {(4, 4)} and sizes["*"] == {tuple(p) for p in pairs}
    assert ps.train.num_rows + ps.eval.num_rows == 1200
    ranged = arithmetic(4, ["*"], eval_size=20, seed=0, sample=900, operator_digits={"*": [1, 3]})
    got = {tuple(len(x) for x in p.rstrip("=").split("*")) for p in ranged.train.column("prompt").to_pylist()}
    assert got == {(a, b) for a in (1, 2, 3) for b in (1, 2, 3)}
    with pytest.raises(DatasetError, match=r"operator_digits names \['-'\]"):
        arithmetic(4, ["*"], eval_size=20, seed=0, sample=100, operator_digits={"-": 3})


@pytest.mark.parametrize("value, message", [({"*": 7}, "1 to 6 digits"), ({"*": [3, 1]}, "low <= high"),
                                            ({"/": 2}, "operator_digits")])
def test_operator_digits_out_of_range_are_refused(value, message):
    with pytest.raises(ValueError, match=message):
        DataConfig(arithmetic={"digits": 4, "operators": ["*"], "operator_digits": value})


# ---- user files --------------------------------------------------------------------------------
def write_jsonl(path, rows, raw_lines=()):
    lines = [json.dumps(r) for r in rows] + list(raw_lines)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_passes_extra_columns(tmp_path):
    rows = [{"prompt": f"q{i}", "answer": i, "difficulty": f"d{i % 3}"} for i in range(10)]
    path = write_jsonl(tmp_path / "train.jsonl", rows[:5], raw_lines=["", *map(json.dumps, rows[5:])])
    table = read_rows(path)
    assert table.num_rows == 10  # the blank line is skipped
    assert table.schema.names[0] == "prompt_id"
    assert table.column("prompt_id").to_pylist() == [f"train:{i}" for i in range(10)]
    assert table.column("answer").to_pylist() == [str(i) for i in range(10)]  # numbers become text
    assert table.schema.field("answer").type == pa.string()
    assert table.column("difficulty").to_pylist() == [f"d{i % 3}" for i in range(10)]

    ps = user_dataset(str(path), None, eval_size=3, seed=0)
    assert ps.eval.num_rows == 3 and ps.train.num_rows == 7
    assert "difficulty" in ps.train.schema.names
    assert not set(ps.train.column("prompt_id").to_pylist()) & set(ps.eval.column("prompt_id").to_pylist())
    for split in (ps.train, ps.eval):  # rows stay aligned after the shuffle
        for prompt, answer, diff in zip(*(split.column(c).to_pylist() for c in ("prompt", "answer", "difficulty"))):
            i = int(prompt[1:])
            assert answer == str(i) and diff == f"d{i % 3}"


def test_id_column_becomes_prompt_id(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"id": 10 + i, "prompt": "q", "answer": "a"} for i in range(3)])
    assert read_rows(path).column("prompt_id").to_pylist() == ["10", "11", "12"]


def test_load_prompts_with_path_and_template(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"q{i}", "answer": "a", "tag": i} for i in range(6)])
    cfg = DataConfig(path=str(path), eval_size=2, prompt_template="Q: {prompt}\nA:")
    ps = load_prompts(cfg, seed=0)
    assert ps.train.num_rows == 4 and ps.eval.num_rows == 2
    assert all(p.startswith("Q: q") and p.endswith("\nA:") for p in ps.train.column("prompt").to_pylist())
    assert "tag" in ps.eval.schema.names


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DatasetError) as e:
        read_rows(missing)
    assert str(missing) in str(e.value) and "not found" in str(e.value)


def test_unsupported_suffix(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("prompt,answer\n")
    with pytest.raises(DatasetError, match=r"d\.csv.*\.jsonl or \.parquet"):
        read_rows(path)


def test_invalid_json_line_number(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "answer": "1"}] * 2, raw_lines=["{not json"])
    with pytest.raises(DatasetError) as e:
        read_rows(path)
    assert f"{path}:3:" in str(e.value) and "not valid JSON" in str(e.value)


def test_row_without_answer_line_number(tmp_path):
    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}, {"prompt": "c"}]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(DatasetError) as e:
        read_rows(path)
    msg = str(e.value)
    assert f"{path}:3:" in msg and "'answer'" in msg


def test_jsonl_null_prompt_and_non_object(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "a", "answer": "1"}, {"prompt": None, "answer": "2"}])
    with pytest.raises(DatasetError, match=r"a\.jsonl:2:.*'prompt'"):
        read_rows(path)
    path = write_jsonl(tmp_path / "b.jsonl", [{"prompt": "a", "answer": "1"}, [1, 2]])
    with pytest.raises(DatasetError, match=r"b\.jsonl:2:.*JSON object"):
        read_rows(path)


def test_jsonl_null_answer_says_null_not_missing(tmp_path):
    path = write_jsonl(tmp_path / "n.jsonl", [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": None}])
    with pytest.raises(DatasetError) as e:
        read_rows(path)
    msg = str(e.value)
    assert f"{path}:2: 'answer' is null" in msg and "has no" not in msg


def test_jsonl_not_utf8_names_line_and_byte(tmp_path):
    path = tmp_path / "latin1.jsonl"
    good = b'{"prompt": "a", "answer": "1"}\n'
    path.write_bytes(good * 2 + '{"prompt": "caf\u00e9", "answer": "2"}\n'.encode("latin-1"))
    with pytest.raises(DatasetError) as e:
        read_rows(path)
    msg = str(e.value)
    # The bad byte is the 0xe9 of "cafe" on line 3: two good lines plus '{"prompt": "caf' before it.
    assert f"{path}:3: not valid UTF-8 at byte {2 * len(good) + 15} " in msg and "line -1" not in msg


def test_parquet_missing_prompt_column(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"question": ["a", "b"], "answer": ["1", "2"]}), path)
    with pytest.raises(DatasetError) as e:
        read_rows(path)
    msg = str(e.value)
    assert str(path) in msg and "'prompt'" in msg and "question" in msg


def test_parquet_null_prompt_row(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b", None, "d"], "answer": ["1", "2", "3", "4"]}), path)
    with pytest.raises(DatasetError) as e:
        read_rows(path)
    msg = str(e.value)
    assert str(path) in msg and "row 2" in msg and "'prompt'" in msg


def test_parquet_ok_with_numeric_answer(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "answer": [1, 2], "meta": [[1], [2, 3]]}), path)
    t = read_rows(path)
    assert t.column("answer").to_pylist() == ["1", "2"]
    assert t.column("meta").to_pylist() == [[1], [2, 3]]
    assert t.column("prompt_id").to_pylist() == ["d:0", "d:1"]


def test_eval_size_not_smaller_than_rows(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"q{i}", "answer": "a"} for i in range(5)])
    for eval_size in (5, 6):
        with pytest.raises(DatasetError) as e:
            user_dataset(str(path), None, eval_size=eval_size, seed=0)
        assert str(path) in str(e.value) and "5 rows" in str(e.value)
    # a separate eval file lifts the limit
    ev = write_jsonl(tmp_path / "e.jsonl", [{"prompt": "x", "answer": "y"}])
    ps = user_dataset(str(path), str(ev), eval_size=5, seed=0)
    assert ps.train.num_rows == 5 and ps.eval.num_rows == 1


# ---- sampler -----------------------------------------------------------------------------------
def prompt_table(n: int) -> pa.Table:
    return pa.table({"prompt_id": [f"p{i}" for i in range(n)], "prompt": [f"q{i}" for i in range(n)],
                     "answer": [str(i) for i in range(n)]})


def test_sampler_no_repeats_within_epoch():
    table = prompt_table(20)
    s = PromptSampler(table, seed=3)
    seen: list[str] = []
    for _ in range(5):  # 5 * 4 = 20: exactly one epoch
        batch = s.next(4)
        assert batch.num_rows == 4
        seen += batch.column("prompt_id").to_pylist()
    assert sorted(seen) == sorted(table.column("prompt_id").to_pylist())
    assert s.state() == {"epoch": 0, "position": 20}
    nxt = s.next(4).column("prompt_id").to_pylist()  # next epoch, reshuffled
    assert s.state() == {"epoch": 1, "position": 4}
    assert len(set(nxt)) == 4


def test_sampler_partial_epoch_never_repeats():
    s = PromptSampler(prompt_table(10), seed=0)
    for epoch in range(3):
        ids = s.next(3).column("prompt_id").to_pylist() + s.next(3).column("prompt_id").to_pylist() \
            + s.next(3).column("prompt_id").to_pylist()
        assert len(set(ids)) == 9, f"epoch {epoch} repeated a prompt"
        assert s.epoch == epoch


def test_sampler_state_round_trip():
    table = prompt_table(17)
    a = PromptSampler(table, seed=5)
    for _ in range(7):  # crosses an epoch boundary
        a.next(5)
    state = a.state()
    b = PromptSampler(table, seed=5, **state)
    for _ in range(6):
        assert a.next(5).column("prompt_id").to_pylist() == b.next(5).column("prompt_id").to_pylist()
    assert a.state() == b.state()


def test_sampler_too_many_prompts():
    with pytest.raises(DatasetError, match="prompts_per_step"):
        PromptSampler(prompt_table(3), seed=0).next(4)
