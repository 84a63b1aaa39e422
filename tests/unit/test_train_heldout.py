"""The learning curve: held-out samples are never trained on, their greedy-chain acceptance is
scored as a chain decoder would score it, and training writes it to metrics.jsonl and a PNG."""

from __future__ import annotations

import shutil

import pytest
import torch
from train_fixtures import make_run, metrics

from eagle3cli.config import build_config
from eagle3cli.train.config import TrainConfig
from eagle3cli.train.data import plan_epoch
from eagle3cli.train.heldout import chain_counts, chain_summary, heldout_indices
from eagle3cli.train.loop import finish, fit, setup
from eagle3cli.train.ttt import Teacher


def _teacher(argmax: torch.Tensor, valid: torch.Tensor) -> Teacher:
    return Teacher(probs=torch.zeros(0, 4), row=torch.full(argmax.shape, -1), argmax=argmax, valid=valid)


def _one_hot(ids: torch.Tensor, v: int = 4) -> torch.Tensor:
    return torch.nn.functional.one_hot(ids, v).float()


def test_chain_counts_stop_at_the_first_miss_and_an_out_of_vocab_target_is_a_miss():
    # one sequence of 6 tokens, all assistant tokens; target argmax per position (rows 1.. are read)
    argmax = torch.tensor([[0, 1, 2, 3, 0, 1]])
    valid = torch.tensor([[True, True, True, False, True, True]])
    loss_mask = torch.ones(1, 6, dtype=torch.bool)
    # step k at anchor t is scored against argmax[t+1+k]; make the draft right everywhere
    steps = [_one_hot(torch.nn.functional.pad(argmax[:, 1 + k :], (0, 1 + k))) for k in range(3)]
    acc, cnt = chain_counts(steps, lambda h: h, _teacher(argmax, valid), loss_mask)
    # anchors: step k needs token t+2+k inside the sequence -> t <= 3-k; step 0 counts t=0..3
    assert cnt.tolist() == [4, 3, 2]
    # row 3 is out of the draft vocab: anchor t=2 misses at step 0, t=1 at step 1, t=0 at step 2
    assert acc.tolist() == [3, 1, 0]
    s = chain_summary(acc, cnt)
    assert s["p_accept_k"] == [0.75, pytest.approx(1 / 3, abs=1e-4), 0.0]
    assert s["tau"] == pytest.approx(1 + 0.75 + 1 / 3, abs=1e-3)
    assert s["alpha_k"][0] == 0.75 and s["alpha_k"][1] == pytest.approx(0.4444, abs=1e-3)


def test_a_wrong_draft_token_ends_the_chain():
    argmax = torch.tensor([[0, 1, 2, 3, 0, 1]])
    valid = torch.ones(1, 6, dtype=torch.bool)
    steps = [_one_hot(torch.nn.functional.pad(argmax[:, 1 + k :], (0, 1 + k))) for k in range(2)]
    steps[0][0, 0] = _one_hot(torch.tensor(3))  # anchor 0 drafts a wrong first token
    acc, cnt = chain_counts(steps, lambda h: h, _teacher(argmax, valid), torch.ones(1, 6, dtype=torch.bool))
    assert acc.tolist() == [3, 2] and cnt.tolist() == [4, 3]  # anchor 0 stays out at step 1 too


def test_heldout_indices_are_spread_deterministic_and_never_planned():
    h = heldout_indices(1000, 32)
    assert len(h) == 32 and h == heldout_indices(1000, 32) and h[0] == 0 and h[-1] > 900
    assert heldout_indices(50, 32) == [0, 10, 20, 30, 40]  # at most a tenth of the cache
    assert heldout_indices(9, 32) == [] and heldout_indices(1000, 0) == []
    lengths = [10 + i % 50 for i in range(1000)]
    for epoch in range(3):
        planned = [i for b in plan_epoch(lengths, 256, 0, epoch, exclude=h) for i in b]
        assert sorted(planned) == sorted(set(range(1000)) - set(h))


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, tiny_target_dir):
    return make_run(tmp_path_factory.mktemp("heldout") / "base", tiny_target_dir, n=40)


def test_training_writes_the_learning_curve(tmp_path, base_run):
    run = tmp_path / "run"
    run.mkdir()
    for sub in ("data", "cache"):
        shutil.copytree(base_run / sub, run / sub)
    cfg = build_config(
        TrainConfig,
        None,
        "train",
        run=run,
        max_steps=5,
        log_every=1,
        save_every=5,
        heldout_every=2,
        heldout_depth=4,
        token_budget=640,
        max_length=160,
        ttt_steps=2,
    )
    tr = setup(cfg)
    assert tr.heldout == heldout_indices(40, 32) == [0, 10, 20, 30]
    fit(tr)
    finish(tr)
    points = [m for m in metrics(run) if "heldout_tau" in m]
    assert [m["step"] for m in points] == [2, 4, 5]  # every 2 steps and at the end
    for m in points:
        assert 1.0 <= m["heldout_tau"] <= 5.0 and len(m["heldout_alpha_k"]) == 4
        assert m["heldout_samples"] == 4 and m["heldout_anchors"] > 0 and m["train_seconds"] > 0
    assert points[0]["tokens_seen"] < points[-1]["tokens_seen"]
    png = run / "train" / "learning_curve.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_batches_bound_attention_memory_by_length_squared():
    lengths = [2048] * 4 + [1024] * 8 + [256] * 64
    plan = plan_epoch(lengths, 8192, 0, 0, max_attention=2048 * 2048)
    for b in plan:
        longest = max(lengths[i] for i in b)
        assert len(b) * longest <= 8192 and len(b) * longest**2 <= 2048 * 2048
    sizes = {lengths[b[0]]: len(b) for b in plan if len({lengths[i] for i in b}) == 1}
    assert sizes[2048] == 1 and sizes[1024] == 4  # the token budget alone would take 4 and 8
    assert sorted(i for b in plan for i in b) == list(range(len(lengths)))
