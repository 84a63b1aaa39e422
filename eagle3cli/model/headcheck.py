"""Reading a head's tensors, refusing non-finite ones.

A head with a NaN or inf anywhere drafts garbage (or NaN logits whose argmax is token 0) and
every engine loads it without a word; eval and serve must refuse it, so every reader of head
weights goes through `load_head_tensors`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from ..errors import StageError

RETRAIN = "retrain the head: eagle3 train --run runs/NAME --no-resume (training stops at the first non-finite loss)"


def nonfinite_tensors(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of the floating-point tensors holding a NaN or an inf."""
    return [n for n, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]


def load_head_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a head's model.safetensors; StageError if it is unreadable or not finite."""
    from safetensors.torch import load_file

    path = Path(path)
    try:
        tensors = load_file(str(path))
    except Exception as e:  # noqa: BLE001 — SafetensorError/OSError for truncated or foreign files
        raise StageError(
            f"{path} is not a readable safetensors file ({type(e).__name__}: {str(e)[:200]})",
            "a head exported by `eagle3 train`",
            RETRAIN,
        ) from e
    refuse_nonfinite(tensors, path)
    return tensors


def refuse_nonfinite(tensors: Mapping[str, torch.Tensor], path: Path) -> None:
    """StageError naming the tensors of `path` that hold a NaN or an inf."""
    bad = nonfinite_tensors(tensors)
    if bad:
        raise StageError(
            f"{path} holds non-finite values (NaN or inf) in {', '.join(bad[:6])}"
            + (f" and {len(bad) - 6} more" if len(bad) > 6 else ""),
            "a head whose weights are all finite",
            RETRAIN,
        )
