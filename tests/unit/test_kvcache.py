"""GrowingLayer behaves exactly like transformers' DynamicLayer (same logits through prefill,
decode, crop and batch selection) while writing each token once."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from eagle3cli.model.kvcache import GrowingLayer, growing_cache


def _run(model, cache, ids):
    outs = [model(input_ids=ids[:, :10], cache=cache, use_cache=True).logits]
    for t in range(10, 14):  # decode four tokens, then drop two (a rejected speculation)
        outs.append(model(input_ids=ids[:, t : t + 1], cache=cache, use_cache=True).logits)
    cache.crop(-2)
    outs.append(model(input_ids=ids[:, 12:15], cache=cache, use_cache=True).logits)
    cache.batch_select_indices(torch.tensor([2, 0]))  # rows leave the batch (finished answers)
    outs.append(model(input_ids=ids[[2, 0], 15:16], cache=cache, use_cache=True).logits)
    return outs, cache.get_seq_length()


@torch.inference_mode()
def test_growing_cache_matches_dynamic_cache(tiny_target_dir):
    model = AutoModelForCausalLM.from_pretrained(str(tiny_target_dir)).eval()
    ids = torch.randint(5, 200, (3, 16), generator=torch.Generator().manual_seed(0))
    cache = growing_cache(model.config)
    assert all(isinstance(layer, GrowingLayer) for layer in cache.layers)
    ref, ref_len = _run(model, DynamicCache(config=model.config), ids)
    got, got_len = _run(model, cache, ids)
    assert got_len == ref_len == 16
    for a, b in zip(ref, got, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    # a token is written once: the buffer grew by doubling, never once per token
    assert cache.layers[0]._buf_k.shape[-2] >= 16 and cache.layers[0].keys.shape[-2] == 16
