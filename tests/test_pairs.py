"""Preference-pair building (Cooper labelled pairs, Self-Rewarding best/worst pairs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actors.algorithms.pairs import best_worst_pairs, labelled_pairs

# Five groups:
#   0: rows 0-3, correct [T, T, F, F], RM scores [0.9, 0.2, 0.5, 0.7]
#   1: rows 4-5, both correct                        -> skipped_all_correct
#   2: rows 6-7, both wrong                          -> skipped_all_wrong
#   3: rows 8-9, unlabelled                          -> skipped_unlabelled
#   4: rows 10-11, one correct + one unlabelled      -> skipped_all_correct
GROUPS = np.array([0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4])
CORRECT = np.array([1, 1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 0], dtype=bool)
LABELLED = np.array([1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 0], dtype=bool)
CORRECT_NAN = np.array([1, 1, 0, 0, 1, 1, 0, 0, np.nan, np.nan, 1, np.nan])
SCORES = np.array([0.9, 0.2, 0.5, 0.7, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1])
STATS = {"pairs": 1, "groups": 5, "groups_paired": 1, "skipped_all_correct": 2, "skipped_all_wrong": 1,
         "skipped_unlabelled": 1, "unscored": 0}


def test_hardest_pair():
    # Hardest: the lowest-scored correct (row 1, 0.2) against the highest-scored wrong (row 3, 0.7).
    chosen, rejected, stats = labelled_pairs(GROUPS, CORRECT, SCORES, "hardest", labelled=LABELLED)
    assert chosen.tolist() == [1] and rejected.tolist() == [3]
    assert chosen.dtype == np.int64
    assert stats == STATS


def test_nan_labels_equal_mask():
    a = labelled_pairs(GROUPS, CORRECT_NAN, SCORES, "hardest")
    b = labelled_pairs(torch.tensor(GROUPS), torch.tensor(CORRECT_NAN), torch.tensor(SCORES), "hardest")
    for out in (a, b):
        assert out[0].tolist() == [1] and out[1].tolist() == [3] and out[2] == STATS


def test_hardest_several_pairs_ordered_by_hardness():
    # Hardness = score(wrong) - score(correct) for correct rows 0, 1 and wrong rows 2, 3:
    #   (1, 3): 0.7 - 0.2 = 0.5   (1, 2): 0.5 - 0.2 = 0.3   (0, 3): 0.7 - 0.9 = -0.2   (0, 2): 0.5 - 0.9 = -0.4
    chosen, rejected, stats = labelled_pairs(GROUPS, CORRECT, SCORES, "hardest", pairs_per_group=2, labelled=LABELLED)
    assert list(zip(chosen.tolist(), rejected.tolist())) == [(1, 3), (1, 2)]
    chosen, rejected, stats = labelled_pairs(GROUPS, CORRECT, SCORES, "hardest", pairs_per_group=10, labelled=LABELLED)
    assert list(zip(chosen.tolist(), rejected.tolist())) == [(1, 3), (1, 2), (0, 3), (0, 2)]  # all 2 x 2
    assert stats["pairs"] == 4


def test_hardest_ties_go_to_lower_indices_and_nan_scores_are_left_out():
    groups = np.array(["q", "q", "q", "q", "q"])
    correct = np.array([True, True, False, False, False])
    scores = np.array([0.3, 0.3, 0.6, 0.6, np.nan])  # row 4 (wrong) could not be scored
    chosen, rejected, stats = labelled_pairs(groups, correct, scores, "hardest")
    assert chosen.tolist() == [0] and rejected.tolist() == [2]  # all four pairs tie at 0.3: lowest indices
    assert stats["unscored"] == 1 and stats["pairs"] == 1


def test_hardest_needs_scores():
    with pytest.raises(ValueError, match="scores"):
        labelled_pairs(GROUPS, CORRECT, None, "hardest")


def test_bad_labels_refused():
    with pytest.raises(ValueError, match="NaN"):
        labelled_pairs([0, 0], [1.0, 0.5], [0.0, 0.0], "hardest")
    with pytest.raises(ValueError, match="selection"):
        labelled_pairs([0, 0], [True, False], None, "easiest")


def test_random_pairs_seeded_and_valid():
    groups = np.repeat(np.arange(6), 4)          # 6 groups of 4
    correct = np.tile([True, False, True, False], 6)
    a = labelled_pairs(groups, correct, None, "random", pairs_per_group=2, rng=7)
    b = labelled_pairs(groups, correct, None, "random", pairs_per_group=2, rng=np.random.default_rng(7))
    assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()  # same seed, same pairs
    chosen, rejected, stats = a
    assert stats["pairs"] == 12 and stats["groups_paired"] == 6
    assert correct[chosen].all() and not correct[rejected].any()
    assert (groups[chosen] == groups[rejected]).all()
    pairs = list(zip(chosen.tolist(), rejected.tolist()))
    assert len(set(pairs)) == len(pairs)  # distinct within each group
    # the choice does depend on the seed
    draws = {tuple(labelled_pairs(groups, correct, None, "random", rng=s)[1].tolist()) for s in range(10)}
    assert len(draws) > 1
    # more pairs asked than exist (2 x 2 per group): all four, once each
    chosen, rejected, stats = labelled_pairs(groups, correct, None, "random", pairs_per_group=9, rng=0)
    assert stats["pairs"] == 24 and len(set(zip(chosen.tolist(), rejected.tolist()))) == 24


# ---- best / worst ------------------------------------------------------------------------------
# group 0: rows 0-2 [1, 5, 3]        -> best row 1, worst row 0 (gap 4)
# group 1: rows 3-4 [2, 2]           -> tie
# group 2: rows 5-7 [4, 4.5, 4.25]   -> gap 0.5
# group 3: rows 8-9 [nan, 7]         -> one scored: unscored
# group 4: rows 10-13 [9, nan, 1, 9] -> best ties at rows 10 and 13: row 10; worst row 12 (gap 8)
BW_GROUPS = np.array([0, 0, 0, 1, 1, 2, 2, 2, 3, 3, 4, 4, 4, 4])
BW_SCORES = np.array([1, 5, 3, 2, 2, 4, 4.5, 4.25, np.nan, 7, 9, np.nan, 1, 9])


def test_best_worst_margin_respected():
    chosen, rejected, stats = best_worst_pairs(BW_GROUPS, BW_SCORES, margin=1.0)
    assert chosen.tolist() == [1, 10] and rejected.tolist() == [0, 12]
    assert stats == {"pairs": 2, "groups": 5, "skipped_tie": 1, "skipped_margin": 1, "skipped_unscored": 1}


def test_best_worst_margin_boundary_and_zero():
    # a gap equal to the margin (0.5) is kept: group 2 gives (row 6, row 5)
    for margin in (0.5, 0.0):
        chosen, rejected, stats = best_worst_pairs(BW_GROUPS, BW_SCORES, margin=margin)
        assert chosen.tolist() == [1, 6, 10] and rejected.tolist() == [0, 5, 12]
        assert stats["skipped_margin"] == 0 and stats["skipped_tie"] == 1


def test_best_worst_all_tied_or_empty():
    chosen, rejected, stats = best_worst_pairs([0, 0, 0], [3.0, 3.0, 3.0])
    assert chosen.size == 0 and rejected.size == 0 and stats["skipped_tie"] == 1
    chosen, rejected, stats = best_worst_pairs([0, 1], [np.nan, np.nan])
    assert chosen.size == 0 and stats["skipped_unscored"] == 2
    chosen, rejected, stats = best_worst_pairs(np.array([], dtype=np.int64), np.array([]))
    assert chosen.size == 0 and stats == {"pairs": 0, "groups": 0, "skipped_tie": 0, "skipped_margin": 0,
                                          "skipped_unscored": 0}
    chosen, rejected, stats = labelled_pairs([], np.array([], dtype=bool), [], "hardest")
    assert chosen.size == 0 and stats["groups"] == 0 and stats["skipped_unlabelled"] == 0


def test_best_worst_worst_tie_takes_lower_index():
    chosen, rejected, _ = best_worst_pairs(torch.tensor([5, 5, 5]), torch.tensor([3.0, 1.0, 1.0]))
    assert chosen.tolist() == [0] and rejected.tolist() == [1]
