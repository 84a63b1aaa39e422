"""Issue 13, train side: checkpoints run no code, NaN never reaches a head, metrics survive a cut
line, resume is about the run (not how its path is spelled), options are validated, a finished
run stays finished, and eval/serve refuse a non-finite head."""

from __future__ import annotations

import errno
import json
import math
import os
import struct

import pytest
import serve_helpers as pf
import torch
from serve_helpers import copy_head, edit_tensors, export_head
from train_fixtures import copy_run, make_run, metrics

import eagle3cli.train.loop as loop
from eagle3cli.cli import main
from eagle3cli.config import build_config
from eagle3cli.engines.local_engine import free_port
from eagle3cli.errors import StageError
from eagle3cli.head.read import load_head
from eagle3cli.train import checkpoint as ckpt
from eagle3cli.train.config import TrainConfig

FAST = ["--token-budget", "640", "--max-length", "160", "--ttt-steps", "2", "--log-every", "1"]


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # rich would wrap long paths inside the messages we check


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, tiny_target_dir):
    return make_run(tmp_path_factory.mktemp("rel-train") / "base", tiny_target_dir, n=24)


@pytest.fixture
def run_dir(tmp_path, base_run):
    return copy_run(base_run, tmp_path / "run")


def train(run_dir, *flags) -> int:
    return main(["train", "--run", str(run_dir), *FAST, *flags])


def err(capsys) -> str:
    text = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert "Traceback" not in text
    return text


# ---------------------------------------------------------------- 1. no code from checkpoints
class _Payload:
    """Unpickling this runs `touch MARKER`: what a crafted checkpoint would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_checkpoint_runs_no_code(run_dir, tmp_path, capsys):
    marker = tmp_path / "pwned"
    d = run_dir / "train" / "checkpoints"
    d.mkdir(parents=True)
    torch.save({"step": 1, "payload": _Payload(marker)}, d / "step-0000001.pt")
    os.symlink("step-0000001.pt", d / "last")
    assert train(run_dir, "--max-steps", "2") == 2
    assert not marker.exists()  # the payload never ran
    assert "cannot be loaded" in err(capsys)

    # the current format is tensors + JSON: nothing in it is ever executed, and junk is refused
    (d / "step-0000002.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00" + b"{" * 16)
    os.replace(d / "last", d / "old")
    os.symlink("step-0000002.safetensors", d / "last")
    assert train(run_dir, "--max-steps", "2") == 2
    assert "not a readable safetensors file" in err(capsys)


def test_checkpoint_state_round_trips_exactly():
    import random

    p = torch.nn.Parameter(torch.randn(3))
    opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.95))
    p.grad = torch.ones(3)
    opt.step()
    state = {
        "optimizer": opt.state_dict(),
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "metrics": {"loss": 1.5, "acc_k": [0.5, 0.25], "nan": float("nan")},
        "odd": {"$t": 1, 3: (1, 2)},
    }
    tensors, skeleton = ckpt.pack(state)
    back = ckpt.unpack(json.loads(json.dumps(skeleton)), tensors)
    assert back["python"] == state["python"] and isinstance(back["python"][1], tuple)
    assert back["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]
    assert torch.equal(back["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])
    assert back["odd"] == state["odd"] and math.isnan(back["metrics"]["nan"])


# ---------------------------------------------------------------- 2. NaN never reaches a head
def _poison_shard(cache, *, fix_checksum: bool) -> str:
    """Overwrite every aux_hidden value of shard 0 with bf16 NaN bytes (size unchanged)."""
    man = json.loads((cache / "manifest.json").read_text())
    shard = cache / man["shards"][0]["file"]
    data = bytearray(shard.read_bytes())
    n = struct.unpack("<Q", data[:8])[0]
    a, b = json.loads(data[8 : 8 + n])["aux_hidden"]["data_offsets"]
    data[8 + n + a : 8 + n + b] = b"\xc0\x7f" * ((b - a) // 2)
    shard.write_bytes(bytes(data))
    if fix_checksum:  # as if the cache had been written with NaN features: the checksum agrees
        from eagle3cli.run_folder.manifest import sha256_file

        man["shards"][0]["sha256"] = sha256_file(shard)
        (cache / "manifest.json").write_text(json.dumps(man))
    return shard.name


@pytest.mark.parametrize("fix_checksum", [False, True], ids=["bytes-flipped", "written-with-nan"])
def test_nan_bytes_in_a_shard_stop_train_naming_the_shard(run_dir, capsys, fix_checksum):
    name = _poison_shard(run_dir / "cache", fix_checksum=fix_checksum)
    assert train(run_dir, "--max-steps", "4", "--save-every", "1") == 2
    text = err(capsys)
    assert name in text
    assert ("sha256 does not match" in text) if not fix_checksum else ("non-finite" in text)
    assert not (run_dir / "head" / "model.safetensors").exists()  # no head was exported


def test_cache_verify_finds_nan_features_that_match_their_checksum(run_dir, tiny_target_dir, capsys):
    name = _poison_shard(run_dir / "cache", fix_checksum=True)
    assert main(["cache", "--verify", str(run_dir / "cache"), "--target", str(tiny_target_dir)]) == 2
    text = err(capsys)
    assert name in text and "non-finite" in text


def test_shard_checksums_are_verified_once_and_remembered(run_dir):
    from eagle3cli.cache.reader import VERIFIED_FILE, CacheReader

    r = CacheReader(run_dir / "cache")
    r[0]
    memo = json.loads((run_dir / "cache" / VERIFIED_FILE).read_text())
    assert set(memo) == {r.manifest["shards"][0]["file"]}
    calls = []
    import eagle3cli.cache.reader as reader_mod

    orig = reader_mod.sha256_file
    reader_mod.sha256_file = lambda p: calls.append(p) or orig(p)
    try:
        CacheReader(run_dir / "cache")[0]  # a new run: remembered by size+mtime, not hashed again
    finally:
        reader_mod.sha256_file = orig
    assert calls == []


def test_a_nan_loss_stops_training_with_step_and_batch(run_dir, monkeypatch):
    cfg = build_config(
        TrainConfig, None, "train", run=run_dir, max_steps=4, log_every=1, save_every=1, token_budget=640, ttt_steps=2
    )
    tr = loop.setup(cfg)
    real, calls = tr.loss_fn, []

    def nan_on_third(*a, **k):
        out = real(*a, **k)
        calls.append(1)
        if len(calls) == 3:
            out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(tr, "loss_fn", nan_on_third)
    with pytest.raises(StageError) as e:
        loop.fit(tr)
    msg = str(e.value)
    assert "the loss is nan at optimizer step 3" in msg and "shard-0000" in msg and "sample" in msg
    assert "step-0000002" in msg  # the last good checkpoint, which a rerun resumes from
    assert ckpt.latest(run_dir / "train").name == "step-0000002.safetensors"
    assert [m["step"] for m in metrics(run_dir)] == [1, 2]


def test_export_self_check_fails_on_nan(run_dir, monkeypatch):
    cfg = build_config(TrainConfig, None, "train", run=run_dir, max_steps=1, log_every=1, save_every=1, ttt_steps=1)
    tr = loop.setup(cfg)
    loop.fit(tr)
    monkeypatch.setattr(loop, "self_check", lambda *a: (float("nan"), 1e-4))
    with pytest.raises(StageError, match="reproduces the trained logits only to nan"):
        loop.finish(tr)


@pytest.fixture(scope="module")
def good_head(tiny_target_dir, tmp_path_factory):
    return export_head(tmp_path_factory.mktemp("rel-head") / "head", tiny_target_dir)


def test_eval_and_serve_refuse_a_head_with_nan(good_head, tmp_path, tiny_target_dir):
    head = copy_head(good_head, tmp_path / "head")
    w = load_head(head).state_dict()["midlayer.mlp.up_proj.weight"].clone()
    w[0, 0] = float("nan")
    edit_tensors(head, replace={"midlayer.mlp.up_proj.weight": w})
    with pytest.raises(StageError, match="non-finite values .* midlayer.mlp.up_proj.weight"):
        load_head(head)  # what eval loads heads with
    errs = [p for p in pf.check_head(head, tiny_target_dir) if p.is_error]
    assert len(errs) == 1 and "non-finite" in errs[0].what and "up_proj" in errs[0].what
    assert [p for p in pf.check_head(good_head, tiny_target_dir) if p.is_error] == []


# ---------------------------------------------------------------- 4. metrics survive a cut line
def test_a_cut_metrics_line_does_not_stop_the_resume(run_dir, capsys):
    assert train(run_dir, "--max-steps", "2", "--save-every", "2") == 0
    with open(run_dir / "train" / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 3, "epoch": 0, "lo')  # a write cut by a full disk or a kill
    assert train(run_dir, "--max-steps", "4", "--save-every", "2") == 0
    assert "resumed from step-0000002" in err(capsys)
    lines = (run_dir / "train" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3, 4]


def test_metrics_appends_are_all_or_nothing(tmp_path, monkeypatch):
    p = tmp_path / "metrics.jsonl"
    p.write_bytes(b'{"step": 1}\n{"step": 2, "lo')
    ckpt.append_metrics(p, {"step": 2})  # the cut line is cut off before appending
    assert p.read_text() == '{"step": 1}\n{"step": 2}\n'
    real_write = os.write

    def disk_full(fd, data):
        real_write(fd, bytes(data)[:5])  # half a line reaches the disk, then it is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt.os, "write", disk_full)
    with pytest.raises(OSError):
        ckpt.append_metrics(p, {"step": 3})
    assert p.read_text() == '{"step": 1}\n{"step": 2}\n'  # rolled back


def test_a_full_disk_during_training_exits_2_and_resumes(run_dir, monkeypatch, capsys):
    real, calls = ckpt.append_metrics, []

    def full_on_third(path, m):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, m)

    monkeypatch.setattr(ckpt, "append_metrics", full_on_third)
    assert train(run_dir, "--max-steps", "4", "--save-every", "2") == 2
    text = err(capsys)
    assert "no space left writing" in text and "metrics.jsonl" in text and "resumes" in text
    monkeypatch.setattr(ckpt, "append_metrics", real)
    assert train(run_dir, "--max-steps", "4", "--save-every", "2") == 0
    assert [m["step"] for m in metrics(run_dir)] == [1, 2, 3, 4]


# ---------------------------------------------------------------- 8. the same run, spelled differently
def test_resume_with_the_run_as_an_absolute_path(run_dir, monkeypatch, capsys):
    monkeypatch.chdir(run_dir.parent)
    assert main(["train", "--run", run_dir.name, *FAST, "--max-steps", "2", "--save-every", "2"]) == 0
    assert main(["train", "--run", str(run_dir.resolve()), *FAST, "--max-steps", "4", "--save-every", "2"]) == 0
    assert "resumed from step-0000002" in err(capsys)
    assert [m["step"] for m in metrics(run_dir)] == [1, 2, 3, 4]


def test_resume_with_other_settings_names_both_values(run_dir, capsys):
    assert train(run_dir, "--max-steps", "2", "--save-every", "2") == 0
    capsys.readouterr()
    assert train(run_dir, "--max-steps", "4", "--save-every", "2", "--lr", "1e-2") == 2
    text = err(capsys)
    assert "lr: checkpoint has 0.0003, this command 0.01" in text


# ---------------------------------------------------------------- 10. options validated
@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--min-lr-ratio", "-0.5"], "--min-lr-ratio -0.5: expected 0 <= r <= 1"),
        (["--weight-decay", "-1"], "--weight-decay -1.0: expected >= 0"),
        (["--grad-clip", "-1"], "--grad-clip -1.0: expected >= 0"),
        (["--keep-checkpoints", "-1"], "--keep-checkpoints -1: expected >= 0"),
        (["--lr", "nan"], "--lr nan: expected a finite number"),
        (["--target-dtype", "bf16"], "--target-dtype bf16: only --online runs the target"),
        (["RECIPE", "ttt_steps: 2.5"], "--ttt-steps 2.5: expected an integer"),
        (["RECIPE", "save_every: 10.0"], "--save-every 10.0: expected an integer"),
    ],
)
def test_bad_train_options_exit_2(run_dir, tmp_path, capsys, flags, expected):
    if flags[0] == "RECIPE":
        (tmp_path / "r.yaml").write_text("train:\n  " + flags[1] + "\n")
        flags = ["--recipe", str(tmp_path / "r.yaml")]
    assert main(["train", "--run", str(run_dir), *flags]) == 2
    assert expected in err(capsys)
    assert not (run_dir / "train").exists()


# ---------------------------------------------------------------- 12. a finished run stays finished
def test_rerunning_a_finished_train_keeps_its_head_and_metrics(run_dir, capsys):
    args = ["--max-steps", "2", "--save-every", "2"]
    assert train(run_dir, *args) == 0
    man = json.loads((run_dir / "train" / "manifest.json").read_text())
    head_cfg = (run_dir / "head" / "config.json").read_bytes()
    weights = (run_dir / "head" / "model.safetensors").stat().st_mtime_ns
    assert man["final_metrics"]["step"] == 2
    assert train(run_dir, *args) == 0
    assert "already finished at step 2" in err(capsys)
    assert json.loads((run_dir / "train" / "manifest.json").read_text()) == man
    assert (run_dir / "head" / "config.json").read_bytes() == head_cfg
    assert (run_dir / "head" / "model.safetensors").stat().st_mtime_ns == weights

    # a damaged head is re-exported from the last checkpoint, with the metrics that checkpoint holds
    (run_dir / "head" / "model.safetensors").write_bytes(b"junk")
    assert train(run_dir, *args) == 0
    again = json.loads((run_dir / "train" / "manifest.json").read_text())
    assert again["final_metrics"] == man["final_metrics"] != {}
    cfg = json.loads((run_dir / "head" / "config.json").read_text())
    assert cfg["eagle3"]["training"]["final_metrics"] == man["final_metrics"]


# ---------------------------------------------------------------- DeepSpeed's own checkpoint files
@pytest.mark.slow
def test_deepspeed_checkpoints_load_without_running_code(tmp_path, monkeypatch):
    """A single-process DeepSpeed engine (ZeRO-2, CPU): its checkpoint loads back through the
    weights-only loader, and a crafted optimizer file is refused without running its payload."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    import deepspeed

    deepspeed.init_distributed(dist_backend=None)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ds = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}, "bf16": {"enabled": False}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=ds, model_parameters=model.parameters())
    engine.backward(engine(torch.randn(1, 4)).sum())
    engine.step()
    engine.save_checkpoint(str(tmp_path / "ds"), tag="t")
    before = [p.detach().clone() for p in model.parameters()]
    ckpt.load_deepspeed(engine, tmp_path / "ds", "t")
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))

    marker = tmp_path / "pwned"
    (optim,) = (tmp_path / "ds" / "t").glob("*optim_states.pt")
    torch.save({"payload": _Payload(marker)}, optim)
    with pytest.raises(StageError, match="cannot be loaded"):
        ckpt.load_deepspeed(engine, tmp_path / "ds", "t")
    assert not marker.exists()


def test_eval_warns_when_the_head_was_trained_with_another_chat_template(good_head, tmp_path, tiny_target_dir, capsys):
    from types import SimpleNamespace

    from serve_helpers import edit_config

    from eagle3cli.eval.run import _load_heads
    from eagle3cli.model.target import load_target, target_identity

    head = copy_head(good_head, tmp_path / "head")
    target, tok, path = load_target(tiny_target_dir)
    ident = target_identity(path, tok)
    cfg = json.loads((head / "config.json").read_text())
    cfg["eagle3"]["target"] |= {"vocab_hash": ident.vocab_hash, "chat_template_hash": "0123456789abcdef"}
    edit_config(head, eagle3=cfg["eagle3"])
    _load_heads(SimpleNamespace(compare=(), cpu_kernels="onednn"), head, target, ident)
    assert "another chat template (0123456789ab" in " ".join(capsys.readouterr().err.split())
