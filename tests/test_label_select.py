"""Where the verifier's labels go (`verifier.select`, orchestrator/label_select.py): the groups with
the most distinct responses, or those the judge is least sure of; the expected count is the
fraction's; a piece generated again picks the same groups; bad settings are refused by name."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from actors import batch as B
from orchestrator.config import load_config
from orchestrator.label_select import choose_labelled, group_priority, label_metrics


def piece(responses: list[list[str]], judge: list[list[float]] | None = None, tag: str = "") -> pa.Table:
    rows = [(g, r) for g, group in enumerate(responses) for r in group]
    table = pa.table({"group_id": [f"{tag}g{g}" for g, _ in rows], "prompt_id": [f"p{g}" for g, _ in rows],
                      "response": [r for _, r in rows], "labelled": [True] * len(rows)})
    if judge is not None:
        flat = np.array([s for group in judge for s in group], np.float64)
        table = table.append_column("reward.judge", pa.array(flat, pa.float32(), mask=np.isnan(flat)))
    return table


def labelled_groups(table: pa.Table) -> set[int]:
    groups, labelled = B.group_index(table), table.column("labelled").to_numpy(zero_copy_only=False)
    return {int(g) for g in np.unique(groups[labelled])}


def test_distinct_labels_the_groups_with_the_most_distinct_responses():
    responses = [["1"] * 4, ["1", "2", "3", "4"], ["1", "1", "2", "2"], ["5", "6", "7", "7"]]
    assert group_priority(piece(responses), "distinct").tolist() == [1, 4, 2, 3]
    out, info = choose_labelled(piece(responses), 0.5, "distinct", seed=0)
    assert labelled_groups(out) == {1, 3}  # 4 and 3 distinct answers; the uniform group gets no label
    assert info["labels/groups"] == 2 and info["labels/priority"] == 3.5 and info["labels/priority_all"] == 2.5


def test_judge_unsure_labels_the_groups_whose_scores_sit_nearest_a_half():
    responses = [["a", "b"]] * 4
    judge = [[0.9, 0.1], [0.5, 0.6], [np.nan, np.nan], [0.95, 0.99]]
    priority = group_priority(piece(responses, judge), "judge_unsure", "reward.judge")
    assert priority[2] == 2.0  # not judged at all: the least known, labelled first
    assert priority[1] > priority[0] > priority[3]
    out, _ = choose_labelled(piece(responses, judge), 0.5, "judge_unsure", seed=0, judge_column="reward.judge")
    assert labelled_groups(out) == {1, 2}


def test_judge_unsure_without_the_judges_column_names_it():
    with pytest.raises(B.BatchError, match="reward.judge"):
        group_priority(piece([["a", "b"]]), "judge_unsure", "reward.judge")


def test_the_count_is_the_fraction_of_the_groups_in_expectation_and_a_piece_picks_the_same_groups_again():
    counts = []
    for i in range(400):
        table = piece([["x", "y"]] * 10, tag=f"{i}-")  # all tie: the pick is at random
        out, info = choose_labelled(table, 0.25, "distinct", seed=3)
        assert len(labelled_groups(out)) == info["labels/groups"] in (2, 3)  # 2.5 rounded at random
        again, _ = choose_labelled(table, 0.25, "distinct", seed=3)
        assert labelled_groups(again) == labelled_groups(out)
        counts.append(info["labels/groups"])
    assert abs(np.mean(counts) - 2.5) < 0.1
    picks = {frozenset(labelled_groups(choose_labelled(piece([["x", "y"]] * 10), 0.3, "distinct", seed=s)[0]))
             for s in range(10)}
    assert len(picks) > 1  # ties go at random, by seed


def test_label_metrics_sum_the_pieces_and_weigh_their_priorities():
    infos = [{"labels/groups": 1.0, "labels/priority": 4.0, "labels/priority_all": 2.0},
             {"labels/groups": 3.0, "labels/priority": 2.0, "labels/priority_all": 1.0}, {"generate_s": 1.0}]
    assert label_metrics(infos) == {"labels/groups": 4.0, "labels/priority": 2.5, "labels/priority_all": 1.5}
    assert label_metrics([{"generate_s": 1.0}]) == {}


@pytest.mark.parametrize("recipe, overrides, message", [
    ("self_rewarding", ["verifier.fraction=0.25", "verifier.select=distinct"], "recipe 'self_rewarding'"),
    ("grpo_addition", ["verifier.fraction=1.0", "verifier.select=distinct"], "verifier.fraction=1"),
    ("grpo_addition", ["verifier.fraction=0.25", "verifier.select=judge_unsure"], "judge: true"),
    ("grpo_addition", ["verifier.fraction=0.25", "verifier.select=unsure"], "verifier.select"),
    ("grpo_addition", ["verifier.fraction=0.25", "verifier.select=distinct", "verifier.labelled_share=0.5"],
     "verifier.labelled_share=0.5"),
    ("grpo_addition", ["verifier.labelled_share=0.5"], "verifier.fraction=1"),
    ("grpo_addition", ["verifier.fraction=0.25", "verifier.labelled_share=0"], "labelled_share"),
])
def test_a_label_choice_that_cannot_work_is_refused_by_name(recipe, overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config(recipe, overrides)


def test_a_labelled_share_draws_that_share_of_each_step_from_the_labelled_prompts():
    """verifier.labelled_share: half of each step from the labelled subset, half from the rest, each
    in epochs of its own; 1: the labelled prompts alone (GRPO on them), in the order a plain sampler
    over them gives; the order goes on after a resume from its state."""
    from orchestrator.data import PromptSampler, load_prompts, make_sampler

    cfg = load_config("grpo_sorting", ["verifier.fraction=0.1"])
    train = load_prompts(cfg.data, cfg.seed, 0.1).train
    mask = train.column("labelled").to_numpy(zero_copy_only=False)
    half = make_sampler(train, 0, 0.5)
    seen = []
    for _ in range(60):  # 60 x 16 labelled draws: more than the ~800 labelled prompts, so a second epoch
        step = half.next(32)
        assert sum(step.column("labelled").to_pylist()) == 16 and len(set(step.column("prompt").to_pylist())) == 32
        seen += [p for p, lab in zip(step.column("prompt").to_pylist(), step.column("labelled").to_pylist()) if lab]
    labelled = set(train.filter(mask).column("prompt").to_pylist())
    assert set(seen) <= labelled and len(set(seen)) > len(labelled) - 16  # an epoch's short tail waits
    alone = make_sampler(train, 0, 1.0)
    plain = PromptSampler(train.filter(mask), 0)
    for _ in range(3):
        assert alone.next(32).column("prompt").to_pylist() == plain.next(32).column("prompt").to_pylist()
    resumed = make_sampler(train, 0, 0.5, half.state())
    assert resumed.next(32).column("prompt").to_pylist() == half.next(32).column("prompt").to_pylist()


def test_a_labelled_share_that_cannot_be_drawn_is_refused_by_name():
    from orchestrator.data import DatasetError, load_prompts, make_sampler

    cfg = load_config("grpo_sorting", ["verifier.fraction=0.1"])
    tiny = load_prompts(cfg.data, cfg.seed, 0.1).train.slice(0, 100)  # about 10 labelled prompts
    with pytest.raises(DatasetError, match=r"draws 24 labelled prompts a step of 32, but the training split has \d+"):
        make_sampler(tiny, 0, 0.75).next(32)
    with pytest.raises(DatasetError, match="resume with the setting it was written with"):
        make_sampler(tiny, 0, 0.5, {"epoch": 0, "position": 3})
    with pytest.raises(DatasetError, match="needs the prompts the verifier labels"):
        make_sampler(load_prompts(cfg.data, cfg.seed).train, 0, 0.5)


def test_a_self_rewarding_iteration_larger_than_the_labelled_pool_draws_it_in_step_sized_parts():
    """An iteration of 426 prompts at labelled_share 0.5 wants 213 labelled ones from a pool of ~60:
    drawn in one piece that was a DatasetError; in draws of rollout.prompts_per_step each keeps the
    share and the labelled pool recurs, as it does over steps."""
    from orchestrator.data import DatasetError, load_prompts, make_sampler
    from pipelines.self_rewarding import draw_prompts

    cfg = load_config("grpo_sorting", ["verifier.fraction=0.1"])
    train = load_prompts(cfg.data, cfg.seed, 0.1).train.slice(0, 600)
    pool = sum(train.column("labelled").to_pylist())
    assert 30 < pool < 100
    with pytest.raises(DatasetError, match="labelled prompts a step of 426"):
        make_sampler(train, 0, 0.5).next(426)
    drawn = draw_prompts(make_sampler(train, 0, 0.5), 426, 64)
    labelled = drawn.column("labelled").to_pylist()
    assert drawn.num_rows == 426 and sum(labelled) == 6 * 32 + 21
    assert all(sum(labelled[i:i + 64]) == 32 for i in range(0, 384, 64))  # each draw keeps the share
    prompts = [p for p, lab in zip(drawn.column("prompt").to_pylist(), labelled) if lab]
    assert len(set(prompts)) >= pool - 32 and len(prompts) > len(set(prompts))  # the pool recurs


def test_spark_may_label_where_its_judge_is_unsure():
    cfg = load_config("spark", ["verifier.fraction=0.25", "verifier.select=judge_unsure"])
    assert cfg.verifier.select == "judge_unsure"


@pytest.mark.slow
@pytest.mark.parametrize("recipe, select", [("grpo", "distinct"), ("spark", "judge_unsure")])
def test_a_run_labels_half_its_groups_where_a_label_is_worth_most(ray_env, warm_cache, tmp_path, recipe, select):
    import pandas as pd

    from coevo_cli import coevo, read_metrics, small

    judge = ["recipe=spark", "rewards=[{name: correct, fn: integer_match}, {name: judge, judge: true, weight: 0}]",
             "aggregate.fill={correct: judge}", "judge.warmup_steps=0"] if recipe == "spark" \
        else ["rewards=[{name: correct, fn: integer_match}]"]
    run_dir = tmp_path / "run"
    coevo(small(warm_cache, *judge, "verifier.fraction=0.5", f"verifier.select={select}", "rollout.temperature=2.0",
                "train.max_steps=2", "train.eval_every=2", "train.dump_rollouts=true", "--output-dir", str(run_dir)),
          ray_env, tmp_path, timeout=300)
    rows = read_metrics(run_dir)
    assert [r["labels/groups"] for r in rows] == [4.0, 4.0]  # half of 8 groups, each step
    for step in (1, 2):
        dump = pd.read_parquet(run_dir / "rollouts" / f"step_{step}.parquet")
        by_group = dump.groupby("group_id")
        labelled = by_group["labelled"].first()
        assert by_group["labelled"].nunique().eq(1).all() and labelled.sum() == 4
        assert dump.loc[dump["labelled"], "reward.correct"].notna().all()
        assert dump.loc[~dump["labelled"], "reward.correct"].isna().all()
        if select == "distinct":
            worth = by_group["response"].nunique()
        else:  # closeness of the judge's scores to a half
            worth = 1 - 2 * by_group["reward.judge"].apply(lambda s: (s - 0.5).abs().mean())
        assert worth[labelled].min() >= worth[~labelled].max()
