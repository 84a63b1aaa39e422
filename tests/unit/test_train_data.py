"""Batch plans: every sample once per epoch, token budget kept, deterministic per (seed, epoch)."""

from __future__ import annotations

import random

import torch

from eagle3cli.train.data import collate, plan_epoch


def test_plan_covers_each_sample_once_within_budget_and_is_deterministic():
    rng = random.Random(0)
    lengths = [rng.randint(5, 300) for _ in range(500)]
    plan = plan_epoch(lengths, token_budget=1024, seed=3, epoch=0, max_batch_size=16)
    assert sorted(i for b in plan for i in b) == list(range(500))
    for b in plan:
        assert len(b) <= 16 and (len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 1024)
    assert plan == plan_epoch(lengths, 1024, 3, 0, 16)
    assert plan != plan_epoch(lengths, 1024, 3, 1, 16) and plan != plan_epoch(lengths, 1024, 4, 0, 16)
    # length bucketing: padding stays small compared with random batches
    padded = sum(len(b) * max(lengths[i] for i in b) for b in plan)
    assert padded < 1.25 * sum(lengths)


def test_collate_right_pads_with_zero_and_false():
    a = {
        "input_ids": torch.tensor([5, 6, 7]),
        "loss_mask": torch.tensor([False, True, True]),
        "aux_hidden": torch.ones(3, 4),
    }
    b = {"input_ids": torch.tensor([8]), "loss_mask": torch.tensor([True]), "aux_hidden": torch.ones(1, 4)}
    out = collate([a, b])
    assert out["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert out["loss_mask"].tolist() == [[False, True, True], [True, False, False]]
    assert out["aux_hidden"][1, 1:].abs().sum() == 0 and out["lengths"].tolist() == [3, 1]
    assert collate([a, b], max_length=2)["input_ids"].shape == (2, 2)


def test_no_batch_is_made_while_the_reader_is_paused():
    """`Prefetch.paused()`: a compiled step (and an --online one) runs while the reading thread makes
    nothing; before, a resumed `--online --compile` run died in dynamo's trace (it diverged when the
    reading thread ran the target meanwhile). Room is left in the queue, so only the pause stops it."""
    import threading
    import time

    from eagle3cli.train.data import Prefetch, Ready

    made: list[int] = []
    inside = threading.Event()

    def make(indices):
        inside.set()
        time.sleep(0.01)
        made.append(indices[0])
        inside.clear()
        return Ready(indices=indices, batch={}, tokens=1)

    feed = Prefetch(make, ([i] for i in range(10_000)), ahead=64)
    try:
        assert feed.take([0]).indices == [0]
        for _ in range(3):
            with feed.paused():
                assert not inside.is_set()
                before = len(made)
                time.sleep(0.2)
                assert len(made) == before  # ~20 batches would have been made in this time
            time.sleep(0.05)
        assert len(made) > 1  # and it reads on once released
    finally:
        feed.close()
