"""A target split over N CPU processes (gloo) by transformers' tensor-parallel plan
(`--tensor-parallel-size N`): `eagle3 cache` on the hf route writes the unsharded cache, and resumes
after a kill -9; heads that N cannot split, and bad sizes, exit 2 before any process starts;
`train --online` over 2 ranks tracks one process (the last two: the slow tier)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cache_fixtures import conversations, write_data_folder
from cli_helpers import err, wide_console  # noqa: F401
from train_fixtures import eagle3, metrics, write_data

from eagle3cli.cache.reader import CacheReader
from eagle3cli.cli import main
from eagle3cli.errors import UsageError
from eagle3cli.model.sharded import check_shardable
from eagle3cli.run_folder.manifest import read_json

REPO = Path(__file__).resolve().parents[2]
FLAGS = ["--shard-tokens", "700", "--token-budget", "2048", "--max-length", "256", "--dtype", "fp32"]


@pytest.fixture(scope="module")
def data(tmp_path_factory, deep_target_dir):
    return write_data_folder(tmp_path_factory.mktemp("sharded") / "data", deep_target_dir, conversations(8))


def cache(data, out, target, *flags) -> int:
    return main(["cache", "--data", str(data), "--out", str(out), "--target", str(target), *FLAGS, *flags])


def same_cache(one: Path, two: Path) -> None:
    """The same manifest, shards and tokens; the stored (bf16) states equal up to bf16's rounding of
    fp32 sums taken in another order (the fp32 states themselves: `test_split_states_...`)."""
    a, b = read_json(one / "manifest.json"), read_json(two / "manifest.json")
    for key in ("settings_hash", "counts", "aux_layer_ids", "coverage", "storage", "target"):
        assert a[key] == b[key], key
    assert [s["file"] for s in a["shards"]] == [s["file"] for s in b["shards"]]
    ra, rb = CacheReader(one), CacheReader(two)
    for i in range(len(ra)):
        x, y = ra[i], rb[i]
        assert x.keys() == y.keys()
        for k in x:
            if not x[k].is_floating_point():
                assert torch.equal(x[k], y[k]), k
                continue
            # per token, within bf16's own rounding (2^-8 relative), and equal almost everywhere
            per_token = (x[k] - y[k]).norm(dim=-1) / x[k].norm(dim=-1).clamp_min(1e-30)
            assert per_token.max() <= 2**-8, k
            assert (x[k] != y[k]).float().mean() < 0.01, k


@pytest.fixture(scope="module")
def whole_cache(tmp_path_factory, data, deep_target_dir):
    out = tmp_path_factory.mktemp("whole") / "cache"
    assert cache(data, out, deep_target_dir) == 0
    return out


def test_two_ranks_write_the_unsharded_cache(tmp_path, data, deep_target_dir, whole_cache):
    two = tmp_path / "two"
    assert cache(data, two, deep_target_dir, "--tensor-parallel-size", "2") == 0
    same_cache(whole_cache, two)


def test_split_states_equal_the_unsharded_ones_in_fp32(tmp_path, deep_target_dir):
    """The features the cache stores, in fp32 before storage: aux states, final states and the teacher
    logits of a 2-rank split target against the whole one, within 1e-5 relative."""
    out = tmp_path / "err.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    r = subprocess.run(
        [*cmd, str(REPO / "tests" / "sharded_states.py"), str(deep_target_dir), str(out)],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    errors = json.loads(out.read_text())
    assert set(errors) == {"aux", "last", "logits"} and max(errors.values()) <= 1e-5, errors


def test_heads_the_ranks_cannot_split_are_refused_before_any_rank_starts(tmp_path, capsys):
    """A SmolLM2-shaped target (9 heads, 3 KV heads) loads under 2 ranks and then fails in its forward."""
    from conftest import build_random_target

    odd = build_random_target(tmp_path / "odd", num_layers=4, hidden=72, heads=9, kv_heads=3)
    data = write_data_folder(tmp_path / "data", odd, conversations(2))
    assert cache(data, tmp_path / "c", odd, "--tensor-parallel-size", "2") == 2
    text = err(capsys)
    assert "9 attention heads and 3 KV heads" in text and "--tensor-parallel-size 3" in text, text
    assert not (tmp_path / "c").exists()
    with pytest.raises(UsageError, match="divides both head counts: 3\n"):
        check_shardable(odd, 4)


def test_train_refuses_heads_the_ranks_cannot_split_before_launching(tmp_path, capsys):
    from conftest import build_random_target

    odd = build_random_target(tmp_path / "odd", num_layers=4, hidden=72, heads=9, kv_heads=3)
    run = tmp_path / "run"
    write_data(run, odd, 4)
    argv = ["train", "--run", str(run), "--online", "--deepspeed", "zero2", "--nproc", "2"]
    assert main([*argv, "--tensor-parallel-size", "2"]) == 2
    assert "9 attention heads and 3 KV heads" in err(capsys)
    assert not (run / "train" / "launch.yaml").exists()  # nothing was launched
    assert main([*argv, "--nproc", "3", "--tensor-parallel-size", "2"]) == 2
    assert "give as many: --deepspeed zero2 --nproc 2" in err(capsys)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--tensor-parallel-size", "0"], "--tensor-parallel-size 0"),
        (["--tensor-parallel-size", "2", "--device", "cuda:1"], "rank i runs on"),
        (["--tensor-parallel-size", "two"], "Invalid value for '--tensor-parallel-size'"),
    ],
)
def test_bad_sizes_exit_2(tmp_path, data, deep_target_dir, capsys, flags, says):
    assert cache(data, tmp_path / "c", deep_target_dir, *flags) == 2
    assert says in err(capsys)
    assert not (tmp_path / "c").exists()


@pytest.mark.slow
def test_a_killed_split_cache_resumes(tmp_path, data, deep_target_dir):
    """kill -9 of the launcher and both ranks after the first shard: the rerun keeps it, computes the
    rest, and the cache is the unsharded one."""
    out = tmp_path / "c"
    argv = ["cache", "--data", data, "--out", out, "--target", deep_target_dir, *FLAGS, "--shard-tokens", "200"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    log = (tmp_path / "first.log").open("wb")
    p = subprocess.Popen(
        [sys.executable, "-m", "eagle3cli", *map(str, argv), "--tensor-parallel-size", "2"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    deadline = time.time() + 300
    while time.time() < deadline and p.poll() is None and not list(out.glob(".shard-*.json")):
        time.sleep(0.02)
    assert p.poll() is None, "the run ended before it could be killed"
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    kept = sorted(out.glob(".shard-*.json"))
    assert kept and not (out / "manifest.json").exists()
    first = {f.name: f.read_bytes() for f in kept}
    r = eagle3(*argv, "--tensor-parallel-size", "2")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert all((out / name).read_bytes() == body for name, body in first.items())  # kept, not redone
    rebuilt = tmp_path / "whole"
    assert cache(data, rebuilt, deep_target_dir, "--shard-tokens", "200") == 0  # one process, the whole target
    same_cache(rebuilt, out)


@pytest.mark.slow
def test_train_online_over_two_split_ranks_tracks_one_process(tmp_path, deep_target_dir):
    """2 ranks x 1 micro-batch, the target split over them (each forward runs both ranks' rows) against
    1 process x 2 accumulated micro-batches with the whole target: the same batches, so the same losses
    up to rounding; the head exported from the safetensors' embedding and lm_head alike."""
    single, split = tmp_path / "single", tmp_path / "split"
    for run in (single, split):
        write_data(run, deep_target_dir, 24)
    common = ["--online", "--target", str(deep_target_dir), "--max-steps", "3", "--log-every", "1",
              "--save-every", "3", "--ttt-steps", "3", "--token-budget", "640", "--max-length", "160",
              "--draft-vocab-size", "300", "--heldout-samples", "4"]  # fmt: skip
    r = eagle3("train", "--run", single, "--grad-accum", "2", *common)
    assert r.returncode == 0, r.stderr[-3000:]
    ds = ["--deepspeed", "zero2", "--nproc", "2", "--tensor-parallel-size", "2"]
    r = eagle3("train", "--run", split, *ds, *common, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    a, b = metrics(single), metrics(split)
    assert [m["step"] for m in a] == [m["step"] for m in b] == [1, 2, 3]
    for x, y in zip(a, b, strict=True):
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-4)
        assert y["tokens"] == x["tokens"]
