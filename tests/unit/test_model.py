"""Target aux capture and the draft model's two execution paths."""

from __future__ import annotations

import torch
from tiny_configs import tiny_llama_config
from transformers import LlamaForCausalLM

from eagle3cli.speculate.aux_layers import default_aux_layer_ids
from eagle3cli.speculate.draft import Eagle3Draft, draft_config_from_target
from eagle3cli.speculate.target import capture_features


def _target(layers=8):
    torch.manual_seed(0)
    cfg = tiny_llama_config(120, layers=layers, max_positions=2048)  # transformers' default
    return LlamaForCausalLM(cfg).eval()


def test_capture_matches_output_hidden_states_indexing():
    m = _target()
    ids = default_aux_layer_ids(8)
    assert ids == (2, 4, 5)
    x = torch.randint(0, 120, (2, 11))
    aux, last = capture_features(m, x, None, ids)
    hs = m(x, output_hidden_states=True).hidden_states
    assert torch.equal(aux, torch.cat([hs[2], hs[4], hs[5]], dim=-1))
    assert torch.equal(last, hs[-1])
    assert torch.allclose(m.lm_head(last), m(x).logits, atol=1e-6)


def test_ttt_unroll_equals_chained_incremental_drafting():
    """Training-time test must see exactly what chain drafting at inference sees: step 0 over the
    prefix, then the decoder's draft step (`forward` into the position-indexed cache) chained."""
    m = _target()
    cfg = draft_config_from_target(m.config, 60, (2, 4, 5))
    torch.manual_seed(1)
    d = Eagle3Draft(cfg).eval()
    T, K = 10, 4
    x = torch.randint(0, 120, (1, T))
    aux = torch.randn(1, T, 96)
    with torch.no_grad():
        steps = list(d.ttt_unroll(x, aux, K))
        for t in range(T - K):
            cache = d.new_cache(T + K)
            h = d(x[:, 1 : t + 2], aux[:, : t + 1], cache, 0, from_target=True)
            torch.testing.assert_close(h[0, t], steps[0][0, t], atol=1e-5, rtol=1e-5)
            last = h[:, -1:]
            for k in range(1, K):
                last = d(x[:, t + 1 + k : t + 2 + k], last, cache, t + k, from_target=False)
                torch.testing.assert_close(last[0, 0], steps[k][0, t], atol=1e-5, rtol=1e-5)


def test_draft_parameter_names_are_sglangs():
    cfg = draft_config_from_target(_target().config, 60, (2, 4, 5))
    names = set(Eagle3Draft(cfg).state_dict())
    for n in [
        "fc.weight",
        "midlayer.self_attn.q_proj.weight",
        "midlayer.self_attn.k_proj.weight",
        "midlayer.self_attn.v_proj.weight",
        "midlayer.self_attn.o_proj.weight",
        "midlayer.mlp.gate_proj.weight",
        "midlayer.mlp.up_proj.weight",
        "midlayer.mlp.down_proj.weight",
        "midlayer.input_layernorm.weight",
        "midlayer.hidden_norm.weight",
        "midlayer.post_attention_layernorm.weight",
        "norm.weight",
        "lm_head.weight",
        "d2t",
        "t2d",
    ]:
        assert n in names, n
    d = Eagle3Draft(cfg)
    assert d.midlayer.self_attn.q_proj.in_features == 2 * 32 and d.fc.in_features == 3 * 32
    assert d.lm_head.out_features == 60 and not d.embed_tokens.weight.requires_grad
