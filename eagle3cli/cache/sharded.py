"""`eagle3 cache --tensor-parallel-size N` on the hf route: the target split over N processes
(`model/sharded.py`), for a target bigger than one process's memory. The cache is the one
`run.py` writes, by the same code: only where each forward runs changes.

`eagle3 cache` (no launcher around it) checks the data and the target, then starts N ranks of
itself (`python -m eagle3cli cache --recipe F` with RANK / WORLD_SIZE / MASTER_* set, as torchrun
sets them) and waits; the first rank to fail stops the others and gives the command its exit code.
Rank 0 is the cache run (lock, plan, shards, manifest); ranks 1..N-1 write nothing and repeat each
forward rank 0 makes (`Lockstep`), so the batches, their order and resume are rank 0's alone.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
import yaml

from ..config import config_dict
from ..console import log
from ..model.sharded import Lockstep, check_shardable, init_ranks
from ..model.target import open_target, pick_device
from .config import CacheConfig
from .features import ModelFeatures


def role(cfg: CacheConfig) -> str | None:
    """launch (start the ranks), drive (rank 0), follow (the others), or None (not sharded)."""
    if cfg.engine != "hf" or cfg.tensor_parallel_size == 1:
        return None
    if "RANK" not in os.environ:
        return "launch"
    return "drive" if os.environ["RANK"] == "0" else "follow"


def launch(cfg: CacheConfig, target_path: Path) -> Path:
    """Start the ranks of this cache run and wait for them (the checks before: run.py's)."""
    import socket

    n = cfg.tensor_parallel_size
    check_shardable(target_path, n)
    child = {k: v for k, v in config_dict(cfg).items() if v is not None}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    package_root = str(Path(__file__).resolve().parents[2])
    with tempfile.TemporaryDirectory(prefix="eagle3-cache-ranks-") as tmp:
        recipe = Path(tmp) / "cache.yaml"
        recipe.write_text(yaml.safe_dump({"cache": child}), encoding="utf-8")
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(n))
        env["LOCAL_WORLD_SIZE"] = str(n)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        log(f"cache: the target split over {n} processes (transformers tensor parallel), rank 0 writes {cfg.out_dir}")
        cmd = [sys.executable, "-m", "eagle3cli", "cache", "--recipe", str(recipe)]
        procs = [subprocess.Popen(cmd, env=dict(env, RANK=str(r), LOCAL_RANK=str(r))) for r in range(n)]
        code = _wait(procs)
    if code != 0:
        raise SystemExit(code)  # rank 0 (or the rank that failed) said why above
    return cfg.out_dir


def _wait(procs: list[subprocess.Popen]) -> int:
    """0 when every rank ends well; else the first failure's code, the other ranks stopped (they
    would wait forever in a forward or a broadcast of the rank that died)."""
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed or all(c == 0 for c in codes):
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    return failed[0] if failed else 0


class DrivenFeatures:
    """Rank 0's features: each call made on every rank (`Lockstep`), rank 0 keeping the result."""

    def __init__(self, lock: Lockstep):
        self.lock = lock

    def rows(self, seqs: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lock.call("rows", list(seqs))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lock.call("logits", hidden)


def _handlers(cfg: CacheConfig) -> dict[str, Callable]:
    """What every rank does on rank 0's word: load the split target, then run its forwards."""
    held: dict[str, ModelFeatures] = {}

    def load(path: str, aux_ids: tuple[int, ...], pad_id: int) -> None:
        target = open_target(path, True, cfg.device, cfg.dtype, tensor_parallel=cfg.tensor_parallel_size)
        held["features"] = ModelFeatures(target.model, aux_ids, pad_id)

    return {
        "load": load,
        "rows": lambda seqs: held["features"].rows(seqs),
        "logits": lambda hidden: held["features"].logits(hidden),
    }


@contextlib.contextmanager
def driver(cfg: CacheConfig) -> Iterator[Lockstep]:
    """Rank 0's side for the whole run: the others are released however it ends."""
    init_ranks(pick_device(cfg.device).type)
    lock = Lockstep(_handlers(cfg))
    try:
        yield lock
    finally:
        lock.stop()


def driven_features(lock: Lockstep, target_path: Path, aux_ids: tuple[int, ...], pad_id: int) -> DrivenFeatures:
    lock.call("load", str(target_path), tuple(aux_ids), pad_id)
    log(f"cache: target split over {lock.world} ranks (1/{lock.world} of each attention and MLP matrix per rank)")
    return DrivenFeatures(lock)


def follow(cfg: CacheConfig) -> Path:
    """Ranks 1..N-1: repeat rank 0's calls until it is done."""
    init_ranks(pick_device(cfg.device).type)
    Lockstep(_handlers(cfg)).serve()
    return cfg.out_dir
