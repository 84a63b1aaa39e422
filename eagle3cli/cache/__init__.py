"""`eagle3 cache`: chat-template tokenisation with assistant loss masks, the draft vocabulary,
and the target's multi-layer hidden states in sharded, checksummed safetensors.

The cache's public face, what other stages may use (tests/unit/test_imports.py holds them to it):
`CacheReader`, how train reads a cache folder, and `mask_data_record`, the assistant loss masks
online training builds in memory exactly as a cache would. Both are loaded on first use: the
command line imports `cache.cli` at start-up, and these pull in torch."""

from __future__ import annotations

__all__ = ["CacheReader", "mask_data_record"]


def __getattr__(name: str):
    if name == "CacheReader":
        from .reader import CacheReader

        return CacheReader
    if name == "mask_data_record":
        from .masks import mask_data_record

        return mask_data_record
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
