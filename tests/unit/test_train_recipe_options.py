"""The recipe choices the anchors offer, each an option of `eagle3 train`: Muon (and its exact
resume), the total-variation loss, a frozen or fresh lm_head, the pass-top init, feature noise,
EAGLE-3.1's two norms."""

from __future__ import annotations

import json
import math

import pytest
import torch
from cli_helpers import err
from train_fixtures import copy_run, make_run, metrics

from eagle3cli.cli import main
from eagle3cli.config import build_config
from eagle3cli.head.read import read_head
from eagle3cli.speculate.ttt import neg_log_acceptance, soft_cross_entropy, total_variation
from eagle3cli.train.config import TrainConfig
from eagle3cli.train.loop import fit, setup, with_noise
from eagle3cli.train.optim import OptimizerPair

SMALL = dict(token_budget=640, max_length=160, ttt_steps=2, heldout_samples=0, log_every=1)


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, tiny_target_dir):
    return make_run(tmp_path_factory.mktemp("opts") / "base", tiny_target_dir, n=24)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, trained_target_dir):
    # the committed trained target: its middle layers say something about its next token
    return make_run(tmp_path_factory.mktemp("opts") / "trained", trained_target_dir, n=24)


def _copy(base, tmp_path, name="run"):
    return copy_run(base, tmp_path / name)


def _cfg(run, **kw):
    return build_config(TrainConfig, None, "train", run=run, **{**SMALL, **kw})


def test_muon_on_matrices_adamw_on_the_rest_and_an_exact_resume(tmp_path, base_run):
    straight = _copy(base_run, tmp_path, "straight")
    tr = setup(_cfg(straight, optimizer="muon", max_steps=4, save_every=2))
    assert isinstance(tr.optimizer, OptimizerPair)
    muon_params = {id(p) for g in tr.optimizer.muon.param_groups for p in g["params"]}
    for n, p in tr.draft.named_parameters():
        if p.requires_grad:
            assert (id(p) in muon_params) == (p.ndim == 2 and not n.startswith("lm_head")), n
    before = tr.draft.fc.weight.detach().clone()
    fit(tr)
    assert not torch.equal(before, tr.draft.fc.weight)

    resumed = _copy(base_run, tmp_path, "resumed")
    first = setup(_cfg(resumed, optimizer="muon", max_steps=4, save_every=2))
    first.total_steps = 2  # stop after the step-2 checkpoint, as a kill after it would
    fit(first)
    second = setup(_cfg(resumed, optimizer="muon", max_steps=4, save_every=2))
    assert second.step == 2
    fit(second)
    assert [(m["step"], m["loss"]) for m in metrics(resumed)] == [(m["step"], m["loss"]) for m in metrics(straight)]


def test_eagle31_norms_from_a_recipe_and_a_flag_reach_the_head_and_guard_the_resume(tmp_path, base_run, capsys):
    run = _copy(base_run, tmp_path)
    (tmp_path / "r.yaml").write_text("train:\n  norm_before_fc: true\n")
    small = [f"--{k.replace('_', '-')}={v}" for k, v in SMALL.items()]
    args = ["train", "--run", str(run), "--recipe", str(tmp_path / "r.yaml"), *small, "--save-every", "1"]
    assert main([*args, "--norm-before-residual", "--max-steps", "1"]) == 0
    cfg = json.loads((run / "head" / "config.json").read_text())
    assert cfg["norm_before_fc"] is True and cfg["norm_before_residual"] is True
    manifest = json.loads((run / "train" / "manifest.json").read_text())
    assert manifest["config"]["norm_before_fc"] is True and manifest["config"]["norm_before_residual"] is True
    spec = read_head(run / "head")
    assert spec.norm_before_fc and spec.norm_before_residual and "input_norm.weight" in spec.names
    capsys.readouterr()
    assert main([*args, "--no-norm-before-residual", "--max-steps", "2"]) == 2
    text = err(capsys)
    assert "norm_before_residual: checkpoint has True, this command False" in text and "next:" in text, text


def test_total_variation_is_half_the_l1_distance_and_its_gradient_flows():
    p = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    z = torch.tensor([[0.0, 0.0, 0.0], [10.0, 0.0, 0.0]], requires_grad=True)
    tv, arg = total_variation(z, p)
    q = torch.softmax(z.detach(), -1)
    assert tv.item() == pytest.approx(0.5 * (p - q).abs().sum().item())
    assert arg.tolist() == [0, 0]
    tv.backward()
    assert z.grad is not None and z.grad.abs().sum() > 0
    ce, _ = soft_cross_entropy(z.detach(), p)  # the default loss is unchanged
    assert ce.item() == pytest.approx(-(p * torch.log_softmax(z.detach(), -1)).sum().item(), rel=1e-5)


def test_lk_loss_is_minus_log_acceptance_cross_entropy_at_one_hot_and_finite_without_overlap():
    p = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    z = torch.tensor([[0.0, 0.0, 0.0], [2.0, 0.0, 0.0], [60.0, 0.0, -60.0]], requires_grad=True)
    lk, arg = neg_log_acceptance(z, p)
    q = torch.softmax(z.detach(), -1)
    alpha = torch.minimum(p, q).sum(-1)
    assert lk.item() == pytest.approx(-torch.log(alpha.clamp(min=1e-6)).sum().item(), rel=1e-5)
    tv, _ = total_variation(z.detach()[:2], p[:2])  # acceptance is 1 - TV, row by row
    assert alpha[:2].sum().item() == pytest.approx(2 - tv.item(), rel=1e-5)
    ce, _ = soft_cross_entropy(z.detach()[1:2], p[1:2])  # a one-hot target: LK is cross-entropy
    lk1, _ = neg_log_acceptance(z.detach()[1:2], p[1:2])
    assert lk1.item() == pytest.approx(ce.item(), rel=1e-5)
    lk.backward()  # the third row has no overlap at all: the loss is floored, the gradient finite
    assert torch.isfinite(lk) and torch.isfinite(z.grad).all() and arg.tolist() == [0, 0, 0]


def test_lk_loss_trains(tmp_path, base_run):
    run = _copy(base_run, tmp_path)
    fit(setup(_cfg(run, loss="lk", max_steps=2, save_every=2)))
    losses = [m["loss"] for m in metrics(run)]
    assert len(losses) == 2 and all(math.isfinite(x) and x > 0 for x in losses)


def test_tv_loss_trains(tmp_path, base_run):
    run = _copy(base_run, tmp_path)
    fit(setup(_cfg(run, loss="tv", max_steps=2, save_every=2)))
    losses = [m["loss"] for m in metrics(run)]
    assert len(losses) == 2 and all(0 < x <= 2.0 for x in losses)  # TV of each step is at most 1


def test_lm_head_frozen_keeps_the_target_rows_and_fresh_replaces_them(tmp_path, base_run):
    frozen = setup(_cfg(_copy(base_run, tmp_path, "frozen"), lm_head="frozen", max_steps=2, save_every=2))
    rows = frozen.draft.lm_head.weight.detach().clone()
    fit(frozen)
    assert not frozen.draft.lm_head.weight.requires_grad and torch.equal(rows, frozen.draft.lm_head.weight)
    target_rows = setup(_cfg(_copy(base_run, tmp_path, "target"), max_steps=2)).draft.lm_head.weight
    fresh = setup(_cfg(_copy(base_run, tmp_path, "fresh"), lm_head="fresh", max_steps=2)).draft.lm_head.weight
    assert torch.equal(rows, target_rows) and not torch.equal(fresh, target_rows)


def test_soft_and_pass_top_inits_start_near_or_below_ln_draft_vocab(tmp_path, trained_run):
    first = {}
    for init in ("random", "soft", "pass-top"):
        run = _copy(trained_run, tmp_path, init)
        tr = setup(_cfg(run, init=init, max_steps=1, save_every=1, lr=1e-12))
        if init == "pass-top":  # step 0 is the target's read-out of its top aux layer
            top = tr.draft.fc.weight[:, -tr.draft.fc.weight.shape[0] :]
            assert torch.equal(top, torch.eye(top.shape[0])) and not tr.draft.midlayer.mlp.down_proj.weight.any()
        fit(tr)
        first[init] = metrics(run)[0]["loss_k"][0]
    ln_v = math.log(len(tr.source.d2t))
    assert first["random"] > ln_v  # the confident wrong logits the soft inits avoid
    assert first["soft"] < min(first["random"], ln_v + 0.25), (first, ln_v)  # near: its hidden is not random
    assert first["pass-top"] < ln_v, (first, ln_v)


def test_feature_noise_is_relative_per_layer_and_reproducible():
    torch.manual_seed(0)
    aux = torch.cat([torch.randn(2, 5, 8) * 100, torch.randn(2, 5, 8) * 0.01], -1)  # two layers, 8 wide
    torch.manual_seed(1)
    a = with_noise(aux, 0.05, 8)
    torch.manual_seed(1)
    assert torch.equal(a, with_noise(aux, 0.05, 8))
    rel = (a - aux).unflatten(-1, (2, 8)).pow(2).mean(-1).sqrt() / aux.unflatten(-1, (2, 8)).pow(2).mean(-1).sqrt()
    assert 0.02 < rel.mean().item() < 0.08  # 5% of each layer's own scale, not of the larger one


def test_a_time_budget_ends_training_and_runs_the_schedule_over_it(tmp_path, base_run):
    run = _copy(base_run, tmp_path)
    tr = setup(_cfg(run, time_budget_s=3.0, time_clock="cpu", save_every=1000))
    fit(tr)
    m = metrics(run)
    assert tr.clock.cpu_seconds >= 3.0 and m[-1]["train_cpu_seconds"] >= 3.0 and "time budget" in tr.stopped
    assert len(m) >= 3 and m[-1]["lr"] < max(x["lr"] for x in m)  # warmed up, then decayed over the budget
    again = setup(_cfg(run, time_budget_s=3.0, time_clock="cpu", save_every=1000))  # a rerun: the budget is spent
    steps = again.step
    fit(again)
    assert again.step == steps


@pytest.mark.parametrize(
    "flag, value, said",
    [
        ("--max-attention", "0", "--max-attention 0"),
        ("--time-budget-s", "0", "--time-budget-s 0.0"),
        ("--feature-noise", "2", "--feature-noise 2.0"),
        ("--heldout-every", "0", "--heldout-every >= 1"),
    ],
)
def test_bad_values_of_the_new_options_exit_2_before_anything_runs(tmp_path, capsys, flag, value, said):
    from eagle3cli.cli import main

    run = tmp_path / "run"
    assert main(["train", "--run", str(run), flag, value]) == 2
    assert said in " ".join(capsys.readouterr().err.split()) and not run.exists()
