"""The learning curve: held-out samples are never trained on, their greedy-chain acceptance is
scored as a chain decoder would score it, and training writes it to metrics.jsonl and a PNG."""

from __future__ import annotations

import json
import os

import pytest
import torch
from train_fixtures import copy_run, fast_train_config, make_run, metrics

from eagle3cli.speculate.acceptance import accept_lengths, chain_summary, walk_rounds
from eagle3cli.speculate.ttt import Teacher
from eagle3cli.train.data import plan_epoch
from eagle3cli.train.heldout import heldout_indices
from eagle3cli.train.loop import finish, fit, setup


def _teacher(argmax: torch.Tensor, valid: torch.Tensor) -> Teacher:
    return Teacher(probs=torch.zeros(0, 4), row=torch.full(argmax.shape, -1), argmax=argmax, valid=valid)


def _one_hot(ids: torch.Tensor, v: int = 4) -> torch.Tensor:
    return torch.nn.functional.one_hot(ids, v).float()


def _lengths(steps, argmax, valid, loss_mask):
    return accept_lengths(steps, lambda h: h, _teacher(argmax, valid), loss_mask)


def test_accept_lengths_stop_at_the_first_miss_and_at_the_end_of_the_answer():
    # position 0 is the prompt, 1..5 the answer; the target's argmax per row (row r predicts x[r+1])
    argmax = torch.tensor([[0, 1, 2, 3, 0, 1]])
    valid = torch.tensor([[True, True, True, False, True, True]])  # row 3: outside the draft vocab
    loss_mask = torch.tensor([[False, True, True, True, True, True]])
    # a draft that is right wherever it can be: step k at anchor t answers argmax[t+1+k]
    steps = [_one_hot(torch.nn.functional.pad(argmax[:, 1 + k :], (0, 1 + k))) for k in range(3)]
    length = _lengths(steps, argmax, valid, loss_mask)
    # t=0: rows 1, 2 right, row 3 cannot be drafted -> 2; t=1 -> 1; t=2 -> 0; t=3: row 4 right,
    # then the answer ends -> 1
    assert length[0, :4].tolist() == [2, 1, 0, 1]
    accepted, rounds = walk_rounds(length, loss_mask, 3)
    # rounds: anchored at 0 (accepts 2, the target adds x[4]), then at 3 (accepts 1: the last token)
    assert rounds == 2 and accepted.tolist() == [2, 1, 0]
    s = chain_summary(accepted, torch.full((3,), float(rounds)))
    assert s["p_accept_k"] == [1.0, 0.5, 0.0] and s["tau"] == pytest.approx(2.5)  # 5 tokens, 2 passes
    assert s["alpha_k"] == [1.0, 0.5, 0.0]


def test_a_wrong_draft_token_ends_the_round():
    argmax = torch.tensor([[0, 1, 2, 3, 0, 1]])
    valid = torch.ones(1, 6, dtype=torch.bool)
    loss_mask = torch.tensor([[False, True, True, True, True, True]])
    steps = [_one_hot(torch.nn.functional.pad(argmax[:, 1 + k :], (0, 1 + k))) for k in range(2)]
    steps[0][0, 0] = _one_hot(torch.tensor(3))  # anchor 0 drafts a wrong first token
    length = _lengths(steps, argmax, valid, loss_mask)
    assert length[0, :4].tolist() == [0, 2, 2, 1]  # step 1 of anchor 0 does not count after a miss
    accepted, rounds = walk_rounds(length, loss_mask, 2)
    assert rounds == 2 and accepted.tolist() == [1, 1]  # anchored at 0 (none), then at 1 (two)


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


def test_training_writes_the_learning_curve(tmp_path, base_run, capsys):
    run = copy_run(base_run, tmp_path / "run")
    cfg = fast_train_config(run, max_steps=5, log_every=1, save_every=5, heldout_every=2, heldout_depth=4, ttt_steps=2)
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
    # the log's two taus share one definition (accepted + the bonus token), each labelled
    captured = capsys.readouterr()
    log = " ".join((captured.err + captured.out).split())
    last = metrics(run)[-1]
    assert f"train-tau@2 {1 + last['sim_accept_len']:.3f}" in log and "accept_len" not in log
    assert f"tau {last['heldout_tau']:.3f} at depth 4" in log


@pytest.mark.parametrize("export", ["best", "last"])
def test_the_head_is_the_checkpoint_with_the_best_heldout_tau(tmp_path, base_run, monkeypatch, capsys, export):
    """Held-out tau that peaks mid-run (scripted: 1.5, 2.5, 1.8 at steps 2, 4, 5): `best` keeps the
    step-4 weights, saved off the checkpoint cadence, and exports them; `last` exports step 5's."""
    from safetensors.torch import load_file

    from eagle3cli.train import checkpoint as ckpt
    from eagle3cli.train import loop

    taus = iter([1.5, 2.5, 1.8])
    scripted = lambda *a: {"tau": next(taus), "alpha_k": [0.5], "samples": 4, "anchors": 9}  # noqa: E731
    monkeypatch.setattr(loop, "heldout_acceptance", scripted)
    monkeypatch.setattr(loop, "plot_curve", lambda *a, **k: None)
    run = copy_run(base_run, tmp_path / "run")
    cfg = fast_train_config(run, max_steps=5, log_every=1, save_every=3, heldout_every=2, ttt_steps=1,
                            head_from=export, lr=1e-2)  # fmt: skip
    tr = setup(cfg)
    fit(tr)
    final = {k: v.clone() for k, v in tr.draft.state_dict().items()}
    finish(tr)
    d = run / "train" / ckpt.CKPT_DIR
    assert os.readlink(d / "best") == "step-0000004.safetensors"  # not a multiple of --save-every
    best_fc = ckpt.load(d / "best")["model"]["fc.weight"]
    head_fc = load_file(run / "head" / "model.safetensors")["fc.weight"]
    assert not torch.equal(best_fc, final["fc.weight"])  # the steps after it moved the weights
    manifest = json.loads((run / "train" / "manifest.json").read_text())
    assert (manifest["best_step"], manifest["best_heldout_tau"]) == (4, 2.5)
    assert (manifest["last_step"], manifest["last_heldout_tau"]) == (5, 1.8)
    log = " ".join(capsys.readouterr().err.split())
    if export == "best":
        assert torch.equal(head_fc, best_fc)
        assert (manifest["exported_step"], manifest["exported_heldout_tau"]) == (4, 2.5)
        assert "exporting step 4's weights: held-out tau 2.500, above the last step's 1.800" in log
    else:
        assert torch.equal(head_fc, final["fc.weight"])
        assert manifest["exported_step"] == 5 and "exporting step" not in log


def test_batches_bound_attention_memory_by_length_squared():
    lengths = [2048] * 4 + [1024] * 8 + [256] * 64
    plan = plan_epoch(lengths, 8192, 0, 0, max_attention=2048 * 2048)
    for b in plan:
        longest = max(lengths[i] for i in b)
        assert len(b) * longest <= 8192 and len(b) * longest**2 <= 2048 * 2048
    sizes = {lengths[b[0]]: len(b) for b in plan if len({lengths[i] for i in b}) == 1}
    assert sizes[2048] == 1 and sizes[1024] == 4  # the token budget alone would take 4 and 8
    assert sorted(i for b in plan for i in b) == list(range(len(lengths)))
