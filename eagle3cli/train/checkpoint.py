"""Atomic training checkpoints with `last` and `best` links, for exact resume — and no pickles.

A checkpoint is one safetensors file `checkpoints/step-NNNNNNN.safetensors`: every tensor of the
state (model, optimizer moments, RNG states) is a safetensors tensor, and everything else
(step, data position, scheduler, config, metrics) is JSON in the file's metadata. Loading it
therefore runs no code, whatever the file holds: a crafted checkpoint can fail to load, never
execute anything. (torch.load with `weights_only=False` unpickles arbitrary objects, which is
how a `last` link pointing at a crafted file used to run its payload.)

The file is written to a temp name and renamed, so a kill at any moment leaves either the
previous or the new checkpoint, never half of one. `last`/`best` are symlinks swapped atomically
(a temp link renamed over the old one). Checkpoints of older versions (`step-*.pt`) still load,
through torch's restricted unpickler (`weights_only=True`: tensors and plain containers only).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch
from typing_extensions import NotRequired, TypedDict  # pydantic reads TypedDicts from here before 3.12

from ..errors import StageError
from ..readers.jsonl import split_byte_lines
from ..readers.limits import check_regular_file
from ..run_folder.manifest import atomic_write_bytes, atomic_write_tensors

CKPT_DIR = "checkpoints"
SUFFIX = ".safetensors"
LEGACY_SUFFIX = ".pt"
FORMAT = "eagle3-checkpoint/1"


def rng_state() -> dict:
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: Any, path: Path | None = None) -> str | None:
    """Restore the RNG state a checkpoint saved; one that is malformed (edited, crafted) is a
    StageError naming the checkpoint (`path`), not a traceback from `random.setstate`. Returns the
    line to say when the checkpoint saw another number of GPUs than this process does."""
    try:
        torch.set_rng_state(state["torch"])
        random.setstate(state["python"])
        saved = state.get("cuda")
        if saved is not None and torch.cuda.is_available():
            return _set_cuda_rng_states(list(saved))
        return None
    except (KeyError, TypeError, ValueError, RuntimeError, OverflowError) as e:
        if path is None:
            raise
        raise _damaged(Path(path), f"its RNG state is malformed ({type(e).__name__}: {str(e)[:200]})") from None


def _set_cuda_rng_states(saved: list) -> str | None:
    """One state per GPU that exists, in order (a resume under fewer or more visible GPUs:
    CUDA_VISIBLE_DEVICES, another node); torch's set_rng_state_all indexes past the last GPU."""
    n = torch.cuda.device_count()
    for i, s in enumerate(saved[:n]):
        torch.cuda.set_rng_state(s, i)
    if len(saved) == n:
        return None
    return (
        f"the checkpoint saved CUDA RNG states for {len(saved)} GPU(s), this process sees {n}: restored "
        f"{min(n, len(saved))}; GPU-side random draws (dropout, sampling) differ from an uninterrupted run"
    )


# ---------------------------------------------------------------- state <-> (tensors, JSON)
# JSON has no tuples, no non-string keys and no tensors; these markers keep all three exact, so
# optimizer/scheduler/RNG state round-trips to equal objects (bit-exact resume depends on it).
_T, _TUPLE, _DICT = "$tensor", "$tuple", "$dict"


def pack(state: Any) -> tuple[dict[str, torch.Tensor], Any]:
    """(tensors by name, a JSON-able skeleton referring to them by name)."""
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()

    def walk(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous()
            if t.numel() and t.data_ptr() in seen:  # safetensors refuses shared storage
                t = t.clone()
            seen.add(t.data_ptr())
            name = f"t{len(tensors)}"
            tensors[name] = t
            return {_T: name}
        if isinstance(x, dict):
            if all(isinstance(k, str) and not k.startswith("$") for k in x):
                return {k: walk(v) for k, v in x.items()}
            return {_DICT: [[walk(k), walk(v)] for k, v in x.items()]}
        if isinstance(x, tuple):
            return {_TUPLE: [walk(v) for v in x]}
        if isinstance(x, list):
            return [walk(v) for v in x]
        if x is None or isinstance(x, (bool, int, str)):
            return x
        if isinstance(x, float):
            return x  # json writes NaN/Infinity and reads them back
        raise TypeError(f"cannot store a {type(x).__name__} in a checkpoint")

    return tensors, walk(state)


def unpack(skeleton: Any, tensors: dict[str, torch.Tensor]) -> Any:
    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            if _T in x:
                return tensors[x[_T]]
            if _TUPLE in x:
                return tuple(walk(v) for v in x[_TUPLE])
            if _DICT in x:
                return {walk(k): walk(v) for k, v in x[_DICT]}
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        return x

    return walk(skeleton)


# ---------------------------------------------------------------- files
def _link(target_name: str, link: Path) -> None:
    tmp = link.with_name(f".{link.name}.tmp")
    tmp.unlink(missing_ok=True)
    os.symlink(target_name, tmp)
    os.replace(tmp, link)


def ckpt_name(step: int) -> str:
    return f"step-{step:07d}"


def save(train_dir: Path, step: int, state: dict, is_best: bool, keep: int) -> Path:
    """Write checkpoint `step`, point `last` (and `best` if asked) at it, prune old ones."""
    d = Path(train_dir) / CKPT_DIR
    d.mkdir(parents=True, exist_ok=True)
    name = ckpt_name(step) + SUFFIX
    tensors, skeleton = pack(state)
    atomic_write_tensors(d / name, tensors, {"format": FORMAT, "state": json.dumps(skeleton)})
    _link(name, d / "last")
    if is_best:
        _link(name, d / "best")
    prune(d, keep)
    return d / name


def _checkpoints(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("step-") and p.suffix in (SUFFIX, LEGACY_SUFFIX))


def prune(d: Path, keep: int) -> None:
    protect = {os.readlink(d / n) for n in ("last", "best") if (d / n).is_symlink()}
    ckpts = _checkpoints(d)
    for name in ckpts[:-keep] if keep > 0 else ckpts:
        if name not in protect:
            (d / name).unlink(missing_ok=True)
    ds = d.parent / "deepspeed"  # the engine's own tag folders, one per checkpoint
    if ds.is_dir():
        kept = {Path(n).stem for n in _checkpoints(d)}
        for tag in ds.glob("step-*"):
            if tag.is_dir() and tag.name not in kept:
                shutil.rmtree(tag, ignore_errors=True)


def dangling_last(train_dir: Path) -> str | None:
    """Where `checkpoints/last` points when that file is gone (a resume would start from step 0)."""
    link = Path(train_dir) / CKPT_DIR / "last"
    return os.readlink(link) if link.is_symlink() and not link.resolve().exists() else None


def latest(train_dir: Path) -> Path | None:
    link = Path(train_dir) / CKPT_DIR / "last"
    return link.resolve() if link.is_symlink() and link.resolve().exists() else None


def damaged_next(path: Path) -> str:
    run = path.parent.parent.parent if path.parent.name == CKPT_DIR else path.parent.parent.parent.parent
    return (
        f"point {path.parent / 'last'} at an older step-*.safetensors (ln -sfn NAME last), "
        f"or start over: eagle3 train --run {run} --no-resume"
    )


def _damaged(path: Path, why: str) -> StageError:
    return StageError(
        f"checkpoint {path} cannot be loaded: {why}",
        "a checkpoint written by `eagle3 train` (tensors + JSON state)",
        damaged_next(path),
    )


def load(path: Path) -> dict:
    """The state saved by `save`. Never unpickles code: safetensors + JSON, or (legacy .pt)
    torch's weights-only unpickler, which refuses anything but tensors and plain containers."""
    path = Path(path)
    check_regular_file(path, "a training checkpoint", damaged_next(path))  # a FIFO: no hang
    if path.suffix == LEGACY_SUFFIX:
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 — UnpicklingError for foreign objects, EOFError when cut
            raise _damaged(path, f"it is not a plain tensor checkpoint ({type(e).__name__}: {str(e)[:300]})") from e
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 — safe_open has no __iter__
    except Exception as e:  # noqa: BLE001 — SafetensorError for truncated or foreign files
        raise _damaged(path, f"not a readable safetensors file ({type(e).__name__}: {str(e)[:300]})") from e
    if meta.get("format") != FORMAT or "state" not in meta:
        raise _damaged(path, f"its metadata names format {meta.get('format')!r}, expected {FORMAT!r}")
    try:
        skeleton = json.loads(meta["state"])
        return unpack(skeleton, tensors)
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise _damaged(path, f"its JSON state is malformed ({type(e).__name__}: {e})") from e


class _LambdaLRState(TypedDict):
    lr_lambdas: list[Any]  # LambdaLR.load_state_dict pops it: a missing one was a KeyError
    base_lrs: list[Any]
    last_epoch: int


class _PairState(TypedDict):
    muon: _LambdaLRState
    adamw: _LambdaLRState


class CheckpointState(TypedDict):
    """What a resume reads from a checkpoint's JSON state (DeepSpeed's keep model, optimizer and
    scheduler in their own files, named by `ds_tag`)."""

    step: int
    epoch: int
    batch_pos: int
    tokens_seen: int
    config: dict[str, Any]
    model: NotRequired[dict[str, Any]]
    optimizer: NotRequired[dict[str, Any]]
    scheduler: NotRequired[_LambdaLRState | _PairState]
    ds_tag: NotRequired[str]


def restore(path: Path, state: dict, draft: torch.nn.Module, optimizer, scheduler) -> None:
    """Load a single-process checkpoint's state into the draft, optimizer and scheduler: a tensor of
    another shape, a missing or unknown name, or optimizer/scheduler state the loaders refuse names
    the checkpoint (exit 2), not a RuntimeError from load_state_dict."""
    embed = draft.state_dict()["embed_tokens.weight"]  # frozen, the target's: never in a checkpoint
    own = {k: v for k, v in draft.state_dict().items() if k != "embed_tokens.weight"}
    saved = state.get("model") or {}
    bad = [f"{k}: missing" for k in own if k not in saved] + [f"{k}: not the draft's" for k in saved if k not in own]
    bad += [
        f"{k}: shape {list(v.shape)}, the draft's is {list(own[k].shape)}"
        for k, v in saved.items()
        if k in own and (not isinstance(v, torch.Tensor) or v.shape != own[k].shape)
    ]
    if bad:
        raise _damaged(path, "its weights do not fit this run's draft (" + "; ".join(bad[:4]) + ")")
    for what, load in (
        ("model", lambda: draft.load_state_dict({**saved, "embed_tokens.weight": embed})),
        ("optimizer", lambda: optimizer.load_state_dict(state["optimizer"])),
        ("scheduler", lambda: scheduler.load_state_dict(dict(state["scheduler"]))),
    ):
        try:
            load()
        except (KeyError, ValueError, TypeError, RuntimeError, IndexError) as e:
            raise _damaged(path, f"its {what} state does not load ({type(e).__name__}: {str(e)[:200]})") from e


def load_deepspeed(engine, ds_dir: Path, tag: str) -> None:
    """Restore a DeepSpeed engine from its own checkpoint (`train/deepspeed/TAG/`), unpickling with
    torch's weights-only loader: DeepSpeed's own loader turns the weights-only check off, which
    would run whatever a crafted file holds. The three DeepSpeed classes its files contain are allowed;
    they are plain records (a loss-scale setting, an enum, an offset pair)."""
    import pickle

    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    allowed = [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]

    def safe_load(path, map_location=None):
        try:
            with torch.serialization.safe_globals(allowed):
                return torch.load(path, map_location=map_location, weights_only=True)
        except (pickle.UnpicklingError, EOFError, RuntimeError) as e:
            raise _damaged(Path(path), f"it holds more than tensors and plain values ({str(e)[:300]})") from e

    engine.checkpoint_engine.load = safe_load  # the instance attribute shadows the unsafe method
    engine.load_checkpoint(str(ds_dir), tag=tag)


# ---------------------------------------------------------------- metrics.jsonl
def read_metrics(metrics_path: Path) -> list[dict]:
    """The metric lines that parse. A line cut by a full disk or a kill is skipped, not fatal."""
    if not metrics_path.exists():
        return []
    out = []
    for line in split_byte_lines(metrics_path.read_bytes()):
        try:
            m = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(m, dict):
            out.append(m)
    return out


def truncate_metrics(metrics_path: Path, step: int) -> None:
    """Keep the metric lines up to checkpoint `step` (a killed run logged later ones; they are
    redone) and drop any line cut in the middle."""
    if not metrics_path.exists():
        return
    keep = [m for m in read_metrics(metrics_path) if _step(m) <= step]
    atomic_write_bytes(metrics_path, "".join(json.dumps(m) + "\n" for m in keep).encode())


def _step(m: dict) -> float:
    s = m.get("step", 0)
    return s if isinstance(s, (int, float)) and not math.isnan(s) else math.inf


def append_metrics(metrics_path: Path, m: dict) -> None:
    """Append one JSON line, all or nothing: a line cut by an earlier crash is cut off first, and
    a write that fails (disk full) is rolled back, so the file only ever holds whole lines."""
    line = (json.dumps(m) + "\n").encode()
    fd = os.open(metrics_path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            size = os.pread(fd, size, 0).rfind(b"\n") + 1
            os.ftruncate(fd, size)
        try:
            view = memoryview(line)
            while view:  # a short write (disk filling up) leaves the rest for the next call
                view = view[os.write(fd, view) :]
        except OSError:
            os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)
