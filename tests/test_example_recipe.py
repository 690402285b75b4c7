"""The example recipe outside the package (examples/pass_at_k.py): its estimator matches pass@k's
definition, and `coevo run examples/pass_at_k.yaml` trains end to end with its own section."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
import yaml

from examples.pass_at_k import advantage
from orchestrator.config import ConfigError, load_config
from tests.coevo_cli import coevo, read_metrics, small

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = str(ROOT / "examples" / "pass_at_k.yaml")


def brute_force(correct: list[int], k: int) -> list[float]:
    """Each sample's advantage as the definition reads: the mean, over the k-subsets that hold it, of
    (subset solved - group pass@k) / its std, with pass@k over all k-subsets of the group."""
    n = len(correct)
    subsets = list(itertools.combinations(range(n), k))
    solved = {s: float(any(correct[i] for i in s)) for s in subsets}
    mean = sum(solved.values()) / len(subsets)
    std = (mean * (1 - mean)) ** 0.5
    if std == 0:
        return [0.0] * n
    return [sum(solved[s] - mean for s in subsets if i in s) / sum(1 for s in subsets if i in s) / std
            for i in range(n)]


@pytest.mark.parametrize("k", [1, 2, 3])
def test_pass_at_k_advantage_matches_its_definition(k) -> None:
    cfg = load_config(EXAMPLE, [f"pass_at_k.k={k}", "rollout.samples_per_prompt=6"])
    groups_correct = [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 1, 0], [0] * 6, [1] * 6, [0, 0, 0, 0, 0, 1]]
    rewards = torch.tensor([float(c) for g in groups_correct for c in g])
    groups = torch.repeat_interleave(torch.arange(len(groups_correct)), 6)
    got = advantage(rewards, groups, config=cfg)
    want = torch.tensor([a for g in groups_correct for a in brute_force(g, k)], dtype=got.dtype)
    assert torch.allclose(got, want, atol=1e-5)


def test_the_example_checks_its_section_against_the_run() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(EXAMPLE, ["pass_at_k.k=9"])
    assert "pass_at_k.k=9 needs at least k samples per prompt; rollout.samples_per_prompt is 8" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config(EXAMPLE, ["algorithm.advantage=grpo"])
    assert "set algorithm.advantage to 'examples.pass_at_k:advantage'" in str(err.value)


@pytest.mark.slow
def test_the_example_recipe_trains_end_to_end_and_checkpoints_by_time(ray_env, warm_cache, tmp_path) -> None:
    out_dir = tmp_path / "run"
    out = coevo([EXAMPLE, "--output-dir", str(out_dir),
                 *small(warm_cache, "pass_at_k.k=2", "train.max_steps=3", "train.eval_every=3",
                           "rollout.temperature=3.0",
                           # a checkpoint after every step by time alone (none by step count)
                           "train.checkpoint_every=0", "train.checkpoint_every_s=0.001")],
                ray_env, cwd=ROOT, timeout=400)
    saved = yaml.safe_load((out_dir / "config.yaml").read_text())
    assert saved["recipe"] == "examples.pass_at_k:PassAtK" and saved["pass_at_k"]["k"] == 2
    steps = [m for m in read_metrics(out_dir) if "train/loss" in m]
    assert [m["step"] for m in steps] == [1, 2, 3], out[-3000:]
    # groups with k or more wrong samples (hot sampling makes them) got the estimator's advantages
    assert any(m["train/advantage_abs_mean"] > 0 and m["train/grad_norm"] > 0 for m in steps), steps
    kept = sorted(p.name for p in (out_dir / "checkpoints").iterdir())
    assert kept == ["final", "step_2", "step_3"], kept  # one per step by time; keep_checkpoints=2


def test_the_self_judged_sorting_example_is_the_measured_scarce_label_setting():
    """examples/self_judged_sorting.yaml (docs/recipes.md points users to it): self_judged_grpo's
    recipe and judging warm-up, on sorting, the verifier on a tenth of the prompts and the judge
    filling the rest, with the guard at 0.6 (the recipe ships 0.8, set for addition's weak judges),
    gated credit, `grpo_bernoulli` and lr 1e-4 (the rate at which it measured best)."""
    config = load_config(str(ROOT / "examples" / "self_judged_sorting.yaml"))
    shipped = load_config("self_judged_grpo")
    assert config.recipe == shipped.recipe and config.judge.template == shipped.judge.template
    assert config.data.task == "sorting" and config.verifier.fraction == 0.1
    assert [r.name for r in config.rewards] == ["sorted", "judge"] and config.accuracy_source() == "sorted"
    assert config.aggregate["fill"] == {"sorted": "judge"}
    assert config.judge.warmup_steps == 200 and config.judge.warmup_task == "own"
    assert config.judge_credit.min_auroc == 0.6 < shipped.judge_credit.min_auroc
    assert config.judge_credit.confidence == "gated"
    assert config.algorithm.advantage == "grpo_bernoulli" and config.algorithm.lr == 1.0e-4
