"""eagle3 train on a tiny random target: files written, exact resume after kill -9, clear errors,
and (slow) 2-process DeepSpeed ZeRO-2/3 runs that track the single-process run across a kill -9."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from train_fixtures import REPO, copy_run, eagle3, fast_train_config, make_run, metrics

from eagle3cli.cli import main
from eagle3cli.config import build_config
from eagle3cli.head.read import load_head
from eagle3cli.head.table import HEAD_TENSOR_NAMES
from eagle3cli.train.config import TrainConfig
from eagle3cli.train.loop import finish, fit, setup

FAST = ["--token-budget", "640", "--max-length", "160"]
ONE_STEP = ["--max-steps", "1", "--log-every", "1", "--save-every", "1", *FAST]


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, tiny_target_dir):
    return make_run(tmp_path_factory.mktemp("train") / "base", tiny_target_dir, n=24)


@pytest.fixture
def run_dir(tmp_path, base_run):
    return copy_run(base_run, tmp_path / "run")


def test_train_writes_checkpoints_metrics_and_a_loadable_head(run_dir, tiny_target_dir):
    from transformers import AutoModelForCausalLM

    cfg = fast_train_config(run_dir, max_steps=4, log_every=2, save_every=2, ttt_steps=3)
    tr = setup(cfg)
    fit(tr)
    head = finish(tr)
    m = metrics(run_dir)
    assert [r["step"] for r in m] == [2, 4]
    for r in m:
        assert len(r["loss_k"]) == len(r["acc_k"]) == len(r["alpha_k"]) == 3
        assert r["tok_per_s"] > 0 and r["loss"] > 0 and 0 <= r["sim_accept_len"] <= 3
        assert r["rss_mib"] > 0  # the log shows the process's memory (Linux /proc)
    ck = run_dir / "train" / "checkpoints"
    assert (ck / "last").resolve().name == "step-0000004.safetensors" and (ck / "best").is_symlink()
    man = json.loads((run_dir / "train" / "manifest.json").read_text())
    assert man["stage"] == "train" and man["steps"] == 4 and man["export_self_check_max_abs_diff"] == 0.0

    # the export reloads (with the target's embeddings) to exactly the trained model's logits
    target = AutoModelForCausalLM.from_pretrained(str(tiny_target_dir))
    loaded = load_head(head, target)
    batch = tr.source.batch([0, 1], 160)
    with torch.no_grad():
        tr.draft.eval()
        a = [tr.draft.logits(h) for h in tr.draft.ttt_unroll(batch["input_ids"], batch["aux_hidden"], 3)]
        b = [loaded.logits(h) for h in loaded.ttt_unroll(batch["input_ids"], batch["aux_hidden"], 3)]
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert torch.equal(loaded.embed_tokens.weight, target.get_input_embeddings().weight)
    assert torch.equal(loaded.d2t, tr.source.d2t) and torch.equal(loaded.t2d, tr.source.t2d)


def _losses(run_dir):
    return [(r["step"], r["loss"], r["loss_k"], r["acc_k"]) for r in metrics(run_dir)]


@pytest.mark.slow
@pytest.mark.parametrize("online", [False, True], ids=["cache", "online"])
def test_kill9_then_rerun_resumes_with_identical_losses(tmp_path, run_dir, tiny_target_dir, online):
    # online too: a run over a corpus too large to cache resumes across sessions, its features recomputed
    args = ["--max-steps", "10", "--log-every", "1", "--save-every", "2", "--ttt-steps", "2", *FAST]
    if online:
        shutil.rmtree(run_dir / "cache")
        args += ["--online", "--target", str(tiny_target_dir), "--target-dtype", "bf16", "--draft-vocab-size", "300"]
    ref = tmp_path / "ref"
    ref.mkdir()
    for sub in ("data",) if online else ("data", "cache"):
        shutil.copytree(run_dir / sub, ref / sub)
    r = eagle3("train", "--run", ref, *args)
    assert r.returncode == 0, r.stderr[-3000:]

    import os

    env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="200")
    p = subprocess.Popen(
        [sys.executable, "-m", "eagle3cli", "train", "--run", str(run_dir), *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 240
    while time.time() < deadline and p.poll() is None and len(metrics(run_dir)) < 5:
        time.sleep(0.05)
    assert p.poll() is None, "the run finished before it could be killed"
    p.send_signal(signal.SIGKILL)
    p.wait()
    killed_at = len(metrics(run_dir))
    assert 5 <= killed_at < 10
    r = eagle3("train", "--run", run_dir, *args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from step-" in r.stderr
    assert _losses(run_dir) == _losses(ref)  # bit-identical, including the steps redone after the kill


def test_resume_with_other_settings_is_refused(run_dir, capsys):
    assert (
        main(["train", "--run", str(run_dir), "--max-steps", "2", "--log-every", "1", "--save-every", "1", *FAST]) == 0
    )
    assert main(["train", "--run", str(run_dir), "--max-steps", "3", "--lr", "1e-2", *FAST]) == 2
    assert "other settings (lr)" in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize(
    "case",
    [
        "missing-cache",
        "other-target",
        "aux-top",
        "bad-ds-key",
        "ds-optimizer",
        "draft-vocab-cache",
        "bad-flag-value",
    ],
)
def test_bad_inputs_exit_2_with_a_clear_message(case, run_dir, tmp_path, deep_target_dir, capsys):
    base = ["train", "--run", str(run_dir), *FAST]
    expect = {
        "missing-cache": ("no cache at", ["--cache", str(tmp_path / "nope")]),
        "other-target": ("does not match this run", ["--target", str(deep_target_dir)]),
        "aux-top": ("the cache holds features of layers", ["--aux-layers", "top"]),
        "bad-ds-key": ("invalid DeepSpeed config", ["--deepspeed", "BADJSON"]),
        "ds-optimizer": ("'optimizer' is set by", ["--deepspeed", "OPTJSON"]),
        "draft-vocab-cache": ("larger than the cache's draft vocab (512", ["--draft-vocab-size", "1024"]),
        "bad-flag-value": ("--depth 0", ["--ttt-steps", "0"]),  # the old name still works
    }[case]
    flags = expect[1]
    if "BADJSON" in flags:
        (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 2, "no_such_key": 1}}))
        flags = ["--deepspeed", str(tmp_path / "ds.json"), "--nproc", "2"]
    if "OPTJSON" in flags:
        (tmp_path / "ds.json").write_text(json.dumps({"optimizer": {"type": "Adam"}}))
        flags = ["--deepspeed", str(tmp_path / "ds.json"), "--nproc", "2"]
    assert main(base + flags) == 2
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert expect[0] in err, err
    assert "Traceback" not in err
    assert not (run_dir / "train" / "launch.yaml").exists()  # nothing was launched


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["zero2", "zero3"])
def test_deepspeed_two_processes_resume_after_kill9_and_track_single_process(tmp_path, run_dir, stage):
    """2 ranks x 1 micro-batch vs 1 process x 2 accumulated micro-batches: the same batches and the
    same averaged gradient per step, so the losses agree up to reduction-order rounding, also
    across a kill -9 of every rank and a resume. The cache is passed with --cache (a flat `cache:`
    key in the ranks' launch recipe), and ZeRO-3's partitioned weights are exported whole."""
    import os

    single = tmp_path / "single"
    single.mkdir()
    shutil.copytree(run_dir / "data", single / "data")
    shutil.copytree(run_dir / "cache", single / "cache")
    cache = tmp_path / "elsewhere" / "cache"
    shutil.move(str(run_dir / "cache"), cache)
    common = ["--max-steps", "6", "--log-every", "1", "--save-every", "2", "--ttt-steps", "3", *FAST]
    r = eagle3("train", "--run", single, "--grad-accum", "2", *common)
    assert r.returncode == 0, r.stderr[-3000:]
    ds = ["train", "--run", str(run_dir), "--cache", str(cache), "--deepspeed", stage, "--nproc", "2", *common]

    env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="200")
    log = tmp_path / "first-launch.log"
    with log.open("wb") as out:
        p = subprocess.Popen(
            [sys.executable, "-m", "eagle3cli", *ds],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the launcher and both ranks die together
        )
    ckpt_dir = run_dir / "train" / "checkpoints"
    deadline = time.time() + 900
    while time.time() < deadline and p.poll() is None and len(metrics(run_dir)) < 3:
        time.sleep(0.05)
    assert p.poll() is None, "the run ended before it could be killed:\n" + log.read_text(errors="replace")[-4000:]
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert 3 <= len(metrics(run_dir)) < 6 and (ckpt_dir / "last").exists()
    assert not (run_dir / "head" / "manifest.json").exists()

    r = eagle3(*ds, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "resumed from step-" in r.stdout + r.stderr
    # DeepSpeed's shared-memory buffers of both launches (the killed one included) are gone
    ports = re.findall(r"master 127\.0\.0\.1:(\d+)", " ".join((log.read_text() + r.stdout + r.stderr).split()))
    assert len(set(ports)) == 2, ports
    for port in ports:
        assert not list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*")), port
    a, b = metrics(single), metrics(run_dir)
    assert [m["step"] for m in a] == [m["step"] for m in b] == [1, 2, 3, 4, 5, 6]
    for x, y in zip(a, b, strict=True):
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-4)
        assert y["tokens"] == x["tokens"]
    assert a[-1]["loss"] < a[0]["loss"]
    man = json.loads((run_dir / "train" / "manifest.json").read_text())
    assert man["world_size"] == 2 and man["export_self_check_max_abs_diff"] == 0.0
    assert man["input"]["cache"] == str(cache)
    head, ref = load_head(run_dir / "head"), load_head(single / "head")
    assert set(head.state_dict()) - {"embed_tokens.weight"} == set(HEAD_TENSOR_NAMES)
    for name, t in ref.state_dict().items():  # ZeRO-3 exports every tensor whole, not a rank's shard
        got = head.state_dict()[name]
        assert got.shape == t.shape, name
        if t.is_floating_point() and t.norm() > 0:
            assert float((got - t).norm() / t.norm()) < 1e-3, name
        else:
            assert torch.equal(got, t), name


@pytest.mark.parametrize("code", [0, 3])
def test_a_rank_ends_with_its_code_and_skips_interpreter_finalization(tmp_path, code):
    """A rank's process group outlives destroy_process_group (DeepSpeed holds it), and freeing it
    during interpreter shutdown could abort a finished rank. end_rank leaves with the rank's code
    before finalization (no atexit handler runs), and is a no-op where no group is up."""
    marker = tmp_path / "finalized"
    script = (
        "import atexit, sys\n"
        "import torch.distributed as dist\n"
        "from eagle3cli.train.loop import end_rank\n"
        "end_rank(0)\n"  # no process group: returns
        f"atexit.register(lambda: open({str(marker)!r}, 'w').close())\n"
        f"dist.init_process_group('gloo', init_method={(tmp_path / 'store').as_uri()!r}, rank=0, world_size=1)\n"
        "print('up', flush=True)\n"
        f"end_rank({code})\n"
        "print('not reached', flush=True)\n"
    )
    r = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == code, r.stderr[-2000:]
    assert r.stdout.split() == ["up"]
    assert not marker.exists()


def test_recipes_and_deepspeed_configs_validate():
    from eagle3cli.train.launch import deepspeed_config, preset_path

    cfg = build_config(TrainConfig, REPO / "recipes/tiny/train.yaml", "train", run="runs/x")
    assert cfg.ttt_steps == 7 and cfg.save_every % cfg.log_every == 0
    for name in ("zero1", "zero2", "zero3"):
        preset = json.loads(preset_path(name).read_text())  # what --deepspeed NAME reads, shipped in the package
        assert preset["zero_optimization"]["stage"] == int(name[-1])
        for spec in (name, str(preset_path(name))):
            ds = deepspeed_config(
                build_config(TrainConfig, None, "train", run="r", deepspeed=spec, grad_accum=3, nproc=2), bf16=False
            )
            assert ds["zero_optimization"]["stage"] == int(name[-1])
            assert ds["gradient_accumulation_steps"] == 3 and ds["bf16"] == {"enabled": False}
            assert ds["zero_optimization"] == preset["zero_optimization"]


def test_online_training_runs_the_target_in_process(run_dir, tiny_target_dir, capsys):
    # without --draft-vocab-size: the default 32000 is capped at the target's vocab, as the cache does
    shutil.rmtree(run_dir / "cache")
    vocab = json.loads((tiny_target_dir / "config.json").read_text())["vocab_size"]
    assert (
        main(
            [
                "train",
                "--run",
                str(run_dir),
                "--online",
                "--target",
                str(tiny_target_dir),
                "--max-steps",
                "2",
                "--log-every",
                "1",
                "--save-every",
                "2",
                "--ttt-steps",
                "2",
                *FAST,
            ]
        )
        == 0
    )
    m = metrics(run_dir)
    assert [r["step"] for r in m] == [1, 2] and all(r["tokens"] > 0 for r in m)
    assert f"--draft-vocab-size 32000 exceeds the target vocab {vocab}: capped" in " ".join(
        capsys.readouterr().err.split()
    )
    head = load_head(run_dir / "head")
    assert head.config.draft_vocab_size == vocab and head.config.aux_layer_ids == [1, 2, 2]
    assert json.loads((run_dir / "train" / "manifest.json").read_text())["input"]["data"].endswith("data")


def test_smaller_draft_vocab_from_a_cache_is_the_one_that_cache_size_would_choose(tmp_path, run_dir, tiny_target_dir):
    from safetensors.torch import load_file

    small = make_run(tmp_path / "small", tiny_target_dir, n=24, draft_vocab_size=256)
    chosen = load_file(str(small / "cache" / "vocab.safetensors"))
    args = ["train", "--run", str(run_dir), "--draft-vocab-size", "256", "--max-steps", "2", "--log-every", "1"]
    assert main([*args, "--save-every", "2", *FAST]) == 0
    head = load_head(run_dir / "head")
    assert head.config.draft_vocab_size == 256 and head.lm_head.weight.shape[0] == 256
    assert torch.equal(head.d2t, chosen["d2t"]) and torch.equal(head.t2d.bool(), chosen["t2d"].bool())
    # the held-out curve scores the smaller vocab (targets outside it are rejections)
    assert all(0 <= r["heldout_tau"] for r in metrics(run_dir) if "heldout_tau" in r)
    # the vocab is part of the run: resuming with the cache's own vocab is refused
    assert main(["train", "--run", str(run_dir), "--max-steps", "3", *FAST]) == 2


def test_a_smaller_vocab_from_an_altered_vocab_file_exits_2_and_writes_nothing(run_dir, capsys):
    from safetensors.torch import load_file, save_file

    vocab = run_dir / "cache" / "vocab.safetensors"
    tensors = load_file(str(vocab))
    save_file({k: v for k, v in tensors.items() if k != "token_counts"}, str(vocab))
    assert main(["train", "--run", str(run_dir), "--draft-vocab-size", "256", "--max-steps", "1", *FAST]) == 2
    err = " ".join(capsys.readouterr().err.split())
    # the cache's checksums catch the altered file before any vocab is chosen from it
    assert "is damaged: vocab.safetensors" in err and "eagle3 cache --run" in err and "Traceback" not in err
    assert not (run_dir / "train" / "checkpoints").exists()  # nothing was trained or written


def test_offline_checkpoints_recording_the_old_online_default_still_resume():
    from eagle3cli.train.setup import config_key

    old = config_key({"online": False, "draft_vocab_size": 32000, "lr": 1e-3})
    assert old == config_key({"online": False, "draft_vocab_size": None, "lr": 1e-3})
    assert config_key({"online": True, "draft_vocab_size": 32000}) == config_key(
        {"online": True, "draft_vocab_size": None}
    )
    assert config_key({"online": False, "draft_vocab_size": 256}) != old


def test_top_layer_ablation_trains_fc_over_one_hidden(tmp_path, tiny_target_dir):
    run = make_run(tmp_path / "top", tiny_target_dir, n=8, aux_layers=(3,))
    assert main(["train", "--run", str(run), "--aux-layers", "top", "--ttt-steps", "1", *ONE_STEP]) == 0
    head = load_head(run / "head")
    assert head.fc.weight.shape == (64, 64) and head.config.aux_layer_ids == [3]
    assert len(metrics(run)[0]["acc_k"]) == 1


def test_tensorboard_scalars_or_a_clear_error(run_dir, capsys):
    args = ["train", "--run", str(run_dir), *ONE_STEP, "--tensorboard"]
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        assert main(args) == 2
        assert "pip install tensorboard" in " ".join(capsys.readouterr().err.split())
        return
    assert main(args) == 0
    assert list((run_dir / "train" / "tb").glob("events.out.tfevents.*"))


def test_train_samples_are_nested_subsets_that_never_touch_the_held_out_set(run_dir, capsys):
    from eagle3cli.train.heldout import heldout_indices, unused_indices

    held = heldout_indices(200, 16)
    subsets = [set(range(200)) - set(unused_indices(200, held, n)) for n in (10, 40, 184)]
    assert [len(s) for s in subsets] == [10, 40, 184]
    assert subsets[0] < subsets[1] < subsets[2] and not subsets[2] & set(held)
    assert unused_indices(200, held, None) == held
    # a run on 5 of the cache's samples trains only those, and says so in its manifest
    cfg = fast_train_config(run_dir, max_steps=2, ttt_steps=2, train_samples=5, heldout_samples=4)
    tr = setup(cfg)
    trained = set(range(len(tr.source.lengths))) - set(tr.unused)
    assert len(trained) == 5 and not trained & set(tr.heldout)
    fit(tr)
    finish(tr)
    m = json.loads((run_dir / "train" / "manifest.json").read_text())
    assert m["trained_samples"] == 5
    assert m["trained_sample_tokens"] == sum(tr.source.lengths[i] for i in trained)
    # more samples than the cache can train on: exit 2 before anything is written
    assert main(["train", "--run", str(run_dir), "--train-samples", "1000", "--no-resume", *FAST]) == 2
    assert "trainablesamples" in "".join(capsys.readouterr().err.split())  # rich wraps anywhere


def test_online_target_dtype_computes_the_features_and_a_resume_keeps_it(run_dir, tmp_path, tiny_target_dir, capsys):
    # --target-dtype is the online twin of `eagle3 cache --dtype`: bf16 features train another first step
    # than fp32 ones, and a resume in another dtype would mix two feature sets, so it is refused
    shutil.rmtree(run_dir / "cache")
    base = ["train", "--online", "--target", str(tiny_target_dir), "--draft-vocab-size", "300", "--log-every", "1",
            "--save-every", "1", "--ttt-steps", "2", *FAST]  # fmt: skip
    other = tmp_path / "other"
    shutil.copytree(run_dir / "data", other / "data")
    assert main([*base, "--run", str(run_dir), "--max-steps", "1", "--target-dtype", "bf16"]) == 0
    assert main([*base, "--run", str(other), "--max-steps", "1", "--target-dtype", "fp32"]) == 0
    bf16, fp32 = metrics(run_dir)[0], metrics(other)[0]
    assert bf16["tokens"] == fp32["tokens"] and bf16["loss"] != fp32["loss"]
    assert json.loads((run_dir / "train" / "manifest.json").read_text())["config"]["target_dtype"] == "bf16"
    capsys.readouterr()
    assert main([*base, "--run", str(run_dir), "--max-steps", "2", "--target-dtype", "fp32"]) == 2
    text = "".join(capsys.readouterr().err.split())  # rich wraps long paths at any character
    assert "target_dtype:checkpointhas'bf16',thiscommand'fp32'" in text, text


@pytest.mark.slow  # two online runs with a curve point at every step: the fast tier's slowest test
def test_online_held_out_features_are_made_once_per_run(run_dir, tmp_path, tiny_target_dir, monkeypatch):
    # the held-out set never changes, so its target forwards are made at the first point of the curve
    # and kept: two more steps with a curve point at each cost two more training forwards, not more
    import eagle3cli.speculate.target as target_mod

    shutil.rmtree(run_dir / "cache")
    calls = []
    real = target_mod.capture_features
    monkeypatch.setattr(target_mod, "capture_features", lambda *a, **k: calls.append(1) or real(*a, **k))
    base = ["train", "--online", "--target", str(tiny_target_dir), "--draft-vocab-size", "300", "--log-every", "1",
            "--save-every", "100", "--ttt-steps", "2", "--heldout-every", "1", "--heldout-samples", "4", *FAST]  # fmt: skip
    counts = {}
    for steps in (2, 4):
        run = tmp_path / f"s{steps}"
        shutil.copytree(run_dir / "data", run / "data")
        calls.clear()
        assert main([*base, "--run", str(run), "--max-steps", str(steps)]) == 0
        assert sum("heldout_tau" in r for r in metrics(run)) >= steps  # a curve point at every step
        counts[steps] = len(calls)
    assert counts[4] - counts[2] == 2, counts


def test_init_head_continues_a_head_on_the_next_samples(run_dir, tmp_path, tiny_target_dir, capsys):
    # a run over a corpus too large for one session goes on in the next from the head the first made,
    # on samples it has not seen: the continuation starts where the first run ended (its step-0 held-out
    # tau is the first run's last, on the same held-out set) and keeps the head's draft vocab
    shutil.rmtree(run_dir / "cache")
    base = ["train", "--online", "--target", str(tiny_target_dir), "--draft-vocab-size", "300", "--log-every", "1",
            "--save-every", "1", "--ttt-steps", "2", "--heldout-samples", "2", "--train-samples", "8", *FAST]  # fmt: skip
    nxt = tmp_path / "next"
    shutil.copytree(run_dir / "data", nxt / "data")
    assert main([*base, "--run", str(run_dir), "--max-steps", "2"]) == 0
    first = metrics(run_dir)
    cont = [*base, "--run", str(nxt), "--init-head", str(run_dir / "head"), "--skip-samples", "8", "--max-steps", "1"]
    assert main(cont) == 0
    second = metrics(nxt)
    assert second[0]["step"] == 0 and second[0]["heldout_tau"] == first[-1]["heldout_tau"]
    assert [m["step"] for m in second] == [0, 1]
    a, b = load_head(run_dir / "head"), load_head(nxt / "head")
    assert torch.equal(a.d2t, b.d2t) and not torch.equal(a.fc.weight, b.fc.weight)

    from eagle3cli.train.heldout import heldout_indices, unused_indices

    held = heldout_indices(24, 2)
    seen = set(range(24)) - set(unused_indices(24, held, 8))
    new = set(range(24)) - set(unused_indices(24, held, 8, skip=8))
    rest = set(range(24)) - set(unused_indices(24, held, None, skip=8))
    assert len(seen) == len(new) == 8 and not seen & new and new < rest and not rest & (seen | set(held))
    # a rerun resumes the continuation (its step-0 point is not measured twice)
    assert main([*cont[:-1], "2"]) == 0
    assert [m["step"] for m in metrics(nxt)] == [0, 1, 2]

    # a head that does not fit the run is refused before anything is trained, naming the flag to give
    capsys.readouterr()
    other = tmp_path / "other"
    shutil.copytree(run_dir / "data", other / "data")
    assert main([*cont, "--run", str(other), "--norm-before-fc"]) == 2
    err = "".join(capsys.readouterr().err.split())
    assert "norm_before_fcisFalse" in err and "--no-norm-before-fc" in err, err
    assert not (other / "train" / "checkpoints").exists()
    assert main([*base, "--run", str(other), "--skip-samples", "20"]) == 2
    assert "trainablesamples" in "".join(capsys.readouterr().err.split())


def test_extra_data_windows_walk_every_folder_in_step_and_cover_each_once():
    # --data alone is windowed exactly as before; an extra folder takes the same share of its own
    # fixed order, so sessions from the join point on take disjoint shares that cover it once
    from eagle3cli.train.heldout import heldout_indices, unused_indices, unused_indices_in_folders

    held = heldout_indices(40, 4)
    assert unused_indices_in_folders([40], held, 8, 8) == unused_indices(40, held, 8, 8)
    sizes = [40, 30]

    def used(train, skip, joined=0):
        out = set(range(70)) - set(unused_indices_in_folders(sizes, held, train, skip, joined))
        return {i for i in out if i < 40}, {i for i in out if i >= 40}

    first, extra = used(9, 0)
    assert first == set(range(40)) - set(unused_indices(40, held, 9)) and len(extra) == round(9 / 36 * 30)
    # a run under way since 12 of --data's 36 trainable samples adds the folder: sessions of 7, 7, the rest
    windows = [used(7, 12, 12), used(7, 19, 12), used(None, 26, 12)]
    shares = [w[1] for w in windows]
    assert all(shares) and all(not a & b for i, a in enumerate(shares) for b in shares[i + 1 :])
    assert set().union(*shares) == set(range(40, 70)) and not set(held) & set().union(*(w[0] for w in windows))
    assert [len(s) for s in shares] == [round(7 / 24 * 30), round(14 / 24 * 30) - round(7 / 24 * 30), 30 - 18]


def test_online_training_reads_extra_gen_data_folders(run_dir, tmp_path, tiny_target_dir, capsys):
    # two sources in two folders: both feed the run, the manifest says how much each gave, the
    # held-out set stays --data's, and a resume with another folder list is refused
    shutil.rmtree(run_dir / "cache")
    extra = tmp_path / "extra"
    shutil.copytree(run_dir / "data", extra)
    base = ["train", "--online", "--target", str(tiny_target_dir), "--draft-vocab-size", "300", "--log-every", "1",
            "--save-every", "1", "--ttt-steps", "2", "--heldout-samples", "2", *FAST]  # fmt: skip
    assert (
        main([*base, "--run", str(run_dir), "--extra-data", str(extra), "--train-samples", "8", "--max-steps", "1"])
        == 0
    )
    m = json.loads((run_dir / "train" / "manifest.json").read_text())
    rows = m["trained_by_folder"]
    assert [r["folder"] for r in rows][1:] == [str(extra)] and all(r["samples"] > 0 for r in rows)
    assert rows[0]["samples"] == 8 and sum(r["samples"] for r in rows) == m["trained_samples"]
    assert m["input"]["extra_data"] == [str(extra)] and "+" in m["input_fingerprint"]
    out = " ".join("".join(capsys.readouterr()).split())
    assert "training samples: 8 of" in out and f"{rows[1]['samples']} of" in out, out
    assert main([*base, "--run", str(run_dir), "--train-samples", "8", "--max-steps", "2"]) == 2
    assert "extra_data" in capsys.readouterr().err
    # only --online reads folders; a join point after this session's start is refused
    assert main([*base[:1], "--run", str(run_dir), "--extra-data", str(extra)]) == 2
    assert main([*base, "--run", str(tmp_path / "o"), "--extra-data", str(extra), "--extra-data-from", "4"]) == 2
    assert "--extra-data-from" in "".join(capsys.readouterr().err.split())
