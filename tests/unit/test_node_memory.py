"""node/memory.py: freed heap memory goes back to the OS (the cause of online training's RSS growth)."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import pytest

from eagle3cli.node.memory import release_free_heap, resident_mib

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc")


def test_freed_heap_pages_are_given_back():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    # 3,000 blocks of 64 KiB: under malloc's mmap threshold, so they come from the heap, as a step's
    # medium tensors do; the last one stays allocated, so the heap's top cannot shrink on free()
    blocks = [libc.malloc(64 << 10) for _ in range(3000)]
    assert all(blocks)
    for b in blocks:
        ctypes.memset(b, 1, 64 << 10)  # touched: resident
    for b in blocks[:-1]:
        libc.free(b)
    held = resident_mib()
    assert release_free_heap() is True
    after = resident_mib()
    libc.free(blocks[-1])
    assert held is not None and after is not None
    assert held - after > 100, f"resident {held:.0f} MiB before the trim, {after:.0f} after"


_FRAGMENT = """
import ctypes, ctypes.util, sys
from eagle3cli.node.memory import keep_large_blocks_off_the_heap, resident_mib
if sys.argv[1] == "fixed":
    assert keep_large_blocks_off_the_heap()
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = 3 << 20  # a step's tensor: 3 MiB
libc.free(libc.malloc(size))  # glibc's default now serves blocks this large from the heap
blocks = [libc.malloc(size) for _ in range(100)]
for b in blocks:
    ctypes.memset(b, 1, size)
before = resident_mib()
for b in blocks[:-1]:  # the last one stays: the heap's top cannot shrink on free()
    libc.free(b)
print(before - resident_mib())
"""


def test_large_blocks_go_back_to_the_os_when_freed_once_train_fixes_the_threshold():
    """glibc's dynamic mmap threshold moves freed 3 MiB blocks into the heap, where freeing them gives nothing
    back; with keep_large_blocks_off_the_heap (train calls it) each is unmapped on free."""
    import os
    import subprocess

    freed = {}
    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")}
    for mode in ("default", "fixed"):
        out = subprocess.run(
            [sys.executable, "-c", _FRAGMENT, mode], capture_output=True, text=True, check=True, env=env
        )
        freed[mode] = float(out.stdout)
    assert freed["default"] < 20 and freed["fixed"] > 250, freed


def test_a_users_own_malloc_threshold_is_left_alone(monkeypatch):
    from eagle3cli.node.memory import keep_large_blocks_off_the_heap

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "33554432")
    assert keep_large_blocks_off_the_heap() is False
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=33554432")
    assert keep_large_blocks_off_the_heap() is False
