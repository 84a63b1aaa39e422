"""Sliding-window targets: the speculative decoder stays exact past the window.

Tiny random configs of the families that use sliding-window attention (Mistral: every layer;
Gemma-2, Gemma-3, gpt-oss, Qwen3 with sliding layers: mixed, so the model takes a
{layer_type: mask} dict), a prompt longer than the window, and greedy chain and tree output
compared token for token with transformers' `generate` (whose sliding caches drop old keys).
The oracle head agrees at varying ranks, so trees accept through later siblings and the
accepted path is moved inside the KV cache; a random head almost never agrees.
"""

from __future__ import annotations

import pytest
import torch
from draft_stubs import OracleDraft
from transformers import LlamaConfig

from eagle3cli.speculate.aux_layers import default_aux_layer_ids
from eagle3cli.speculate.decoder import SpeculativeDecoder, hf_generate, plain_decode
from eagle3cli.speculate.draft import Eagle3Draft, draft_config_from_target
from eagle3cli.speculate.target_kv import TargetKV

WINDOW, VOCAB, HIDDEN = 6, 96, 32
COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)


def _mistral():
    from transformers import MistralConfig, MistralForCausalLM

    return MistralForCausalLM(MistralConfig(**COMMON, num_hidden_layers=4, sliding_window=WINDOW))


def _gemma2():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    cfg = Gemma2Config(**COMMON, num_hidden_layers=4, head_dim=8, sliding_window=WINDOW, query_pre_attn_scalar=8)
    return Gemma2ForCausalLM(cfg)


def _gemma3():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(
        **COMMON,
        num_hidden_layers=4,
        head_dim=8,
        sliding_window=WINDOW,
        query_pre_attn_scalar=8,
        sliding_window_pattern=2,
    )
    return Gemma3ForCausalLM(cfg)


def _gpt_oss():
    from transformers import GptOssConfig, GptOssForCausalLM

    cfg = GptOssConfig(
        **COMMON, num_hidden_layers=4, head_dim=8, sliding_window=WINDOW, num_local_experts=4, num_experts_per_tok=2
    )
    return GptOssForCausalLM(cfg)


def _qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        **COMMON, num_hidden_layers=4, head_dim=8, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2
    )
    return Qwen3ForCausalLM(cfg)


FAMILIES = {"mistral": _mistral, "gemma2": _gemma2, "gemma3": _gemma3, "gpt_oss": _gpt_oss, "qwen3": _qwen3}


def _build(name):
    torch.manual_seed(0)
    model = FAMILIES[name]().eval()
    with torch.no_grad():  # peaky logits: a random model's greedy text then has few near-ties
        model.lm_head.weight.mul_(8)
    return model


def _random_head(model, aux):
    """A random Llama-style head over the target's vocab (drafting only needs its shapes)."""
    cfg = LlamaConfig(**COMMON, num_hidden_layers=len(model.model.layers))
    torch.manual_seed(1)
    d = Eagle3Draft(draft_config_from_target(cfg, VOCAB, aux)).eval()
    with torch.no_grad():
        d.embed_tokens.weight.copy_(model.get_input_embeddings().weight)
    return d


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_chain_and_tree_exact_past_the_window(family):
    model = _build(family)
    kv = TargetKV(model, 8)
    windows = set(kv.windows.values())
    assert WINDOW in windows, kv.windows  # the test really exercises a sliding layer
    if family != "mistral":
        assert None in kv.windows or len(kv.windows) > 1  # mixed layers: a {layer_type: mask} dict
    aux = default_aux_layer_ids(len(model.model.layers))
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(3, VOCAB, (3 * WINDOW,), generator=g).tolist()
    n_new = 4 * WINDOW
    ref = hf_generate(model, prompt, n_new, set(), 0)
    assert len(ref.tokens) == n_new
    assert plain_decode(model, prompt, n_new, set()).tokens == ref.tokens
    oracle = OracleDraft(prompt + ref.tokens, VOCAB, rank=lambda t: (t * 5) % 3 or None)
    for draft in (_random_head(model, aux), oracle):
        for mode in ("chain", "tree"):
            dec = SpeculativeDecoder(model, draft, aux, mode=mode, depth=4, topk=3, num_draft_tokens=8)
            out = dec.generate(prompt, n_new)
            assert out.tokens == ref.tokens, (family, mode, type(draft).__name__)
    assert sum(out.accept_lens) > 0  # the oracle's tree accepted drafts past the window


def test_attention_mask_window_on_positions():
    """Sliding windows apply to rope positions: a tree node sees what its path would see as a
    plain sequence (prefix keys within the window, its ancestors, itself)."""
    from eagle3cli.speculate import attention_mask, tree_attention_mask, tree_position_ids

    start, window = 10, 4
    parents = torch.tensor([-1, -1, 0, 2])  # root -> n0 -> n2 -> n3, and root -> n1
    q = tree_position_ids(torch.tensor([1, 1, 2, 3]), start)
    keys = torch.cat([torch.arange(start), q])
    m = attention_mask(q, keys, start, tree_attention_mask(parents), window)
    seen = [sorted(int(keys[j]) for j in range(len(keys)) if m[i, j]) for i in range(len(q))]
    assert seen[0] == [7, 8, 9, 10]  # the root (position 10): the last 3 prefix keys and itself
    assert seen[4] == [10, 11, 12, 13]  # n3 at 13: root, n0, n2, itself; no prefix key survives
    assert not m[2, start + 1]  # n1 does not see its sibling n0
    chain = attention_mask(torch.arange(start, start + 3), torch.arange(start + 3), start, None, window)
    assert chain.sum(1).tolist() == [4, 4, 4]


def test_unsupported_layer_types_are_refused_with_the_next_step():
    """The wing refuses with its own `Unsupported` (it knows no exit codes or commands); eval turns
    it into exit 2 with the next step, a running engine."""
    from transformers import LlamaForCausalLM

    from eagle3cli.errors import UsageError
    from eagle3cli.eval.run import unsupported_target
    from eagle3cli.speculate import Unsupported

    cfg = LlamaConfig(**COMMON, num_hidden_layers=2)
    cfg.layer_types = ["chunked_attention", "full_attention"]
    cfg.attention_chunk_size = 4
    with pytest.raises(Unsupported) as e:
        TargetKV(LlamaForCausalLM(cfg), 8)
    assert "chunked_attention" in str(e.value) and not isinstance(e.value, UsageError)
    usage = unsupported_target(e.value)
    assert usage.exit_code == 2 and "chunked_attention" in usage.render() and "--endpoint" in usage.render()


def test_bf16_target_with_an_fp32_head_differs_only_at_rounding_ties():
    """The CPU-speed configuration: a bf16 target (verification passes ride on AMX) with the head
    in fp32 (the target's bf16 aux features are cast for fc). A bf16 pass over n tokens need not
    round like n one-token passes, so greedy output may part from plain bf16 decoding, but only
    where the target's two best logits are within a few bf16 steps of each other."""
    model = _build("qwen3").to(torch.bfloat16)
    aux = default_aux_layer_ids(len(model.model.layers))
    head = _random_head(model, aux)
    assert head.fc.weight.dtype == torch.float32
    same = 0
    for seed in range(3):
        prompt = torch.randint(3, VOCAB, (3 * WINDOW,), generator=torch.Generator().manual_seed(seed)).tolist()
        ref = plain_decode(model, prompt, 20, set())
        oracle = OracleDraft(prompt + ref.tokens, VOCAB, rank=lambda t: (t * 5) % 3 or None)
        for draft in (head, oracle):
            for mode in ("chain", "tree"):
                dec = SpeculativeDecoder(model, draft, aux, mode=mode, depth=4, topk=3, num_draft_tokens=8)
                out = dec.generate(prompt, 20).tokens
                if out == ref.tokens:
                    same += 1
                    continue
                j = next(i for i, (x, y) in enumerate(zip(out, ref.tokens)) if x != y)
                with torch.no_grad():
                    logits = model(torch.tensor([prompt + ref.tokens[:j]])).logits[0, -1].float()
                top = logits.max()
                step = 2.0 ** (torch.floor(torch.log2(top.abs())) - 7)  # one bf16 step at that magnitude
                assert top - logits[out[j]] <= 4 * step, (seed, mode, j)
    assert same >= 6  # most runs are identical (here 8 of 12)
