"""oneDNN-packed linear layers for decoding on CPU.

Why: on CPU a decoding step is memory-bound, and with its plain `F.linear` path (MKL sgemm) an
fp32 matmul over a few rows costs far more than one row — it re-reads the weights in a layout
made for large matrices. Measured on SmolLM2-135M (one thread, AVX-512 EPYC, fp32): the 30
layers' matmuls took 25 ms for one token and 38 ms for four; with the weights reordered once into
oneDNN's blocked layout, 14 ms and 18 ms (docs/eval.md). Verifying d drafted tokens then costs about what one
plain step costs, which is the premise of speculative decoding. Plain decoding gets the same
kernels (same packed model), so speedups stay like for like.

On the machine measured the packed fp32 kernel is also row-invariant: row i of an n-row product is
bit-equal to the row computed alone (MKL's is not), so a verification pass scores each drafted
token as a one-token step would. Exactness never rests on it: eval compares outputs.

Inference only: a packed weight has no gradient. `pack_linears` replaces modules in place.

Which CPUs: oneDNN's fp32 path runs on any x86-64 CPU; its bf16 path needs AVX-512 (bw, vl, dq)
or AVX-NE-CONVERT (`eagle3cli/node/cpu_features.py`). `--cpu-kernels auto` (the default) packs only
where the CPU can run the model's dtype and says which it chose; an explicit `onednn` that the CPU
cannot run is refused before anything is loaded.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import UsageError
from ..node.cpu_features import FORCE_ENV, ONEDNN_BF16_ALTERNATIVE, forced_level, onednn_bf16_missing

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)
_PACKED: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # models pack_linears ran on
# A oneDNN call costs ~15-20 us more than F.linear's, which a small matrix never wins back (the
# 128-wide tiny target decoded 0.65x as fast fully packed). From 1 MiB of fp32 weights up (SmolLM2's
# 576x576 attention and 1536x576 MLP matrices, its lm_head) the packed layout is the faster one.
MIN_PACK_ELEMENTS = 1 << 18


def onednn_linear_available() -> bool:
    """Whether this torch build has oneDNN's packed linear ops (x86 CPU builds do)."""
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


@functools.lru_cache(maxsize=1)
def _bf16_probe() -> str | None:
    """Pack one small bf16 matrix: None when it works, else oneDNN's own error (the flags in
    /proc/cpuinfo can be right while a hypervisor hides the instructions)."""
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16), None)
    except RuntimeError as e:
        return str(e).strip().splitlines()[0][:200]
    return None


def onednn_cannot_run(dtype: torch.dtype) -> str | None:
    """Why oneDNN's packed linear cannot run `dtype` weights on this CPU and build; None when it can."""
    if not onednn_linear_available():
        return "this torch build has no oneDNN packed linear"
    if dtype != torch.bfloat16:
        return None
    missing = onednn_bf16_missing()
    if missing:
        forced = f" ({FORCE_ENV}={forced_level()})" if forced_level() != "native" else ""
        return (
            f"oneDNN's bf16 linear needs {' + '.join(missing)} (or {ONEDNN_BF16_ALTERNATIVE}); "
            f"this CPU lacks them{forced}"
        )
    probe = _bf16_probe()
    return f"oneDNN's bf16 linear fails on this CPU: {probe}" if probe else None


@dataclass(frozen=True)
class KernelChoice:
    kernels: str  # what runs: "onednn" or "torch"
    why: str  # one line for the log: the choice and its reason


def choose_cpu_kernels(
    requested: str, device: torch.device | str, dtype: torch.dtype, flag: str = "--cpu-kernels"
) -> KernelChoice:
    """Resolve a stage's --cpu-kernels (auto | onednn | torch) for a target of `dtype` on `device`.

    auto: oneDNN where this CPU can run the dtype, else torch's F.linear. An explicit onednn the CPU
    cannot run is exit 2 naming the missing flags and the working choice (never a traceback from
    inside oneDNN)."""
    if torch.device(device).type != "cpu":
        return KernelChoice(requested if requested != "auto" else "torch", "device default (not CPU)")
    name = {torch.bfloat16: "bf16", torch.float32: "fp32"}.get(dtype, str(dtype))
    if requested == "torch":
        return KernelChoice("torch", f"torch F.linear ({flag} torch)")
    why_not = onednn_cannot_run(dtype) if dtype in PACKABLE_DTYPES else f"oneDNN packs fp32 and bf16, not {name}"
    if requested == "onednn" and why_not:
        raise UsageError(
            f"{flag} onednn with {name} weights: {why_not}",
            f"a kernel this CPU runs for {name}: torch (plain F.linear), or auto (oneDNN where it can run)",
            f"rerun with {flag} torch (or {flag} auto; or --dtype fp32, which oneDNN runs on any x86-64 CPU)",
        )
    if why_not:
        return KernelChoice("torch", f"torch F.linear ({flag} auto: {why_not})")
    return KernelChoice("onednn", f"oneDNN packed ({flag} {requested}, {name})")


class PackedLinear(nn.Module):
    """y = x W^T + b with W reordered once for oneDNN; a drop-in for `nn.Linear` at inference.

    `weight` stays readable when `keep_weight` (small modules whose weights other code reads, like
    a draft head); a target drops it so its matrices are not held twice.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, keep_weight: bool = False):
        super().__init__()
        w = weight.detach()
        self.in_features, self.out_features = int(w.shape[1]), int(w.shape[0])
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(w, None), persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach().clone(), persistent=False)
        if keep_weight:
            self.register_buffer("weight", w, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.packed.dtype:
            raise TypeError(f"packed linear holds {self.packed.dtype} weights, got {x.dtype} input")
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def packable(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype in PACKABLE_DTYPES
        and weight.numel() >= MIN_PACK_ELEMENTS
        and onednn_cannot_run(weight.dtype) is None
    )


def packed_or_plain(weight: torch.Tensor, bias: torch.Tensor | None, pack: bool):
    """A callable x -> x W^T + b: packed when asked and possible, else `F.linear` on the tensors."""
    if pack and packable(weight):
        return PackedLinear(weight, bias)
    return lambda x: nn.functional.linear(x, weight, bias)


@torch.no_grad()
def pack_linears(model: nn.Module, keep_weight: bool = False) -> int:
    """Replace the CPU `nn.Linear`s of `model` with `PackedLinear`s; returns how many.

    Left as they are: matrices under MIN_PACK_ELEMENTS, weights not fp32/bf16 on CPU, weights of a
    dtype this CPU's oneDNN cannot run (bf16 without AVX-512), everything where the build has no
    oneDNN (0).
    """
    if not onednn_linear_available():
        return 0
    # a matrix shared with another module (a tied lm_head is the input embedding) stays readable:
    # keeping it costs nothing, and transformers reads `lm_head.weight`
    shared = {
        id(p) for name, m in model.named_modules() for p in m.parameters(recurse=False) if type(m) is not nn.Linear
    }
    todo = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear and packable(child.weight)
    ]
    for parent, name, child in todo:
        keep = keep_weight or id(child.weight) in shared
        setattr(parent, name, PackedLinear(child.weight, child.bias, keep_weight=keep))
    _PACKED.add(model)  # inference-only from here (a draft head then packs its fused projections)
    return len(todo)


def is_packed(module: nn.Module) -> bool:
    """Whether `pack_linears` ran on this module (small matrices may have stayed nn.Linear)."""
    return module in _PACKED


def pack_for_inference(model: nn.Module, kernels: str, keep_weight: bool = False) -> str:
    """Apply a stage's --cpu-kernels choice (auto | onednn | torch) to a loaded model; says what its
    matmuls run on (for logs, reports and manifests). An onednn this CPU cannot run for the model's
    dtype is exit 2 (see `choose_cpu_kernels`)."""
    p = next(model.parameters())
    if p.device.type != "cpu":
        return "device default"
    choice = choose_cpu_kernels(kernels, p.device, p.dtype)
    if choice.kernels == "torch":
        return "torch (F.linear)" if kernels == "torch" else choice.why
    return f"onednn packed ({pack_linears(model, keep_weight=keep_weight)} linears)"
