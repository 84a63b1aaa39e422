"""`--device`: a choice among what this torch build and this machine have, checked before any model loads.

The flag is free text for torch (`cuda:1`, `mps`), so a value torch cannot use surfaced as torch's
own traceback (`Torch not compiled with CUDA enabled`, `PyTorch is not linked with support for mps
devices`, `Expected one of cpu, cuda, ...`) only once a model was being loaded. Every stage that
takes `--device` (gen-data, cache, train, eval) checks it here first; `eagle3 doctor` lists the
choices.
"""

from __future__ import annotations

import re

from ..errors import UsageError

AUTO = ("auto",)
_DEVICE = re.compile(r"^(cpu|cuda|mps)(?::(\d+))?$")


def available_devices() -> list[str]:
    """The `--device` values this torch build and machine can run (`auto` aside)."""
    import torch

    out = ["cpu"]
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        out += ["cuda", *(f"cuda:{i}" for i in range(n))]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out.append("mps")
    return out


# How far two computations of the same logits may part, per unit of logit scale, by the precision the
# matmuls ran in (the export self-check's bound; eval's greedy near-ties). fp32 on IEEE matmuls agrees
# to float rounding; TF32 (the default of many CUDA containers, and torch's "high" fp32 precision)
# keeps 10 mantissa bits, bf16 8 ("medium" may use it), fp16 11.
MATMUL_RELATIVE_ERROR = {"fp32": 1e-4, "tf32": 1e-2, "bf16": 4e-2, "fp16": 1e-2}


def matmul_precision(dtype, device) -> str:
    """fp32 | tf32 | bf16 | fp16: what matmuls in `dtype` on `device` really keep (TF32: the CUDA
    setting torch.backends.cuda.matmul.allow_tf32, or torch's fp32 matmul precision "high")."""
    import torch

    if dtype in (torch.bfloat16, torch.float16):
        return "bf16" if dtype == torch.bfloat16 else "fp16"
    precision = torch.get_float32_matmul_precision()  # "medium" may use bf16, on CPU too (oneDNN)
    if precision == "medium":
        return "bf16"
    tf32 = bool(getattr(torch.backends.cuda.matmul, "allow_tf32", False)) or precision == "high"
    return "tf32" if tf32 and torch.device(device).type == "cuda" else "fp32"


_SAID: set[str] = set()


def gpu_supports_bf16(index: int) -> bool:
    """What torch.cuda.is_bf16_supported() answers for the current GPU, for GPU `index`: compute
    capability 8.0 (Ampere) or later; V100 and T4 emulate bf16 matmuls slowly or not at all."""
    import torch

    if torch.version.hip is not None:
        return bool(torch.cuda.is_bf16_supported())
    return tuple(torch.cuda.get_device_capability(index)) >= (8, 0)


def gpu_auto_dtype(device) -> object:
    """`--dtype auto` on a GPU: bf16 where it supports it, else fp16, said once per device (training
    then runs in fp32: fp16 needs loss scaling, which eagle3 does not do)."""
    import torch

    from ..console import warn

    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    if gpu_supports_bf16(index):
        return torch.bfloat16
    name = f"cuda:{index}"
    if name not in _SAID:
        _SAID.add(name)
        warn(
            f"{name} ({torch.cuda.get_device_name(index)}) has no bf16: --dtype auto loads models in fp16 and "
            "trains the draft in fp32 (--dtype fp32 for fp32 everywhere)"
        )
    return torch.float16


def shard_device(device: str | None, rank: int) -> str | None:
    """The device of `--shard rank/N` when `--device` is left out: cuda:(rank mod GPUs), so N shard
    processes started alike spread over the node's GPUs instead of all loading the target on cuda:0.
    A device given, or no GPU, is kept as is (None: auto)."""
    import torch

    if (device is not None and str(device).strip().lower() not in AUTO) or not torch.cuda.is_available():
        return device
    n = torch.cuda.device_count()
    return f"cuda:{rank % n}" if n > 0 else device


def _why_not(kind: str) -> str:
    import torch

    if kind == "cuda":
        if torch.version.cuda is None:
            return f"this torch ({torch.__version__}) is a CPU build, without CUDA"
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device on this machine"
    if kind == "mps":
        return "MPS (Apple-silicon GPUs) is not available to this torch build on this machine"
    return ""


def check_device(device: str | None, flag: str = "--device") -> None:
    """UsageError unless `device` is None/auto or one of `available_devices()`."""
    if device is None or str(device).strip().lower() in AUTO:
        return
    name = str(device).strip().lower()
    have = available_devices()
    if name in have:
        return
    choices = ", ".join(["auto", *have])
    m = _DEVICE.match(name)
    if m is None:
        what = f"{flag} {device}: not a device name"
    elif m.group(1) == "cpu":
        what = f"{flag} {device}: the CPU has no index (use cpu)"
    elif m.group(1) == "cuda" and "cuda" in have:
        n = sum(d.startswith("cuda:") for d in have)
        what = f"{flag} {device}: no such CUDA device (this machine has {n}: cuda:0..cuda:{n - 1})"
    else:
        what = f"{flag} {device}: {_why_not(m.group(1))}"
    raise UsageError(
        what,
        f"one of: {choices}",
        f"rerun with {flag} {'cuda' if 'cuda' in have else 'cpu'} (or leave it out: auto); `eagle3 doctor` lists the devices",
    )
