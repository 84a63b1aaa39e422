"""`eagle3 cache --tensor-parallel-size N` on the hf route: the target split over N CPU processes
(gloo) by transformers' tensor-parallel plan writes the unsharded cache; heads that N cannot split,
and bad sizes, exit 2 before any process starts. (The 2-rank `train --online` is the slow tier's.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cache_fixtures import conversations, write_data_folder
from cli_helpers import err, wide_console  # noqa: F401

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


def test_two_ranks_write_the_unsharded_cache(tmp_path, data, deep_target_dir):
    """The same manifest, shards and tokens; the stored (bf16) states equal up to bf16's rounding of
    fp32 sums taken in another order (the fp32 states themselves: the next test)."""
    one, two = tmp_path / "one", tmp_path / "two"
    assert cache(data, one, deep_target_dir) == 0
    assert cache(data, two, deep_target_dir, "--tensor-parallel-size", "2") == 0
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
