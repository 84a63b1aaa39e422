"""The masks `benchmarks/stages/heldout_vs_eval.py --explain` scores held-out answers with."""

from __future__ import annotations

import torch

from benchmarks.stages.heldout_vs_eval import answer_prefix, repeats


def test_answer_prefix_keeps_the_first_tokens_of_every_answer():
    mask = torch.tensor([[0, 1, 1, 1, 0, 0, 1, 1, 1, 1]], dtype=torch.bool)
    got = answer_prefix(mask, 2)
    assert got.tolist() == [[False, True, True, False, False, False, True, True, False, False]]
    assert torch.equal(answer_prefix(mask, 100), mask)
    first = answer_prefix(mask, 2, answers=1)[0].tolist()
    assert first == [False, True, True] + [False] * 7


def test_repeats_marks_a_loop_from_its_second_occurrence_on():
    loop = [7, 8, 9]
    ids = torch.tensor([[1, 2, *loop, *loop, *loop, 5]])
    got = repeats(ids, n=3)[0].tolist()
    # the 3-gram 7 8 9 first ends at index 4; every 3-gram from index 7 on has been seen before
    assert got[:7] == [False] * 7
    assert got[7:11] == [True, True, True, True] and got[11] is False
    assert not repeats(torch.tensor([[1, 2, 3, 4, 5, 6]]), n=2).any()  # no n-gram twice
