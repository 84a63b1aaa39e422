"""A tiny Llama target's config for tests that build models in memory (no tests here)."""

from __future__ import annotations

from transformers import LlamaConfig


def tiny_llama_config(vocab_size: int, layers: int = 4, hidden: int = 32, max_positions: int = 128) -> LlamaConfig:
    """`vocab_size` x `hidden` embeddings, `layers` layers, an MLP twice as wide, 4 attention heads
    sharing 2 KV heads: the smallest shape every code path (GQA, aux layers) still sees."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
    )
