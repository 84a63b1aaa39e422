"""Draft vocab mapping (d2t/t2d round trip) and the storage codecs (fp8 per-token scales, top-k)."""

from __future__ import annotations

import pytest
import torch

from eagle3cli.cache import storage as S
from eagle3cli.cache.config import STORAGES
from eagle3cli.speculate import vocab as V


def test_d2t_t2d_round_trip():
    torch.manual_seed(0)
    target_vocab = 500
    ids = torch.randint(0, target_vocab, (4000,)) ** 2 % target_vocab  # skewed frequencies
    mask = torch.rand(4000) < 0.7
    counts = V.token_counts([(ids.tolist(), mask.tolist())], target_vocab)
    assert int(counts.sum()) == int(mask.sum())
    draft = V.select_draft_tokens(counts, 64)
    d2t, t2d = V.build_mapping(draft, target_vocab)
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert d2t.shape == (64,) and t2d.shape == (target_vocab,) and int(t2d.sum()) == 64
    # target id = draft id + d2t[draft id], and back.
    back = V.draft_to_target(torch.arange(64), d2t)
    assert torch.equal(back, draft) and bool(t2d[back].all())
    assert torch.equal(V.target_to_draft_index(d2t, t2d.numel())[back], torch.arange(64))
    outside = torch.nonzero(~t2d).flatten()
    assert bool((V.target_to_draft_index(d2t, t2d.numel())[outside] == -1).all())
    # The draft vocab is the 64 most frequent tokens: nothing outside is more frequent than inside.
    assert int(counts[~t2d].max()) <= int(counts[t2d].min())
    cov = V.coverage(counts, t2d)
    assert cov == pytest.approx(float(counts[t2d].sum() / counts.sum()))
    assert 0.0 < cov < 1.0


def test_small_corpus_still_fills_the_draft_vocab_deterministically():
    counts = torch.zeros(100, dtype=torch.int64)
    counts[[7, 50, 3]] = torch.tensor([5, 9, 5])
    draft = V.select_draft_tokens(counts, 6)
    # 50 (9), then 3 and 7 (5, ties by id), then unseen ids 0, 1, 2 — sorted ascending.
    assert draft.tolist() == [0, 1, 2, 3, 7, 50]
    assert V.coverage(counts, V.build_mapping(draft, 100)[1]) == 1.0


def test_fp8_per_token_scales_keep_quiet_tokens_and_layers():
    torch.manual_seed(0)
    x = torch.randn(16, 3, 64)
    x[0] *= 1e3  # an attention-sink-like loud token
    x[:, 0] *= 1e-3  # a quiet layer
    x = x.reshape(16, -1)
    q, scale = S.quantize_fp8(x, 3)
    assert q.dtype == S.FP8 and scale.shape == (16, 3)
    y = S.dequantize_fp8(q, scale)
    rel = (y - x).reshape(16, 3, 64).norm(dim=-1) / x.reshape(16, 3, 64).norm(dim=-1)
    assert float(rel.max()) < 0.05  # e4m3: ~3 mantissa bits, every token and layer alike


def test_topk_logprobs_match_full_softmax():
    torch.manual_seed(0)
    head = torch.nn.Linear(32, 300, bias=False)
    h = torch.randn(10, 32)
    ids, lps = S.topk_logprobs(h, head, 5, rows=3)
    ref_v, ref_i = torch.log_softmax(head(h), -1).topk(5, -1)
    assert torch.equal(ids, ref_i) and torch.allclose(lps, ref_v, atol=1e-6)


@pytest.mark.parametrize("storage", STORAGES)
def test_encode_decode_round_trip(storage):
    torch.manual_seed(0)
    head = torch.nn.Linear(64, 4096, bias=False)
    aux, last = torch.randn(20, 3 * 64), torch.randn(20, 64)
    enc = S.encode(storage, aux, last, 3, vocab_size=4096, logits_fn=head, topk=4)
    assert set(enc) == set(S.feature_keys(storage)) | set(S.OPTIONAL_KEYS[storage])
    dec = S.decode(storage, enc)
    if storage != "compact":  # the target's own argmax is stored, so training skips the full-vocab matmul
        assert torch.equal(dec["target_argmax"], head(last).argmax(-1))
    assert torch.allclose(dec["aux_hidden"], aux, rtol=0.07, atol=1e-3)
    if storage == "compact":
        assert "last_hidden" not in dec and dec["topk_ids"].dtype == torch.int64
        assert torch.equal(dec["topk_ids"], torch.log_softmax(head(last), -1).topk(4, -1).indices)
    else:
        assert torch.allclose(dec["last_hidden"], last, rtol=0.07, atol=1e-3)


def test_layout_sizes():
    # 8B-like target: H=4096, 128k vocab (int32 ids). compact <= 0.4x of the plain bf16 layout.
    bf16 = S.bf16_layout_bytes(4096, 128256)
    assert bf16 == 8 * 4096 + 4 + 1
    assert S.bytes_per_token("compact", 4096, 3, 128256, 8) / bf16 < 0.38
    assert S.bytes_per_token("fp8", 4096, 3, 128256, 8) / bf16 < 0.51
    # The tiny target (H=128, 4096 vocab, int16 ids) with the default top-4 also meets 0.4x.
    assert S.bytes_per_token("compact", 128, 3, 4096, 4) / S.bf16_layout_bytes(128, 4096) <= 0.4
