"""benchmarks/learner_throughput.py compares coevo's RL step with a bare torch loop; that is only a
fair comparison if both do the same maths. From the same weights, one update gives the same loss and
gradient norm, and the same weights after it, whether the bare loop shares the prompt or not."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "learner_throughput.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("learner_throughput", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.long
def test_bare_loop_does_the_same_update_as_coevo(bench) -> None:
    from actors import modeling
    from actors.learner import Learner
    from actors.trainable import adamw
    from orchestrator.config import validate_config
    from rl_step import train

    args = argparse.Namespace(preset="tiny", prompts=4, samples=4, micro_batch=8, strategy="ddp", mixed_precision=None)
    config = validate_config(bench.config_dict(args, 0, 1))
    learner = Learner(config, None, role={"threads": 1}, objectives=["policy_gradient"])
    table = bench.synthetic_table(learner.model, 0, 4, 4, len(learner.tokenizer), "cpu")
    t = bench.tensors(table, 4)
    metrics = train(learner, table)
    assert metrics["train/grad_norm"] > 0 and metrics["train/rows_computed_frac"] == 1.0
    for share in (True, False):
        model = modeling.build(config.model, 0)[0].train()
        loss, norm = bench.bare_step(model, adamw(model.parameters(), lr=config.algorithm.lr), t, 8, "cpu", share)
        assert loss == pytest.approx(metrics["train/loss"], abs=1e-6)
        assert norm == pytest.approx(metrics["train/grad_norm"], rel=1e-5)
        for a, b in zip(learner.model.parameters(), model.parameters()):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_micro_batch_of_part_groups_is_refused(bench, monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["learner_throughput.py", "--micro-batch", "12", "--samples", "8"])
    with pytest.raises(SystemExit):
        bench.main()
    assert "--micro-batch 12 must be a multiple of --samples 8" in capsys.readouterr().err
