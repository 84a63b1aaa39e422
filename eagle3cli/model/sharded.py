"""A target bigger than one process: its layers split over the ranks by transformers' own
tensor-parallel plan (`DistributedConfig(tp_size=N)` over torch DTensor), for `cache` and
`train --online` alike.

Each rank holds 1/N of every attention and MLP matrix (whole heads: the plan splits q/k/v by
head); the decoder's outputs (so the aux states the capture hooks read) and the logits come back
whole on every rank, so a sharded target computes what an unsharded one does, to float rounding.
Every rank must run the same forward on the same input at the same time: the two ways the stages
keep that are here (`Lockstep`: rank 0 drives, the others repeat its calls; `gather`: each rank's
rows joined into one batch). The embedding, final norm and lm_head the draft starts from are read
from the safetensors (`train/setup.py`), never from the sharded model.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ..errors import UsageError
from ..speculate.target import text_config


def head_counts(path: Path) -> tuple[int, int]:
    """(attention heads, KV heads) from the target's config.json."""
    cfg = text_config(json.loads((Path(path) / "config.json").read_bytes()))
    heads = int(cfg.get("num_attention_heads") or 0)
    return heads, int(cfg.get("num_key_value_heads") or heads)


def check_shardable(path: Path, size: int, flag: str = "--tensor-parallel-size") -> None:
    """Exit 2 before any process starts when `size` ranks cannot each hold whole heads: a 9-head
    SmolLM2 loaded under 2 ranks and then crashed in its first forward."""
    heads, kv = head_counts(path)
    if heads >= 1 and heads % size == 0 and kv % size == 0:
        from transformers import AutoConfig

        plan = getattr(AutoConfig.from_pretrained(str(path)).get_text_config(), "base_model_tp_plan", None)
        if plan:
            return
        raise UsageError(
            f"{flag} {size}: transformers has no tensor-parallel plan for {path}'s model class",
            "a target whose transformers class ships one (Llama, Qwen2/3, Mistral, Gemma families...)",
            f"leave {flag} out (the whole target in each process)",
        )
    works = [n for n in range(2, max(heads, kv) + 1) if heads % n == 0 and kv % n == 0]
    raise UsageError(
        f"{flag} {size}: {path} has {heads} attention heads and {kv} KV heads, which {size} ranks cannot "
        "split (each rank holds whole heads)",
        "a size that divides both head counts: " + (", ".join(map(str, works)) if works else "none above 1"),
        f"{flag} {works[0]}" if works else f"leave {flag} out (this target cannot be split by heads)",
    )


def init_ranks(device_type: str) -> tuple[int, int]:
    """(rank, world) of this launched process, its process group up (gloo on CPU, nccl on GPUs)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        if device_type == "cuda":  # before any collective: nccl's object broadcasts use the current GPU
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size()


def load_sharded(path: Path, size: int, dtype: torch.dtype, device_type: str):
    """The target's causal LM with its matrices split over the `size` ranks of this launch (every rank
    of it: one tensor-parallel group), in eval mode, no gradients."""
    from transformers import AutoModelForCausalLM
    from transformers.distributed.configuration_utils import DistributedConfig

    _, world = init_ranks(device_type)
    if world != size:
        raise UsageError(
            f"--tensor-parallel-size {size} in a launch of {world} processes",
            "as many processes as --tensor-parallel-size (one tensor-parallel group)",
            f"launch {size} processes (eagle3 starts them itself when it is not already a launched rank)",
        )
    with read_slices_only():
        model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=dtype, distributed_config=DistributedConfig(tp_size=size)
        )
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@contextlib.contextmanager
def read_slices_only() -> Iterator[None]:
    """transformers opens every checkpoint file with safetensors' copy-on-write mmap, which charges
    the whole checkpoint to each rank's private memory (its own comment: it exhausts memory on Windows,
    where it reads with `pread` instead). Each rank here needs 1/N of it: safetensors' `pread` backend
    reads only the slices a rank takes, so a rank's commit charge (and a per-process cap such as
    RLIMIT_DATA) is its share, not the checkpoint's."""
    from transformers import modeling_utils

    opened = modeling_utils.safe_open

    def pread(file, framework, device="cpu", backend=None):
        return opened(file, framework=framework, device=device, backend="pread")

    modeling_utils.safe_open = pread  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        modeling_utils.safe_open = opened  # type: ignore[misc]


def gather(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank."""
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


class Lockstep:
    """Rank 0 drives and the other ranks repeat each call it makes, with its arguments (broadcast),
    so every rank enters the sharded forward together. Rank 0 calls `call(name, ...)`, then `stop()`
    however it ends, and the others leave `serve()`; the handlers move what they receive to their
    own device."""

    def __init__(self, handlers: dict[str, Callable[..., Any]]):
        import torch.distributed as dist

        self.handlers = handlers
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.inside = False  # rank 0 is inside a call: the others are in its collectives, not in serve()

    def _send(self, message: tuple | None) -> None:
        import torch.distributed as dist

        dist.broadcast_object_list([message], src=0)

    def call(self, name: str, *args: Any) -> Any:
        # tensors travel through the host: a pickled CUDA tensor would land on rank 0's GPU index
        self._send((name, tuple(a.cpu() if isinstance(a, torch.Tensor) else a for a in args)))
        self.inside = True
        out = self.handlers[name](*args)
        self.inside = False
        return out

    def stop(self) -> None:
        """Release the others. Not from inside a failed call: they wait in its forward, not for a
        message, and the launcher stops them once rank 0 has exited."""
        if not self.inside:
            self._send(None)

    def serve(self) -> None:
        import torch.distributed as dist

        while True:
            box: list[Any] = [None]
            dist.broadcast_object_list(box, src=0)
            if box[0] is None:
                return
            name, args = box[0]
            self.handlers[name](*args)
