"""Handing freed heap memory back to the OS during long CPU stages.

A training step on CPU allocates and frees gigabytes of tensors whose sizes change with every batch
(online training: the target's activations and logits too). glibc's malloc serves tensors under its
mmap threshold -- which it raises up to 32 MiB as large blocks are freed -- from the process heap, and
keeps the freed pages there: measured on SmolLM2 online training (1,024-token steps, one thread), the
resident set grew from ~2 GB to ~12.6 GB over 1,000 steps, and two runs side by side were OOM-killed
on a 24 GB machine. At step ~100 of such a run, `malloc_trim(0)` gave back 2.6 of 5.4 GB: free
memory the heap held, not live tensors. Trimming at each checkpoint alone did not stop it: the heap's
address range kept growing (fragmentation), and the pages touched between two trims with it (peak
8.1 GB at step 450, +0.4 GB every 50 steps). So train also fixes malloc's mmap threshold: a tensor over
it gets its own mapping, unmapped when freed, and never fragments the heap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None (macOS, musl, Windows: no such call, nothing to do)."""
    if (fn := getattr(_libc(), "malloc_trim", None)) is not None:
        fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


M_MMAP_THRESHOLD = -3  # mallopt's parameter number (glibc malloc.h)
MMAP_THRESHOLD = 1 << 20  # bytes: a step's hidden states, logits and attention are larger


@functools.cache
def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def keep_large_blocks_off_the_heap(threshold: int = MMAP_THRESHOLD) -> bool:
    """Blocks over THRESHOLD bytes are mmapped and unmapped on free (glibc's default raises this threshold
    as large blocks are freed, so they end up fragmenting the heap). True when glibc took it. The price is a
    page fault per page of every large block: ~20% more CPU per token in SmolLM2's online training. A user
    who has the memory and wants the speed sets glibc's own MALLOC_MMAP_THRESHOLD_ (bytes; 33554432 is
    the most its default grows to) or GLIBC_TUNABLES=glibc.malloc.mmap_threshold=N, and it is left alone."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "mmap_threshold" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    fn = getattr(_libc(), "mallopt", None)
    if fn is None:
        return False
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(fn(M_MMAP_THRESHOLD, threshold))


def release_free_heap() -> bool:
    """Give the heap's free pages back to the OS; True when glibc did (it found pages to release)."""
    fn = _malloc_trim()
    return bool(fn and fn(0))


def resident_mib() -> float | None:
    """This process's resident set in MiB (Linux /proc), None where it cannot be read."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
