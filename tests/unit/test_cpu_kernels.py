"""oneDNN-packed linears for CPU decoding: same numbers as F.linear, rows independent of how many
share the product, and a packed target + head decoding exactly what packed plain decoding does."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from eagle3cli.model import cpu_kernels
from eagle3cli.model.cpu_kernels import (
    PackedLinear,
    is_packed,
    onednn_cannot_run,
    onednn_linear_available,
    pack_linears,
)
from eagle3cli.model.target import load_target
from eagle3cli.speculate.aux_layers import default_aux_layer_ids
from eagle3cli.speculate.decoder import SpeculativeDecoder, plain_decode
from eagle3cli.speculate.draft import Eagle3Draft, draft_config_from_target

pytestmark = pytest.mark.skipif(not onednn_linear_available(), reason="this torch build has no oneDNN")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_f_linear(dtype, bias):
    if onednn_cannot_run(dtype):  # bf16 without AVX-512 (or with EAGLE3_CPU_FEATURES=avx2)
        pytest.skip(onednn_cannot_run(dtype))
    torch.manual_seed(0)
    lin = nn.Linear(96, 160, bias=bias).to(dtype)
    packed = PackedLinear(lin.weight, lin.bias)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for shape in [(1, 1, 96), (1, 5, 96), (3, 7, 96), (4, 96)]:
        x = torch.randn(shape, dtype=dtype)
        torch.testing.assert_close(packed(x), lin(x), rtol=tol, atol=tol)
    with pytest.raises(TypeError, match="packed linear holds"):
        packed(torch.randn(1, 96, dtype=torch.float64))


def test_rows_do_not_depend_on_their_neighbours():
    """Row i of an n-row product equals row i computed alone, to fp32 rounding (bit-equal on the
    AVX-512 machine measured; kernels may block rows differently on other CPUs)."""
    torch.manual_seed(1)
    packed = PackedLinear(torch.randn(1536, 576), None)
    x = torch.randn(1, 16, 576)
    alone = torch.cat([packed(x[:, i : i + 1]) for i in range(16)], dim=1)
    for n in (2, 4, 9, 16):
        torch.testing.assert_close(packed(x[:, :n]), alone[:, :n], rtol=1e-6, atol=1e-5)


@pytest.fixture
def pack_everything(monkeypatch):
    """The tiny target's matrices are all under the size worth packing: pack them anyway, so the
    mechanics are tested on every kind of linear."""
    monkeypatch.setattr(cpu_kernels, "MIN_PACK_ELEMENTS", 0)


def test_pack_linears_replaces_every_linear_and_keeps_logits(tiny_target_dir, pack_everything):
    model, tok, _ = load_target(tiny_target_dir)
    ids = torch.tensor([tok("The quick brown fox")["input_ids"]])
    with torch.inference_mode():
        ref = model(input_ids=ids).logits
    n_linear = sum(type(m) is nn.Linear for m in model.modules())
    assert not is_packed(model)
    assert pack_linears(model) == n_linear > 0
    assert is_packed(model) and not any(type(m) is nn.Linear for m in model.modules())
    assert pack_linears(model) == 0  # idempotent: nothing left to pack
    with torch.inference_mode():
        torch.testing.assert_close(model(input_ids=ids).logits, ref, rtol=1e-4, atol=1e-4)


def test_small_matrices_stay_plain(tiny_target_dir):
    """A oneDNN call's overhead outweighs what a small matrix gains: only those of at least
    MIN_PACK_ELEMENTS are packed (the tiny target: its 4096 x 128 lm_head alone)."""
    model, _tok, _ = load_target(tiny_target_dir)
    big = [
        n
        for n, m in model.named_modules()
        if type(m) is nn.Linear and m.weight.numel() >= cpu_kernels.MIN_PACK_ELEMENTS
    ]
    assert pack_linears(model) == len(big) == 1
    assert isinstance(model.lm_head, PackedLinear) and is_packed(model)


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_packed_speculative_decoding_is_exact(tiny_target_dir, mode, pack_everything):
    model, tok, _ = load_target(tiny_target_dir)
    aux = default_aux_layer_ids(model.config.num_hidden_layers)
    torch.manual_seed(0)
    draft = Eagle3Draft(draft_config_from_target(model.config, model.config.vocab_size, aux)).eval()
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(model.get_input_embeddings().weight)
    pack_linears(model)
    assert pack_linears(draft, keep_weight=True) > 0
    assert draft.fc.weight.shape[1] == len(aux) * model.config.hidden_size  # readable: the cache fuses q/k/v
    for text in ["What is 12 times 7?", "Write a haiku about rain.", "List three colours."]:
        msgs = [{"role": "user", "content": text}]
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        prompt = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        ref = plain_decode(model, prompt, 24, set())
        dec = SpeculativeDecoder(model, draft, aux, mode=mode, depth=4, topk=3, num_draft_tokens=8)
        assert dec.generate(prompt, 24).tokens == ref.tokens, text
    # the head's fused projections are packed once, not per decoding session
    assert draft.fused_projections() is draft.fused_projections()
