"""EAGLE-3.1's two optional norms in the draft: `norm_before_fc` (one RMSNorm `input_norm` over the
concatenated aux features before fc) and `norm_before_residual` (the layer's residual is
hidden_norm(h), not h).

Off, the draft is the head it always was (a config without the keys, as every head written before
them has, builds the same parameters and the same outputs). On, `forward` equals a reference
written here by hand from vLLM's `llama_eagle3.py` semantics, and the TTT unroll's first step
equals `forward` (test_train_ttt.py proves every later step)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from tiny_configs import tiny_llama_config
from transformers import LlamaConfig

from eagle3cli.model import cpu_kernels
from eagle3cli.model.cpu_kernels import onednn_linear_available, pack_linears
from eagle3cli.speculate.draft import Eagle3Draft, draft_config_from_target

V, H, VD, T = 96, 32, 40, 9
AUX = (1, 3, 4)
FLAGS = [(False, False), (True, False), (False, True), (True, True)]


def target_config() -> LlamaConfig:
    return tiny_llama_config(V, layers=6, hidden=H)


def tiny_draft(fc: bool, residual: bool, seed: int = 0) -> Eagle3Draft:
    torch.manual_seed(seed)
    cfg = draft_config_from_target(target_config(), VD, AUX, norm_before_fc=fc, norm_before_residual=residual)
    draft = Eagle3Draft(cfg).double().eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in draft.parameters():  # non-trivial norm weights, so a misplaced norm shows
            if p.dim() == 1:
                p.copy_(torch.rand(p.shape, generator=g, dtype=p.dtype) + 0.5)
        draft.embed_tokens.weight.normal_(generator=g)
    return draft


def inputs(seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (1, T), generator=g)
    # features of very different scales per layer, as a target's are: input_norm must matter
    aux = torch.randn(1, T, len(AUX) * H, generator=g, dtype=torch.float64)
    aux = aux * torch.tensor([0.1, 3.0, 40.0], dtype=torch.float64).repeat_interleave(H)
    return ids, aux


# ---------------------------------------------------------------- reference, by hand
def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope_theta(cfg) -> float:
    rp = getattr(cfg, "rope_parameters", None) or {}
    return float(rp.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))


def reference_step0(draft: Eagle3Draft, ids: torch.Tensor, aux: torch.Tensor, fc: bool, residual: bool):
    """The draft layer over target features at positions 0..T-1 (causal), as vLLM computes it:
    combine_hidden_states (input_norm if norm_before_fc, then fc), then the first decoder layer
    (hidden_norm(g) into attention; residual hidden_norm(g) with norm_before_residual, else g)."""
    sd = {k: v.double() for k, v in draft.state_dict().items()}
    cfg = draft.config
    eps = float(cfg.rms_norm_eps)
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    d = H // nh
    x = aux[0]
    if fc:
        x = rms(x, sd["input_norm.weight"], eps)
    g = x @ sd["fc.weight"].T
    e = rms(sd["embed_tokens.weight"][ids[0]], sd["midlayer.input_layernorm.weight"], eps)
    gn = rms(g, sd["midlayer.hidden_norm.weight"], eps)
    res = gn if residual else g
    inp = torch.cat([e, gn], -1)
    p = "midlayer.self_attn."
    q = (inp @ sd[p + "q_proj.weight"].T).view(T, nh, d)
    k = (inp @ sd[p + "k_proj.weight"].T).view(T, nkv, d)
    v = (inp @ sd[p + "v_proj.weight"].T).view(T, nkv, d)
    inv = 1.0 / rope_theta(cfg) ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]

    def rot(t):
        return t * cos + torch.cat([-t[..., d // 2 :], t[..., : d // 2]], -1) * sin

    q, k = rot(q), rot(k)
    rep = nh // nkv
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(d)
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    att = torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(T, nh * d)
    h = res + att @ sd[p + "o_proj.weight"].T
    m = "midlayer.mlp."
    z = rms(h, sd["midlayer.post_attention_layernorm.weight"], eps)
    z = torch.nn.functional.silu(z @ sd[m + "gate_proj.weight"].T) * (z @ sd[m + "up_proj.weight"].T)
    return (h + z @ sd[m + "down_proj.weight"].T)[None]


# ---------------------------------------------------------------- tests
def test_flags_off_is_the_head_written_before_the_flags_existed():
    """A config without the keys (every head saved before them) and one with both false build the
    same parameters, with the same random draws, and give bit-identical outputs."""
    torch.manual_seed(0)
    old_cfg = draft_config_from_target(target_config(), VD, AUX)
    del old_cfg.norm_before_fc, old_cfg.norm_before_residual
    old = Eagle3Draft(old_cfg)
    torch.manual_seed(0)
    new = Eagle3Draft(draft_config_from_target(target_config(), VD, AUX, False, False))
    assert list(old.state_dict()) == list(new.state_dict())
    assert "input_norm.weight" not in new.state_dict()
    assert all(torch.equal(a, b) for a, b in zip(old.state_dict().values(), new.state_dict().values(), strict=True))
    ids, aux = inputs()
    with torch.no_grad():
        for a, b in zip(old.ttt_unroll(ids, aux.float(), 3), new.ttt_unroll(ids, aux.float(), 3), strict=True):
            assert torch.equal(a, b)
        ha = old(ids, aux.float(), old.new_cache(T + 4), 0, from_target=True)
        hb = new(ids, aux.float(), new.new_cache(T + 4), 0, from_target=True)
        assert torch.equal(ha, hb)


@pytest.mark.parametrize("fc,residual", FLAGS)
def test_forward_equals_the_reference_and_the_first_ttt_step(fc, residual):
    draft = tiny_draft(fc, residual)
    assert (draft.input_norm is not None) == fc
    assert draft.input_norm is None or draft.input_norm.weight.shape == (len(AUX) * H,)
    ids, aux = inputs()
    ref = reference_step0(draft, ids, aux, fc, residual)
    with torch.no_grad():
        out = draft(ids, aux, draft.new_cache(T + 4), 0, from_target=True)
        # TTT reads the token after each feature itself: hand it the sequence one token earlier
        earlier = torch.cat([torch.zeros_like(ids[:, :1]), ids], 1)
        step0 = next(draft.ttt_unroll(earlier, torch.cat([aux, aux[:, -1:]], 1), 1))[:, :T]
    # float64 throughout but for the rope tables (transformers makes them in float32) and the
    # unroll's softmax (float32): a misplaced norm differs by O(1), not 1e-7
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(step0, out, rtol=1e-5, atol=1e-6)


def test_each_flag_changes_the_output():
    """The reference agreeing is only worth something if the flags are not no-ops."""
    ids, aux = inputs()
    outs = {}
    with torch.no_grad():
        for fc, residual in FLAGS:
            draft = tiny_draft(fc, residual)
            outs[fc, residual] = draft(ids, aux, draft.new_cache(T + 4), 0, from_target=True)
    keys = list(outs)
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            assert not torch.allclose(outs[a], outs[b]), (a, b)


@pytest.mark.parametrize("fc,residual", FLAGS)
def test_draft_states_skip_input_norm_and_fc(fc, residual):
    """A later step reads the draft's own H-wide state: neither input_norm nor fc touches it."""
    draft = tiny_draft(fc, residual)
    ids, aux = inputs()
    with torch.no_grad():
        cache = draft.new_cache(T + 4)
        h0 = draft(ids, aux, cache, 0, from_target=True)
        h1 = draft(ids[:, -1:], h0[:, -1:], cache, T, from_target=False)
    assert h1.shape == (1, 1, H)
    assert torch.equal(draft.project(h0, from_target=False), h0)


@pytest.mark.skipif(not onednn_linear_available(), reason="this torch build has no oneDNN packed linear")
def test_packed_for_cpu_decoding_the_norms_still_apply(monkeypatch):
    """eval's CPU fast path (oneDNN-packed fc and fused projections) runs the same flagged layer."""
    monkeypatch.setattr(cpu_kernels, "MIN_PACK_ELEMENTS", 0)
    ids, aux = inputs()
    for fc, residual in FLAGS:
        plain = tiny_draft(fc, residual).float()
        packed = copy.deepcopy(plain)
        assert pack_linears(packed, keep_weight=True) > 0
        with torch.no_grad():
            want = plain(ids, aux.float(), plain.new_cache(T + 4), 0, from_target=True)
            got = packed(ids, aux.float(), packed.new_cache(T + 4), 0, from_target=True)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
