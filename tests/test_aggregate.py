"""Reward aggregation and shaping: every pure function against hand-computed values, and the
config-driven Aggregator end to end on small Arrow tables."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from actors import batch as B
from actors.rewards import shaping as S
from actors.rewards.aggregate import AggregateSpecError, Aggregator, parse_spec

nan = np.nan


def sig(x):
    return 1.0 / (1.0 + math.exp(-x))


# ---- weighted_sum --------------------------------------------------------------------------------
def test_weighted_sum_failed_missing_and_on_error():
    values = {"a": np.array([1.0, nan, nan, 2.0]), "b": np.array([0.5, 0.5, nan, 7.0])}
    failed = {"a": np.array([False, True, False, False])}
    out = S.weighted_sum(values, {"a": 2.0, "b": -1.0}, failed, on_error=-3.0)
    # row 0: 2*1 - 0.5; row 1: a failed -> 2*(-3) - 0.5; row 2: nothing scored -> 0; row 3: 4 - 7
    np.testing.assert_allclose(out, [1.5, -6.5, 0.0, -3.0])
    # a failed flag wins over a value; sources not in weights are ignored
    out = S.weighted_sum({"a": np.array([5.0]), "c": np.array([9.0])}, {"a": 1.0},
                         {"a": np.array([True])}, on_error=0.25)
    np.testing.assert_allclose(out, [0.25])


def test_weighted_sum_unknown_source():
    with pytest.raises(KeyError, match=r"\['x'\].*\['a'\]"):
        S.weighted_sum({"a": np.zeros(2)}, {"x": 1.0})


# ---- normalisation -------------------------------------------------------------------------------
def test_normalize_group_by_hand():
    x = np.array([1.0, 3.0, 5.0, nan, 2.0, 4.0, 7.0])
    g = np.array(["p", "p", "q", "q", "r", "r", "s"])
    out = S.normalize_group(x, g, eps=0.0)
    # p: mean 2, std 1 -> [-1, 1]; q: one valued sample -> 0, NaN stays; r: mean 3 std 1; s: single
    np.testing.assert_allclose(out, [-1, 1, 0, nan, -1, 1, 0])
    out = S.normalize_group(np.array([2.0, 2.0, 0.0, 4.0]), np.array([0, 0, 1, 1]), eps=1.0)
    np.testing.assert_allclose(out, [0, 0, -2 / 3, 2 / 3])   # all-equal group -> 0; (x-2)/(2+1)


def test_running_norm_welford_is_exact():
    rn = S.RunningNorm()
    np.testing.assert_allclose(rn.normalize([3.0]), [3.0 / (1 + 1e-6)])   # identity before update
    a, b = np.array([1.0, 2.0, nan, 6.0]), np.array([4.0, nan])
    rn.update(a)
    rn.update(np.array([nan]))            # nothing to learn
    rn.update(b)
    seen = np.array([1.0, 2.0, 6.0, 4.0])
    assert rn.count == 4
    assert rn.mean == pytest.approx(seen.mean()) == pytest.approx(3.25)
    assert rn.var == pytest.approx(seen.var()) == pytest.approx(3.6875)
    out = rn.normalize(np.array([3.25, nan]))
    assert out[0] == pytest.approx(0.0) and np.isnan(out[1])


def test_running_norm_ema_by_hand():
    rn = S.RunningNorm(momentum=0.5)
    rn.update(np.array([0.0, 2.0]))       # first batch sets: mean 1, var 1
    assert (rn.mean, rn.var) == (1.0, 1.0)
    rn.update(np.array([5.0]))            # mean 1 + .5*4 = 3; var .5*1 + .5*0 + .25*16 = 4.5
    assert rn.mean == pytest.approx(3.0) and rn.var == pytest.approx(4.5)


def test_running_norm_state_round_trip():
    rn = S.RunningNorm()
    rn.update(np.array([1.0, 5.0]))
    other = S.RunningNorm()
    other.load_state_dict(rn.state_dict())
    assert other.state_dict() == rn.state_dict() == {"count": 2, "mean": 3.0, "var": 4.0}
    with pytest.raises(KeyError, match="var"):
        other.load_state_dict({"count": 1, "mean": 0.0})
    with pytest.raises(ValueError, match="momentum"):
        S.RunningNorm(momentum=1.5)


# ---- G-RA ----------------------------------------------------------------------------------------
def test_gate_by_hand():
    lower = np.array([0.3, 0.4, 0.5, nan, 0.7])
    higher = np.array([1.0, 0.9, nan, 1.0, 2.0])
    np.testing.assert_allclose(S.gate(lower, higher, 1.0), [0.3, 0.0, 0.0, nan, 0.7])


# ---- Parrot --------------------------------------------------------------------------------------
def test_pareto_front_by_hand():
    m = np.array([[1, 1],      # dominated by row 1
                  [2, 1],      # front
                  [1, 3],      # front
                  [2, 1],      # a tie with row 1: both kept
                  [0, 0],      # dominated
                  [5, nan]])   # NaN: never on the front, dominates nothing
    np.testing.assert_array_equal(S.pareto_front(m), [0, 1, 1, 1, 0, 0])
    # within groups: row 0 is alone with row 4 in group 'x', so it is on that group's front
    groups = np.array(["x", "y", "y", "y", "x", "y"])
    np.testing.assert_array_equal(S.pareto_front(m, groups), [1, 1, 1, 1, 0, 0])
    assert S.pareto_front(np.zeros((0, 2))).shape == (0,)


def test_pareto_front_matches_brute_force_in_chunks():
    rng = np.random.default_rng(0)
    x = rng.normal(size=60)
    for m in (rng.integers(0, 4, size=(60, 3)).astype(float),       # many ties and duplicates
              np.stack([x, -x], axis=1),                            # every row on the front
              np.stack([x, x + rng.normal(size=60) * 0.1], axis=1)):
        brute = [not any((m[j] >= m[i]).all() and (m[j] > m[i]).any() for j in range(60))
                 for i in range(60)]
        for chunk in (1, 7, 256):
            np.testing.assert_array_equal(S._non_dominated(m, chunk=chunk), brute)


def test_pareto_reward_mask_and_zero():
    reward = np.array([3.0, 1.0, 2.0])
    m = np.array([[1.0, 1.0], [0.0, 0.0], [0.0, 2.0]])
    r, mask = S.pareto_reward(reward, m)
    np.testing.assert_allclose(r, [3, 1, 2])
    np.testing.assert_array_equal(mask, [True, False, True])
    r, mask = S.pareto_reward(reward, m, dominated="zero")
    np.testing.assert_allclose(r, [3, 0, 2])
    np.testing.assert_array_equal(mask, [True, True, True])
    with pytest.raises(ValueError, match="dominated"):
        S.apply_front(reward, mask, "drop")


# ---- Clipping and Delta --------------------------------------------------------------------------
def test_clip_steps_by_hand():
    np.testing.assert_allclose(S.clip_steps([0.9, 0.2, 0.5, 0.7], eta=0.5), [0, -0.3, 0, 0])


def test_delta_steps_by_hand_and_bounded_returns():
    r = np.array([0.7, 0.2, 0.4, 0.8])
    d = S.delta_steps(r)
    np.testing.assert_allclose(d, [0.5, -0.2, -0.4, 0.8])
    np.testing.assert_allclose(np.cumsum(d[::-1])[::-1], r)    # return from step k == r_k
    d = S.delta_steps(r, drop_last=True)
    np.testing.assert_allclose(d, [0.5, -0.2, 0.4, 0.0])
    np.testing.assert_allclose(np.cumsum(d[::-1])[::-1][:-1], r[:-1])
    np.testing.assert_allclose(S.delta_steps([0.3]), [0.3])
    np.testing.assert_allclose(S.delta_steps([0.3], drop_last=True), [0.0])


def test_padded_versions_match_one_trajectory():
    r = np.array([[0.7, 0.2, 0.4, 0.8],
                  [0.6, 9.0, 0.1, 9.0],      # steps in columns 0 and 2 (mask not contiguous)
                  [0.0, 0.0, 0.0, 0.0]])     # no steps
    mask = np.array([[1, 1, 1, 1], [1, 0, 1, 0], [0, 0, 0, 0]], bool)
    np.testing.assert_allclose(S.clip_padded(r, mask, 0.5),
                               [[0, -0.3, -0.1, 0], [0, 0, -0.4, 0], [0, 0, 0, 0]])
    np.testing.assert_allclose(S.delta_padded(r, mask),
                               [[0.5, -0.2, -0.4, 0.8], [0.5, 0, 0.1, 0], [0, 0, 0, 0]])
    np.testing.assert_allclose(S.delta_padded(r, mask, drop_last=True),
                               [[0.5, -0.2, 0.4, 0], [0.6, 0, 0, 0], [0, 0, 0, 0]])
    rng = np.random.default_rng(1)
    x = rng.normal(size=(5, 6))
    lengths = np.array([6, 1, 3, 0, 4])
    m = np.arange(6)[None, :] < lengths[:, None]
    for drop in (False, True):
        got = S.delta_padded(x, m, drop)
        for i, k in enumerate(lengths):
            want = np.zeros(6)
            if k:
                want[:k] = S.delta_steps(x[i, :k], drop)
            np.testing.assert_allclose(got[i], want)


# ---- PAR -----------------------------------------------------------------------------------------
def test_par_by_hand():
    r = np.array([0.0, math.log(3), 1.0, nan])
    np.testing.assert_allclose(S.par(r, 0.0), [0.5, 0.75, sig(1), nan])
    np.testing.assert_allclose(S.par(r, np.array([0.0, 0.0, 1.0, 0.0])), [0.5, 0.75, 0.5, nan])
    refs = np.array([[0.0, math.log(3)], [0.0, 0.0], [1.0, 1.0], [0.0, 0.0]])  # M=2 references
    np.testing.assert_allclose(S.par(r, refs), [(0.5 + 0.25) / 2, 0.75, 0.5, nan])
    assert S.sigmoid(np.array([-1000.0, 1000.0])).tolist() == [0.0, 1.0]     # no overflow


# ---- the Aggregator ------------------------------------------------------------------------------
def make_table(**extra) -> pa.Table:
    """Two prompt groups of three; `correct` failed on row 3 (timeout); `rm` did not score row 2
    (by design: null with no error); a process source `prm` with steps at some tokens."""
    cols = {
        "uid": [f"u{i}" for i in range(6)],
        "prompt_id": ["a", "a", "a", "b", "b", "b"],
        "response_ids": B.list_column(np.arange(12, dtype=np.int32), np.full(6, 2), pa.int32()),
        "answer": ["1", "1", "1", "2", "2", "2"],
        "reward.correct": pa.array([1, 0, 1, None, 0, 1], pa.float32()),
        "reward_error.correct": pa.array([None, None, None, "timeout", None, None], pa.string()),
        "reward.rm": pa.array([0.5, 1.0, None, 2.0, 0.0, -1.0], pa.float32()),
        "reward_error.rm": pa.array([None] * 6, pa.string()),
        "token_rewards.prm": pa.array([[0.9, None], [None, 0.2], None, [0.5, 0.7], [0.1, None],
                                       [None, None]], pa.list_(pa.float32())),
        "reward": pa.array([9.0] * 6, pa.float32()),            # a stale aggregate: replaced
    }
    cols.update(extra)
    return pa.table(cols)


SPEC = {
    "weights": {"correct": 1.0, "rm": 0.5},
    "on_error": 0.0,
    "gate": [{"source": "rm", "when": "correct", "threshold": 1.0}],
    "normalize": {"rm": {"kind": "group", "eps": 0.0}},
    "select": {"pareto": ["correct", "rm"], "scope": "group"},
    "process": {"prm": {"transform": ["clip", "delta"], "eta": 0.5}},
}


def test_aggregator_end_to_end_by_hand():
    table = make_table()
    out, metrics = Aggregator(SPEC).apply(table)
    assert out.num_rows == 6 and out.column("uid").to_pylist() == table.column("uid").to_pylist()
    assert out.schema.field("reward").type == pa.float32() and out.column("reward").null_count == 0
    assert out.column("answer").equals(table.column("answer"))          # pass-through untouched
    B.validate(out, required=())
    # group a: rm gated by correct -> [0.5, 0 (shut), missing]; normalised over [0.5, 0] -> [1, -1]
    # group b: gate shut on row 3 (correct failed) and 4 -> [0, 0, -1]; mean -1/3, std sqrt(2/9)
    s = math.sqrt(2 / 9)
    want = [1 + 0.5, 0 - 0.5, 1.0, 0.5 * (1 / 3) / s, 0.5 * (1 / 3) / s, 1 + 0.5 * (-2 / 3) / s]
    np.testing.assert_allclose(out.column("reward").to_numpy(), want, rtol=1e-6)
    # Parrot within groups: a: row 0 (1, 1) dominates row 1 (0, -1); row 2 has no rm -> off front
    #                       b: (0, .71), (0, .71) tie, (1, -1.41): all on the front
    assert out.column("pareto_front").to_pylist() == [True, False, False, True, True, True]
    assert out.column("reward_mask").to_pylist() == [True, False, False, True, True, True]
    # process: clip(eta=.5) then delta; steps: row0 [.9]@0, row1 [.2]@1, row3 [.5, .7], row4 [.1]@0
    tok = out.column("token_rewards").to_pylist()
    np.testing.assert_allclose(np.concatenate(tok), [0, 0, 0, -0.3, 0, 0, 0, 0, -0.4, 0, 0, 0],
                               atol=1e-7)
    assert [len(t) for t in tok] == [2] * 6
    assert metrics["reward/correct/errors"] == 1 and metrics["reward/rm/errors"] == 0
    assert metrics["reward/correct/null_frac"] == pytest.approx(1 / 6)
    assert metrics["reward/correct/mean"] == pytest.approx(0.6)        # of the 5 usable values
    assert metrics["reward/rm/mean"] == pytest.approx(0.5)
    assert metrics["reward/rm/std"] == pytest.approx(1.0)
    assert metrics["reward/rm/gate_open_frac"] == pytest.approx(0.5)
    assert metrics["reward/pareto/front_frac"] == pytest.approx(4 / 6)
    assert metrics["reward/pareto/masked"] == 2
    assert metrics["reward/mean"] == pytest.approx(np.mean(want), rel=1e-6)
    assert metrics["token_rewards/prm/null_frac"] == pytest.approx(1 / 6)
    assert metrics["token_rewards/prm/steps_mean"] == pytest.approx(1.0)   # (1+1+2+1+0)/5
    assert metrics["token_rewards/return_mean"] == pytest.approx(-0.7 / 6, rel=1e-6)


def test_default_spec_is_the_plain_sum_and_on_error():
    out, metrics = Aggregator().apply(make_table())
    # correct + rm, failed row 3 -> 0 + 2, rm missing on row 2 -> 1
    np.testing.assert_allclose(out.column("reward").to_numpy(), [1.5, 1.0, 1.0, 2.0, 0.0, 0.0])
    assert "token_rewards" not in out.schema.names and "reward_mask" not in out.schema.names
    out, _ = Aggregator({"on_error": -1.0, "weights": {"correct": 2.0}}).apply(make_table())
    np.testing.assert_allclose(out.column("reward").to_numpy(), [2, 0, 2, -2, 0, 2])


def test_group_id_wins_over_prompt_id_and_dominated_zero():
    table = make_table(group_id=["g"] * 6)
    spec = {"weights": {"correct": 1.0}, "select": {"pareto": ["correct", "rm"],
                                                     "scope": "group", "dominated": "zero"}}
    out, metrics = Aggregator(spec).apply(table)
    # one group of six: (1,.5) (0,1) (1,nan) (0 failed->on_error 0, 2) (0,0) (1,-1)
    # front: row 0 and row 3 (0, 2); row 1 (0,1) is dominated by row 3; row 5 by row 0
    assert out.column("pareto_front").to_pylist() == [True, False, False, True, False, False]
    np.testing.assert_allclose(out.column("reward").to_numpy(), [1, 0, 0, 0, 0, 0])
    assert out.column("reward_mask").to_pylist() == [True] * 6
    assert metrics["reward/pareto/masked"] == 0


def test_existing_reward_mask_is_kept():
    table = make_table(reward_mask=pa.array([False, True, True, True, True, None]))
    out, _ = Aggregator({"select": {"pareto": ["correct"]}}).apply(table)
    # batch-wide front on correct alone: rows 0, 2, 5 (value 1)
    assert out.column("reward_mask").to_pylist() == [False, False, True, False, False, True]


def test_par_references():
    table = make_table(ref_reward=pa.array([0.5, 0.0, 0.0, None, 1.0, 1.0], pa.float64()))
    only_rm = {"weights": {"rm": 1.0}}
    out, m = Aggregator({**only_rm, "transform": {"rm": {"par": {"reference": {"constant": 1.0}}}}
                         }).apply(table)
    np.testing.assert_allclose(out.column("reward").to_numpy(),
                               [sig(-0.5), 0.5, 0, sig(1), sig(-1), sig(-2)], rtol=1e-6)
    # a reference column; a missing reference (row 3) counts as failed -> on_error
    out, m = Aggregator({**only_rm, "on_error": -1.0, "transform": {
        "rm": {"par": {"reference": {"column": "ref_reward"}}}}}).apply(table)
    np.testing.assert_allclose(out.column("reward").to_numpy(),
                               [0.5, sig(1), 0, -1, sig(-1), sig(-2)], rtol=1e-6)
    # group mean of rm: a -> .75, b -> 1/3
    out, _ = Aggregator({**only_rm, "transform": {"rm": {"par": {"reference": "group_mean"}}}}
                        ).apply(table)
    np.testing.assert_allclose(out.column("reward").to_numpy(),
                               [sig(-0.25), sig(0.25), 0, sig(5 / 3), sig(-1 / 3), sig(-4 / 3)],
                               rtol=1e-6)
    # running mean of rm over this batch: 0.5
    agg = Aggregator({**only_rm, "transform": {"rm": {"par": {"reference": "running_mean"}}}})
    out, _ = agg.apply(table)
    np.testing.assert_allclose(out.column("reward").to_numpy(),
                               [0.5, sig(0.5), 0, sig(1.5), sig(-0.5), sig(-1.5)], rtol=1e-6)
    assert agg.state_dict()["par"]["rm"] == {"count": 5, "mean": 0.5, "var": 1.0}


def test_running_normalize_state_round_trip_and_eval_mode():
    spec = {"normalize": {"rm": "running"}, "weights": {"rm": 1.0}}
    a = Aggregator(spec)
    a.apply(make_table())
    state = a.state_dict()
    assert state["normalize"]["rm"] == {"count": 5, "mean": 0.5, "var": 1.0}
    b = Aggregator(spec)
    b.load_state_dict(state)
    out_a, _ = a.apply(make_table(), update=False)        # evaluation: statistics unchanged
    out_b, _ = b.apply(make_table(), update=False)
    assert a.state_dict() == state
    assert out_a.column("reward").equals(out_b.column("reward"))
    np.testing.assert_allclose(out_a.column("reward").to_numpy(),
                               [0, 0.5, 0, 1.5, -0.5, -1.5], atol=1e-5)
    out, _ = a.apply(make_table())                        # training: the same values again
    assert a.state_dict()["normalize"]["rm"]["count"] == 10
    with pytest.raises(AggregateSpecError, match=r"\['rm'\]"):
        Aggregator({}).load_state_dict(state)


def test_nonfinite_values_count_as_failed():
    table = make_table(**{"reward.rm": pa.array([float("inf"), 1.0, None, float("nan"), 0, 0],
                                                pa.float32())})
    out, m = Aggregator({"weights": {"rm": 1.0}, "on_error": -5.0}).apply(table)
    np.testing.assert_allclose(out.column("reward").to_numpy(), [-5, 1, 0, -5, 0, 0])
    assert m["reward/rm/nonfinite"] == 2


def test_empty_table():
    out, metrics = Aggregator(SPEC).apply(make_table().slice(0, 0))
    assert out.num_rows == 0 and out.schema.field("reward").type == pa.float32()
    assert "reward/mean" not in metrics


def test_chunked_and_sliced_input():
    table = make_table()
    chunked = pa.concat_tables([table.slice(0, 2), table.slice(2, 4)])
    want, _ = Aggregator(SPEC).apply(table)
    got, _ = Aggregator(SPEC).apply(chunked)
    for name in ("reward", "token_rewards", "reward_mask"):
        assert got.column(name).to_pylist() == want.column(name).to_pylist()
    got, _ = Aggregator({"process": SPEC["process"]}).apply(table.slice(3, 3))
    assert got.column("token_rewards").to_pylist() == want.column("token_rewards").to_pylist()[3:]


# ---- bad specs -----------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, message", [
    ({"weight": {}}, r"aggregate has unknown key\(s\) \['weight'\]; allowed: \['weights'"),
    ({"weights": {"rm": "high"}}, r"aggregate.weights.rm must be a finite number, got 'high'"),
    ({"on_error": True}, r"aggregate.on_error must be a finite number"),
    ({"normalize": {"rm": "zscore"}}, r"aggregate.normalize.rm is 'zscore'; expected one of "
                                      r"\['none', 'group', 'running'\]"),
    ({"normalize": {"rm": {"kind": "group", "momentum": 0.1}}}, r"momentum applies only to kind"),
    ({"normalize": {"rm": {"kind": "running", "momentum": 2}}}, r"momentum must be in \(0, 1\]"),
    ({"gate": [{"source": "format", "threshold": 1}]}, r"aggregate.gate\[0\] is missing \['when'\]"),
    ({"gate": {"source": "a"}}, r"aggregate.gate must be a list"),
    ({"gate": [{"source": "a", "when": "a", "threshold": 1}]}, r"cannot gate itself"),
    ({"transform": {"rm": {"scale": {}}}}, r"aggregate.transform.rm has unknown key\(s\) \['scale'\]"),
    ({"transform": {"rm": {"par": {}}}}, r"aggregate.transform.rm.par.reference is required"),
    ({"transform": {"rm": {"par": {"reference": "median"}}}}, r"reference is 'median'"),
    ({"select": {"pareto": ["a", "a"]}}, r"aggregate.select.pareto must list distinct sources"),
    ({"select": {"pareto": ["a"], "dominated": "drop"}}, r"aggregate.select.dominated is 'drop'"),
    ({"select": {"pareto": ["a"], "scope": "prompt"}}, r"aggregate.select.scope is 'prompt'"),
    ({"process": {"prm": {"transform": "clip"}}}, r"aggregate.process.prm.eta is required"),
    ({"process": {"prm": {"transform": ["delta", "square"]}}}, r"transform has 'square'"),
    ({"process": {"prm": {"transform": "clip", "eta": 0.1, "drop_last": True}}},
     r"drop_last applies only to the delta"),
    (["weights"], r"aggregate must be a mapping"),
])
def test_bad_specs_name_the_key(spec, message):
    with pytest.raises(AggregateSpecError, match=message):
        parse_spec(spec)


def test_unknown_sources_list_the_known_ones():
    with pytest.raises(AggregateSpecError, match=r"\['rmm'\].*\['correct', 'rm'\]"):
        Aggregator({"weights": {"rmm": 1.0}}).apply(make_table())
    with pytest.raises(AggregateSpecError, match=r"\['fmt'\].*\['correct', 'rm'\]"):
        Aggregator({"gate": [{"source": "rm", "when": "fmt", "threshold": 1}]},
                   sources=["correct", "rm"])
    with pytest.raises(AggregateSpecError, match=r"no column 'token_rewards.orm'.*\['prm'\]"):
        Aggregator({"process": {"orm": {}}}).apply(make_table())
    with pytest.raises(AggregateSpecError, match=r"reference column 'ref'"):
        Aggregator({"transform": {"rm": {"par": {"reference": {"column": "ref"}}}}}
                   ).apply(make_table())


def test_batch_problems_are_named():
    with pytest.raises(AggregateSpecError, match="group_id or prompt_id"):
        Aggregator({"normalize": {"rm": "group"}}).apply(make_table().drop_columns(["prompt_id"]))
    bad = make_table(**{"token_rewards.prm": pa.array([[0.1]] * 6, pa.list_(pa.float32()))})
    with pytest.raises(B.BatchError, match=r"'token_rewards.prm' row 0 has 1 values"):
        Aggregator({"process": {"prm": {}}}).apply(bad)


def test_accepts_an_object_with_model_dump():
    class Model:
        def model_dump(self):
            return {"weights": {"correct": 3.0}}
    out, _ = Aggregator(Model()).apply(make_table())
    np.testing.assert_allclose(out.column("reward").to_numpy(), [3, 0, 3, 0, 0, 3])


def test_timeouts_are_counted_apart_from_other_errors():
    skipped = "timed out (skipped: no sample of 'f' finished for 1s while every worker was stuck on its samples)"
    table = pa.table({"prompt_id": ["p0", "p0", "p1", "p1"],
                      "reward.f": pa.array([1.0, None, None, None], pa.float32()),
                      "reward_error.f": pa.array([None, "timed out after 1s", "ValueError: bad", skipped],
                                                 pa.string())})
    _, metrics = Aggregator(None).apply(table)
    assert metrics["reward/f/errors"] == 3 and metrics["reward/f/timeouts"] == 2  # a skip is a timeout
