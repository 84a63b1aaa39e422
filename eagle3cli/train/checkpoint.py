"""Atomic training checkpoints with `last` and `best` links, for exact resume.

A checkpoint is one file `checkpoints/step-NNNNNNN.pt` (model, optimizer, scheduler, data
position, RNG states, metrics) written to a temp name and renamed, so a kill at any moment
leaves either the previous or the new checkpoint, never half of one. `last`/`best` are
symlinks swapped atomically (a temp link renamed over the old one).
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
from pathlib import Path

import torch

from ..manifest import atomic_write_bytes

CKPT_DIR = "checkpoints"


def rng_state() -> dict:
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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
    name = ckpt_name(step) + ".pt"
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write_bytes(d / name, buf.getvalue())
    _link(name, d / "last")
    if is_best:
        _link(name, d / "best")
    prune(d, keep)
    return d / name


def prune(d: Path, keep: int) -> None:
    protect = {os.readlink(d / n) for n in ("last", "best") if (d / n).is_symlink()}
    ckpts = sorted(p.name for p in d.glob("step-*.pt"))
    for name in ckpts[:-keep] if keep > 0 else ckpts:
        if name not in protect:
            (d / name).unlink(missing_ok=True)
    ds = d.parent / "deepspeed"  # the engine's own tag folders, one per checkpoint
    if ds.is_dir():
        kept = {p.stem for p in d.glob("step-*.pt")}
        for tag in ds.glob("step-*"):
            if tag.is_dir() and tag.name not in kept:
                shutil.rmtree(tag, ignore_errors=True)


def latest(train_dir: Path) -> Path | None:
    link = Path(train_dir) / CKPT_DIR / "last"
    return link.resolve() if link.is_symlink() and link.resolve().exists() else None


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def truncate_metrics(metrics_path: Path, step: int) -> None:
    """Drop metric lines written after checkpoint `step` (a killed run logged them; they are redone)."""
    if not metrics_path.exists():
        return
    keep = [
        line
        for line in metrics_path.read_text().splitlines()
        if line.strip() and json.loads(line).get("step", 0) <= step
    ]
    atomic_write_bytes(metrics_path, ("\n".join(keep) + "\n" if keep else "").encode())
