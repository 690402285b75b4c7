"""Learner objectives as modules: the value objective against hand-computed losses, hosting a chosen
set of objectives, a user objective by import path riding along the RL step, and the errors."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch

from actors import batch as B
from actors.algorithms.value import clipped_value_loss
from actors.learner import Learner
from actors.objectives import OBJECTIVES, Objective
from rl_step import train
from test_learner import config, make_config, prompts, reward_fn, scored  # noqa: F401  (fixtures)


def test_clipped_value_loss_matches_hand_computed_values():
    values = torch.tensor([[1.0, 0.0, 2.0, 0.55]], requires_grad=True)
    old = torch.full((1, 4), 0.5)
    returns = torch.tensor([[2.0, -1.0, 0.6, 0.0]])
    loss, stats = clipped_value_loss(values, old, returns, clip_eps=0.2)
    # V clipped to [0.3, 0.7]: (0.7-2)^2=1.69 > 1; (0.3+1)^2=1.69 > 1; 1.96 > (0.7-0.6)^2; equal (0.55 inside)
    assert loss[0].tolist() == pytest.approx([0.845, 0.845, 0.98, 0.15125])
    assert stats["clip_frac"].tolist() == [[1.0, 1.0, 0.0, 0.0]]
    loss.sum().backward()
    # the clipped error wins where V left the trust region: no gradient there; else V - R
    assert values.grad[0].tolist() == pytest.approx([0.0, 0.0, 1.4, 0.55])


def value_batch(returns: list[list[float]]) -> pa.Table:
    return pa.table({"prompt_ids": pa.array([[5, 6, 7], [8, 9]], pa.list_(pa.int32())),
                     "response_ids": pa.array([[10, 11], [12]], pa.list_(pa.int32())),
                     "returns": pa.array(returns, pa.list_(pa.float32())),
                     "old_values": pa.array([[0.0, 0.0], [0.0]], pa.list_(pa.float32()))})


def test_value_objective_starts_at_zero_fits_the_returns_and_keeps_its_head(tmp_path):
    config = make_config(lr=3e-2)
    learner = Learner(config, objectives=[{"name": "value", "clip_eps": 10.0}])
    assert list(learner.objectives) == ["value"]
    table = value_batch([[1.0, 2.0], [0.5]])
    first = learner.call_objective("value", "step", table)
    # a zero-initialised head: V = 0, so the loss is the mean of R^2 / 2 over the 3 response tokens
    assert first["value/loss"] == pytest.approx((0.5 + 2.0 + 0.125) / 3)
    assert first["value/mean"] == 0.0 and first["version"] == 1
    losses = [learner.call_objective("value", "step", table)["value/loss"] for _ in range(40)]
    assert losses[-1] < 0.2 * first["value/loss"], losses
    out = learner.save(str(tmp_path / "critic"), optimizer=True)
    head = learner.objectives["value"].head.state_dict()
    again = Learner(config, model_source=out, objectives=["value"])
    assert all(torch.equal(head[k], v) for k, v in again.objectives["value"].head.state_dict().items())
    assert set(learner.extra_state()) == {"skipped_steps", "value_head"}
    with pytest.raises(B.BatchError, match=r"column 'returns' row 1 has 2 values but response_ids has 1 tokens"):
        learner.call_objective("value", "step", value_batch([[1.0, 2.0], [0.5, 0.5]]))
    with pytest.raises(B.BatchError, match=r"value objective needs batch column\(s\) \['old_values'\]"):
        learner.call_objective("value", "step", table.drop_columns(["old_values"]))


class Rider(Objective):
    """A user objective that rides along the RL step: it asks for every row, adds a loss term that
    pulls a parameter of its own to 1 and counts the micro-batches, and checkpoints that count."""

    name = "rider"

    def __init__(self, learner, weight: float = 1.0):
        super().__init__(learner)
        self.weight, self.calls = weight, 0
        self.p = torch.nn.Parameter(torch.zeros(()))

    def parameters(self):
        return [self.p]

    def prepare(self, table, data):
        return torch.ones(table.num_rows, dtype=torch.bool)

    def term(self, tail, data, mb):
        self.calls += 1
        return self.weight * (self.p - 1.0) ** 2, {"rider_rows": float(len(mb))}

    def metrics(self, sums, updates):
        return {"rider/rows": sums["rider_rows"]}

    def state_dict(self):
        return {"rider_calls": self.calls}


def test_a_user_objective_rides_along_the_rl_step(config, scored):
    learner = Learner(config, objectives=["policy_gradient", {"name": f"{__name__}:Rider", "weight": 2.0}])
    metrics = train(learner, scored)
    rider = learner.objectives["rider"]
    assert metrics["rider/rows"] == scored.num_rows and rider.calls == 1
    assert float(rider.p.detach()) > 0  # its parameter is in the learner's optimizer and moved toward 1
    assert learner.extra_state()["rider_calls"] == 1


def test_objective_errors_name_the_objective():
    config = make_config()
    with pytest.raises(KeyError, match=r"unknown learner objective 'valu'; registered: .*value"):
        Learner(config, objectives=["valu"])
    with pytest.raises(ValueError, match=r"'sft' is listed twice"):
        Learner(config, objectives=["sft", "sft"])
    with pytest.raises(ValueError, match="laser_align objective needs a reward source with `laser: true`"):
        Learner(config, objectives=["laser_align"])
    critic = Learner(config, objectives=[{"name": "value"}])
    with pytest.raises(RuntimeError, match=r"learner method 'size' needs the 'rehearsal' objective, but this "
                                           r"learner hosts \['value'\]"):
        critic.call_objective("rehearsal", "size")
    for method in ("no_such", "_private", "state_dict", "require"):  # only an objective's own public methods
        with pytest.raises(AttributeError, match=rf"the 'value' objective \(Value\) has no method '{method}' "
                                                 r"to call; its own methods: \[.*'step'.*'values_of'"):
            critic.call_objective("value", method)
    with pytest.raises(ValueError, match="clip_eps must be > 0, got 0"):
        Learner(config, objectives=[{"name": "value", "clip_eps": 0}])
    with pytest.raises(ValueError, match=r"learner objective \{'clip_eps': 0.1\} needs a 'name'"):
        Learner(config, objectives=[{"clip_eps": 0.1}])
    learner = Learner(config, objectives=["sft"])
    with pytest.raises(B.BatchError, match=r"sft objective needs batch column\(s\) \['answer'\]"):
        learner.sft_step(pa.table({"prompt": ["1+1="]}), lr=1e-3)
    with pytest.raises(RuntimeError, match=r"'train_step' needs the 'policy_gradient' objective, but this learner "
                                           r"hosts \['sft'\]"):
        learner.train_step(pa.table({}))
    assert list(Learner(config).objectives) == ["policy_gradient", "preference", "sft"]
    assert {"policy_gradient", "preference", "sft", "laser_align", "value"} <= set(OBJECTIVES.names())
