"""GGUF -> plain transformers folder (the real-target recipe's first step), on a small GGUF file
written here with the gguf package: same weights, same greedy output, a no-op when done."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from eagle3cli.engines.gguf import STAMP, convert_gguf
from eagle3cli.errors import UsageError

gguf = pytest.importorskip("gguf")
TOK_DIR = Path(__file__).resolve().parents[2] / "models" / "tiny-target"


def write_tiny_gguf(path: Path, seed: int = 0, layers: int = 2, hidden: int = 64, heads: int = 4, kv: int = 2) -> Path:
    """A 2-layer Llama with tied embeddings in F32 GGUF, with the tiny target's BPE tokenizer and
    ChatML template (what llama.cpp's converter would write for such a model)."""
    t = json.loads((TOK_DIR / "tokenizer.json").read_text())
    vocab = t["model"]["vocab"]
    tokens = [""] * len(vocab)
    for s, i in vocab.items():
        tokens[i] = s
    special = {a["id"] for a in t["added_tokens"]}
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_context_length(512)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(2 * hidden)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if i in special else 1 for i in range(len(tokens))])
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in t["model"]["merges"]])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_chat_template((TOK_DIR / "chat_template.jinja").read_text())

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    head_dim = hidden // heads
    w.add_tensor("token_embd.weight", rand(len(tokens), hidden))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", rand(hidden, hidden))
        w.add_tensor(f"blk.{i}.attn_k.weight", rand(kv * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_v.weight", rand(kv * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_output.weight", rand(hidden, hidden))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", rand(2 * hidden, hidden))
        w.add_tensor(f"blk.{i}.ffn_up.weight", rand(2 * hidden, hidden))
        w.add_tensor(f"blk.{i}.ffn_down.weight", rand(hidden, 2 * hidden))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_conversion_is_exact_and_idempotent(tmp_path):
    from transformers import AutoModelForCausalLM

    src = write_tiny_gguf(tmp_path / "tiny.gguf")
    out = tmp_path / "model"
    report = convert_gguf(src, out, max_new_tokens=8)
    assert not report.skipped and len(report.checks) == 3 and all(c["equal"] for c in report.checks)
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["tie_word_embeddings"] and cfg["num_hidden_layers"] == 2
    plain = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    ref = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32).eval()
    for name, t in ref.state_dict().items():
        assert torch.equal(plain.state_dict()[name], t), name  # fp32: the dequantized weights, bit for bit
    assert plain.lm_head.weight.data_ptr() == plain.model.embed_tokens.weight.data_ptr()  # re-tied on load

    mtime = (out / "model.safetensors").stat().st_mtime_ns
    again = convert_gguf(src, out, max_new_tokens=8)
    assert again.skipped and (out / "model.safetensors").stat().st_mtime_ns == mtime  # a no-op when done
    json.loads((out / STAMP).read_text())["gguf_sha256"]  # the stamp names the source file

    write_tiny_gguf(src, seed=1)  # another GGUF under the same name is converted again
    assert not convert_gguf(src, out, max_new_tokens=8).skipped


def test_bad_inputs(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "out")
    src = write_tiny_gguf(tmp_path / "tiny.gguf")
    with pytest.raises(UsageError, match="dtype 'fp8'"):
        convert_gguf(src, tmp_path / "out", dtype="fp8")
