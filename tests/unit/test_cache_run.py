"""`eagle3 cache` end to end on tiny random targets: features, masks, storage, verify, shards, refusals."""

from __future__ import annotations

import json
import random
import shutil

import pytest
import torch
from cache_fixtures import conversations, write_data_folder
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from eagle3cli.cache.config import CacheConfig
from eagle3cli.cache.masks import mask_conversation
from eagle3cli.cache.reader import CacheReader
from eagle3cli.cache.run import merge_cache, run_cache
from eagle3cli.cli import main
from eagle3cli.config import build_config
from eagle3cli.errors import UsageError
from eagle3cli.model.target import load_tokenizer

N = 14


@pytest.fixture(scope="module")
def deep_data(tmp_path_factory, deep_target_dir):
    return write_data_folder(tmp_path_factory.mktemp("deep") / "data", deep_target_dir, conversations(N))


def cache(data, out, target, **kw):
    cfg = build_config(
        CacheConfig,
        None,
        "cache",
        data=data,
        out=out,
        target=str(target),
        **{"shard_tokens": 700, "token_budget": 900, "max_length": 256, **kw},
    )
    return run_cache(cfg)


@pytest.fixture(scope="module")
def bf16_cache(tmp_path_factory, deep_data, deep_target_dir):
    return cache(deep_data, tmp_path_factory.mktemp("c") / "bf16", deep_target_dir)


@pytest.fixture(scope="module")
def deep_model(deep_target_dir):
    return AutoModelForCausalLM.from_pretrained(str(deep_target_dir), dtype=torch.float32).eval()


def test_cached_features_equal_a_fresh_forward(bf16_cache, deep_model, deep_target_dir):
    r = CacheReader(bf16_cache)
    assert r.aux_layer_ids == (2, 4, 5) and len(r) == N and r.storage == "bf16"
    assert len(r.manifest["shards"]) > 2  # batches and shards really were mixed
    tok = load_tokenizer(deep_target_dir)
    recs = conversations(N)
    for i in random.Random(0).sample(range(N), 5):
        s = r[i]
        assert set(s) == {"input_ids", "loss_mask", "aux_hidden", "last_hidden", "target_argmax"}
        # the stored argmax is the target's own next-token choice at every position
        assert torch.equal(s["target_argmax"], deep_model(s["input_ids"][None]).logits[0].argmax(-1))
        assert s["aux_hidden"].dtype == torch.float32 and s["aux_hidden"].shape == (r.lengths[i], 3 * 64)
        m = mask_conversation(tok, recs[i]["messages"], 256)
        assert s["input_ids"].tolist() == m.input_ids and s["loss_mask"].tolist() == m.loss_mask
        with torch.no_grad():
            out = deep_model(s["input_ids"][None], output_hidden_states=True)
        hs = [h[0] for h in out.hidden_states]
        for j, k in enumerate(r.aux_layer_ids):
            got = s["aux_hidden"][:, j * 64 : (j + 1) * 64]
            err = (got - hs[k]).norm() / hs[k].norm()
            assert err < 0.01, f"aux {k}: rel err {err}"
            # Exact indexing: the neighbouring hidden states are far away.
            for other in (k - 1, k + 1):
                assert (got - hs[other]).norm() / hs[other].norm() > 0.05
        logits = deep_model.lm_head(s["last_hidden"])
        assert (logits - out.logits[0]).abs().max() < 0.05 * out.logits.abs().max()
        # Same greedy token wherever the random target is not near a tie (bf16 rounding).
        top2 = out.logits[0].topk(2, -1).values
        clear = (top2[:, 0] - top2[:, 1]) > 0.02
        assert torch.equal(logits.argmax(-1)[clear], out.logits[0].argmax(-1)[clear])


def test_manifest_vocab_and_index(bf16_cache):
    r = CacheReader(bf16_cache)
    m = r.manifest
    assert m["stage"] == "cache" and m["storage"] == "bf16" and m["teacher"] == "last_hidden"
    assert m["counts"]["samples"] == N and m["counts"]["tokens"] == sum(r.lengths)
    assert m["draft_vocab_size"] == 4096  # 32000 requested, capped at the target vocab
    assert r.d2t.shape == (4096,) and r.t2d.shape == (4096,) and int(r.t2d.sum()) == 4096
    assert m["coverage"] == 1.0
    assert all(set(s) >= {"file", "bytes", "sha256", "samples", "tokens"} for s in m["shards"])
    assert m["bytes_per_token"]["bf16_layout"] == 2 * 4 * 64 + 3
    assert m["throughput"]["tokens_per_s"] > 0
    assert r.manifest["target"]["num_hidden_layers"] == 8


@pytest.mark.parametrize("storage", ["fp8", "compact"])
def test_compact_storages_approximate_bf16(tmp_path, deep_data, deep_target_dir, bf16_cache, deep_model, storage):
    out = cache(deep_data, tmp_path / storage, deep_target_dir, storage=storage, aux_layers="2,4,5", topk=4)
    r, ref = CacheReader(out), CacheReader(bf16_cache)
    assert len(r) == len(ref) and r.lengths == ref.lengths
    for i in range(0, N, 3):
        a, b = r[i], ref[i]
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["loss_mask"], b["loss_mask"])
        rel = (a["aux_hidden"] - b["aux_hidden"]).norm() / b["aux_hidden"].norm()
        assert rel < 0.06
        if storage == "compact":
            assert "last_hidden" not in a and a["topk_ids"].shape == (r.lengths[i], 4)
            with torch.no_grad():
                teacher = torch.log_softmax(deep_model(a["input_ids"][None]).logits[0], -1)
            # Stored entries are the teacher's log-probs at the stored ids, and they are its top 4.
            assert torch.allclose(a["topk_logprobs"], teacher.gather(-1, a["topk_ids"]), atol=0.01)
            assert torch.allclose(a["topk_logprobs"], teacher.topk(4, -1).values, atol=0.01)
    bpt = r.manifest["bytes_per_token"]
    ratio, bf16_measured = bpt["ratio_vs_bf16_layout"], ref.manifest["bytes_per_token"]["measured"]
    assert bpt["measured"] < bf16_measured * (0.56 if storage == "fp8" else 0.46)
    assert ratio == pytest.approx(bpt["measured"] / bpt["bf16_layout"], rel=1e-3)


def test_aux_layer_override_and_shard_processes_match_single_run(tmp_path, deep_data, deep_target_dir):
    single = cache(deep_data, tmp_path / "single", deep_target_dir, aux_layers="1,3,6", max_samples=9)
    parts = tmp_path / "parts"
    cache(deep_data, parts, deep_target_dir, aux_layers="1,3,6", max_samples=9, shard="1/2")
    assert not (parts / "manifest.json").exists()
    with pytest.raises(UsageError, match="not done yet"):
        merge_cache(parts)
    cache(deep_data, parts, deep_target_dir, aux_layers="1,3,6", max_samples=9, shard="0/2")  # the last one merges
    a, b = CacheReader(single), CacheReader(parts)
    assert a.aux_layer_ids == b.aux_layer_ids == (1, 3, 6)
    assert [s["sha256"] for s in a.manifest["shards"]] == [s["sha256"] for s in b.manifest["shards"]]
    assert torch.equal(a.d2t, b.d2t) and a.lengths == b.lengths


def test_small_draft_vocab_coverage(tmp_path, deep_data, deep_target_dir):
    out = cache(deep_data, tmp_path / "v", deep_target_dir, draft_vocab_size=64, max_samples=6)
    r = CacheReader(out)
    assert len(r) == 6 and r.d2t.shape == (64,) and 0 < r.manifest["coverage"] < 1
    counts = load_file(str(out / "vocab.safetensors"))["token_counts"]
    masked = torch.cat([r[i]["input_ids"][r[i]["loss_mask"]] for i in range(len(r))])
    assert torch.equal(counts, torch.bincount(masked, minlength=4096))
    assert r.manifest["coverage"] == pytest.approx(float(r.t2d[masked].float().mean()))


def test_verify_passes_then_detects_corruption(tmp_path, bf16_cache, deep_data, deep_target_dir, capsys):
    copy = tmp_path / "cache"
    shutil.copytree(bf16_cache, copy)
    assert main(["cache", "--verify", str(copy)]) == 0
    shard = copy / "shard-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["cache", "--verify", str(copy)]) == 2
    err = capsys.readouterr().err
    assert "shard-00001.safetensors: checksum mismatch" in err and "rm " in err and "eagle3 cache" in err
    assert "Traceback" not in err
    # The fix it names: remove the shard, rerun the same command; only that shard is recomputed.
    before = {f.name: f.stat().st_mtime_ns for f in copy.glob("shard-*")}
    shard.unlink()
    cache(deep_data, copy, deep_target_dir)
    after = {f.name: f.stat().st_mtime_ns for f in copy.glob("shard-*")}
    assert [n for n in after if after[n] != before[n]] == ["shard-00001.safetensors"]
    assert main(["cache", "--verify", str(copy)]) == 0


def test_verify_detects_another_target(bf16_cache, tiny_target_dir, capsys):
    assert main(["cache", "--verify", str(bf16_cache), "--target", str(tiny_target_dir)]) == 2
    err = capsys.readouterr().err
    assert "does not match" in err and "fingerprint" in err and "num_hidden_layers" in err


def test_data_from_another_target_is_refused(tmp_path, deep_data, tiny_target_dir, capsys):
    assert (
        main(["cache", "--data", str(deep_data), "--out", str(tmp_path / "c"), "--target", str(tiny_target_dir)]) == 2
    )
    err = " ".join(capsys.readouterr().err.split())  # rich wraps at 80 columns, where the tmp path ends
    assert "does not match" in err and "fingerprint" in err
    assert not (tmp_path / "c").exists()


def test_resume_with_other_settings_is_refused(tmp_path, deep_data, deep_target_dir):
    out = cache(deep_data, tmp_path / "c", deep_target_dir, max_samples=4)
    with pytest.raises(UsageError, match="other settings.*storage"):
        cache(deep_data, out, deep_target_dir, max_samples=4, storage="fp8")


def test_disk_estimate_refuses_when_it_does_not_fit(tmp_path, deep_data, deep_target_dir, monkeypatch):
    import eagle3cli.cache.run as R

    monkeypatch.setattr(R.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(UsageError, match=r"needs about [0-9.,]+ [KMG]iB more but .* has 1,000 B free"):
        cache(deep_data, tmp_path / "c", deep_target_dir)
    assert not list((tmp_path / "c").glob("shard-*"))


def test_bad_flags_exit_2(tmp_path, deep_data, capsys):
    assert (
        main(
            [
                "cache",
                "--data",
                str(deep_data),
                "--out",
                str(tmp_path),
                "--shard",
                "3/2",
                "--aux-layers",
                "x",
                "--topk",
                "0",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "--topk" in err and "--shard" in err and "--aux-layers" in err  # all at once
    assert main(["cache", "--data", str(deep_data), "--out", str(tmp_path), "--storage", "int4"]) == 2
    assert "'int4' is not one of" in " ".join(capsys.readouterr().err.split())


def test_broken_data_line_is_named(tmp_path, deep_target_dir, capsys):
    d = write_data_folder(tmp_path / "data", deep_target_dir, conversations(3))
    p = d / "shard-00000.jsonl"
    p.write_text(p.read_text() + json.dumps({"id": "x", "messages": [{"role": "bot", "content": "?"}]}) + "\n")
    assert main(["cache", "--data", str(d), "--out", str(tmp_path / "c")]) == 2
    assert "damaged" in capsys.readouterr().err  # the data checksum catches the edit first


def test_tiny_recipe_loads_into_the_config():
    from pathlib import Path

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "tiny" / "cache.yaml"
    cfg = build_config(CacheConfig, recipe, "cache", run=Path("runs/demo"), storage="fp8")
    assert cfg.storage == "fp8" and cfg.max_length == 512 and cfg.out_dir == Path("runs/demo/cache")
