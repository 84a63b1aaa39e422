"""What docs/troubleshooting.md tells a CPU user whose training's memory (`rss_mib`) grows: glibc serves freed large
blocks from the heap, where freeing them gives nothing back, and `MALLOC_MMAP_THRESHOLD_=1048576` unmaps
each one when freed. Checked in fresh processes, since malloc's settings are per process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")

_FREED = """
import ctypes, ctypes.util, psutil
def resident_mib():
    return psutil.Process().memory_info().rss / 2**20
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = 3 << 20  # a step's tensor: 3 MiB
libc.free(libc.malloc(size))  # as a step frees one: glibc's default now serves this size from the heap
blocks = [libc.malloc(size) for _ in range(100)]
for b in blocks:
    ctypes.memset(b, 1, size)
before = resident_mib()
for b in blocks[:-1]:  # the last one stays: the heap's top cannot shrink on free()
    libc.free(b)
print(before - resident_mib())
"""


def test_the_documented_malloc_threshold_gives_freed_step_tensors_back():
    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")}
    freed = {}
    for name, extra in (("default", {}), ("threshold", {"MALLOC_MMAP_THRESHOLD_": "1048576"})):
        out = subprocess.run(
            [sys.executable, "-c", _FREED], env=env | extra, capture_output=True, text=True, check=True
        )
        freed[name] = float(out.stdout)
    assert freed["default"] < 20 and freed["threshold"] > 250, freed  # MiB given back by freeing 99 x 3 MiB
