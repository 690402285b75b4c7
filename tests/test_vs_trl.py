"""benchmarks/vs_trl.py runs named coevo variants against one TRL baseline: every named variant
must be a valid coevo configuration, a bad `--variant` must say what is wrong, and the summary
must give each variant its own ratio to TRL (no TRL or Ray run here)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bench():
    """benchmarks/ is no package: import the script by its folder."""
    folder = str(Path(__file__).resolve().parents[1] / "benchmarks")
    sys.path.insert(0, folder)
    try:
        return importlib.import_module("vs_trl")
    finally:
        sys.path.remove(folder)


def test_every_named_variant_is_a_valid_config_that_changes_what_it_names(bench) -> None:
    from orchestrator.config import load_config

    configs = {name: load_config(None, list(overrides)) for name, overrides in bench.VARIANTS.items()}
    assert configs["seq_mean"].algorithm.aggregation() == "seq_mean_token_mean"
    assert configs["no_std"].algorithm.advantage == "dr_grpo" and configs["no_std"].algorithm.aggregation() == "token_mean"
    assert configs["async_mb2"].train.max_staleness == 1 and configs["async_mb2"].algorithm.mini_batches == 2
    trl = configs["trl_match"].algorithm
    assert (trl.lr, trl.kl_coef, trl.aggregation(), trl.mini_batches, trl.advantage) == (
        bench.LR, 0.0, "token_mean", 1, "grpo")
    assert configs["lr3e-4"].algorithm.lr == 3e-4 and configs["kl0.04"].algorithm.kl_coef == 0.04
    # the default recipe is GRPO's positive half; `grpo` is the like-for-like comparison with TRL
    assert configs["default"].algorithm.advantage == configs["psr"].algorithm.advantage == "psr"
    assert configs["grpo"].algorithm.advantage == "grpo"


def test_parse_variants_named_custom_and_errors(bench) -> None:
    got = bench.parse_variants(["default", "fast=algorithm.lr=3e-4 'algorithm.loss_agg=token_mean'"])
    assert got == {"default": (), "fast": ("algorithm.lr=3e-4", "algorithm.loss_agg=token_mean")}
    assert bench.parse_variants([]) == {"default": ()}
    with pytest.raises(ValueError, match=r"no variant named 'nope'; known: default, grpo, psr, trl_match"):
        bench.parse_variants(["nope"])
    with pytest.raises(ValueError, match=r"override 'algorithm.lr' is not key=value"):
        bench.parse_variants(["x=algorithm.lr"])
    with pytest.raises(ValueError, match=r"the name 'a b' must be letters"):
        bench.parse_variants(["a b=algorithm.lr=1"])
    with pytest.raises(ValueError, match=r"the name 'mb2' is given twice"):
        bench.parse_variants(["mb2", "mb2=algorithm.mini_batches=3"])


def test_summary_gives_each_variant_its_ratio_to_trl(bench) -> None:
    def run(side, seed, wall, steps, variant=None):
        r = {"side": side, "seed": seed, "reached_target": True, "steps": steps, "wall_incl_eval_s": wall,
             "wall_excl_eval_s": wall - 1, "samples_per_s": 100.0}
        return r if variant is None else {**r, "variant": variant}

    results = [run("trl", 0, 10.0, 40), run("coevo", 0, 4.0, 20, "a"), run("coevo", 0, 8.0, 40, "b"),
               run("trl", 1, 30.0, 60), run("coevo", 1, 6.0, 30, "a"), run("coevo", 1, 12.0, 60, "b")]
    stats, md = bench.summarize(results, 0.8)
    ratios = stats["ratio_coevo_over_trl"]
    assert ratios["coevo:a"]["wall_incl_eval_s"] == pytest.approx(5.0 / 20.0)
    assert ratios["coevo:b"]["steps"] == pytest.approx(50 / 50)
    assert "coevo:a / TRL, ratio of medians: GRPO s to target, incl. eval 0.25" in md
    assert "| coevo:b | 2 (2) |" in md
    # TRL at another learning rate is its own baseline: each coevo variant gets a named ratio to it too
    results += [{**run("trl", 0, 20.0, 80), "lr": 3e-4}, {**run("trl", 1, 40.0, 100), "lr": 3e-4}]
    stats, md = bench.summarize(results, 0.8)
    ratios = stats["ratio_coevo_over_trl"]
    assert ratios["coevo:a"]["wall_incl_eval_s"] == pytest.approx(5.0 / 20.0)  # still against TRL at its lr
    assert ratios["coevo:a / trl:lr0.0003"]["wall_incl_eval_s"] == pytest.approx(5.0 / 30.0)
    assert "coevo:a / trl:lr0.0003, ratio of medians: GRPO s to target, incl. eval 0.17" in md
    assert "| trl:lr0.0003 | 2 (2) |" in md
