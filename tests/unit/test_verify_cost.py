"""benchmarks/llama_cpp/verify_cost.py's arithmetic (issue 53's break-even tau): a round at chain length k
costs pass(k+1) + k draft steps (+ fc, + overhead) in decoded tokens; the draft's lower bound is read
from the target GGUF's shapes and weight bytes. No llama.cpp here."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.llama_cpp.verify_cost import BYTES_PER_WEIGHT, break_even, break_even_rows, weight_shares

gguf = pytest.importorskip("gguf")


def tiny_target(path, tied: bool, h: int = 64, inter: int = 128, heads: int = 4, kv: int = 2, vocab: int = 100):
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(1)
    w.add_embedding_length(h)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_tensor("token_embd.weight", np.zeros((vocab, h), np.float32))
    w.add_tensor("blk.0.ffn_up.weight", np.zeros((inter, h), np.float32))
    if not tied:
        w.add_tensor("output.weight", np.zeros((vocab, h), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("tied", [True, False])
def test_the_lower_bound_is_head_bytes_over_a_decoded_tokens_bytes(tmp_path, tied):
    path = tiny_target(tmp_path / "t.gguf", tied)
    s = weight_shares(path, draft_vocab=50, head_types=["bf16", "f32"])
    # a decoded token reads the layer and the lm_head: token_embd is the lm_head only when tied
    assert s["target_step_bytes"] == 4 * (128 * 64 + 100 * 64)
    h, kv_w = 64, 2 * 16
    layer = 2 * h * h + 2 * 2 * h * kv_w + h * h + 3 * h * 128
    assert s["draft_step_params"] == layer + 50 * h and s["fc_params"] == 3 * h * h
    f32 = s["per_type"]["f32"]
    assert f32["draft_step"] == round((layer + 50 * h) * 4 / s["target_step_bytes"], 4)
    assert s["per_type"]["bf16"]["draft_step"] == pytest.approx(f32["draft_step"] / 2, abs=1e-4)
    assert set(BYTES_PER_WEIGHT) >= {"f32", "bf16", "q8_0", "q4_k"}


def test_break_even_adds_the_pass_the_draft_steps_fc_and_overhead():
    v = {1: 1.0, 2: 1.07, 3: 1.28, 4: 1.29, 5: 1.5}
    assert break_even(v, 1, 0.1) == 1.17
    assert break_even(v, 3, 0.1, fc=0.02, overhead=0.05) == round(1.29 + 0.3 + 0.02 + 0.05, 2)


def test_measured_rounds_are_split_in_plain_server_steps():
    row = {"pass_vs_tg": {1: 1.0, 2: 1.2, 3: 1.4, 4: 1.6, 5: 1.8}, "pass_ms": {2: 24.0}}
    rounds = {"plain_server_ms_per_token": 20.0, "ks": {1: {"round_ms": 34.0, "draft_ms": 3.0, "tau": 1.4}}}
    shares = [{"draft_vocab": 16384, "per_type": {"bf16": {"draft_step": 0.05, "fc": 0.01}}}]
    measured, bound = break_even_rows(row, shares, rounds, [1])
    k1 = measured["per_k"][1]
    assert (k1["round"], k1["draft"], k1["verify"], k1["overhead"]) == (1.7, 0.15, 1.2, 0.35)
    assert k1["break_even_tau"] == 1.7
    assert bound["per_k"][1]["break_even_tau"] == round(1.2 + 0.05 + 0.01, 2)
    assert "no overhead" in bound["draft"] and "bf16" in bound["draft"] and "16384" in bound["draft"]
