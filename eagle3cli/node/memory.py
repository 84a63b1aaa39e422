"""A stage's resident memory, as train logs it (`rss_mib` in metrics.jsonl).

Measured on SmolLM2's online training on CPU (1,024-token steps whose shapes change every step, one
thread): with glibc's malloc as it comes, the resident set grows from ~2 GB toward ~12.6 GB over the first
~1,000 steps and then holds, because glibc raises its mmap threshold as large blocks are freed and then
serves the step's tensors from a heap that fragments. Two such runs side by side were OOM-killed on a 24 GB
machine. glibc's own `MALLOC_MMAP_THRESHOLD_=1048576` (blocks over 1 MiB mapped on their own, unmapped
when freed) held the same run under 4.8 GB, at 33-53% more CPU per token (page faults), and trimming
the heap at each checkpoint (`malloc_trim`) cost ~4% and did not stop the peak growing. So eagle3 leaves
malloc as it is (speed first) and docs/train.md says which variable trades the speed for the memory.
"""

from __future__ import annotations

import os


def resident_mib() -> float | None:
    """This process's resident set in MiB (Linux /proc), None where it cannot be read."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
