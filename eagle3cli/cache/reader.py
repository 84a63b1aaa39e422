"""`CacheReader`: the only way other stages read a cache folder.

Random access is memory-mapped: `safe_open` maps each shard and `get_slice` reads just one
sample's rows, so a 12 TB cache costs no RAM to open and a sample costs its own bytes.
Handles are opened lazily per process, so a reader survives DataLoader worker forks.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from ..errors import UsageError
from ..manifest import read_manifest
from .storage import decode, feature_keys

INDEX_FILE = "index.safetensors"
VOCAB_FILE = "vocab.safetensors"
REBUILD = "eagle3 cache --run runs/NAME"


class CacheReader:
    def __init__(self, cache_dir: str | Path):
        self.dir = Path(cache_dir)
        self.manifest = read_manifest(self.dir, "cache", REBUILD)
        m = self.manifest
        missing = [s["file"] for s in m["shards"] if not (self.dir / s["file"]).exists()]
        missing += [f for f in (INDEX_FILE, VOCAB_FILE) if not (self.dir / f).exists()]
        if missing:
            raise UsageError(
                f"cache {self.dir} is incomplete: missing {', '.join(missing[:5])}"
                + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""),
                "every file the cache manifest lists",
                f"eagle3 cache --verify {self.dir}, then rebuild with `{REBUILD}` (completed shards are kept)",
            )
        self.storage: str = m["storage"]
        self.target: dict = m["target"]
        self.aux_layer_ids: tuple[int, ...] = tuple(m["aux_layer_ids"])
        self.draft_vocab_size: int = int(m["draft_vocab_size"])
        self.hidden_size: int = int(m["target"]["hidden_size"])
        self.teacher: str = "topk" if self.storage == "compact" else "last_hidden"
        vocab = load_file(str(self.dir / VOCAB_FILE))
        self.d2t: torch.Tensor = vocab["d2t"].to(torch.int64)
        self.t2d: torch.Tensor = vocab["t2d"].to(torch.bool)
        self.lengths: list[int] = load_file(str(self.dir / INDEX_FILE))["lengths"].tolist()
        self._starts = [0]
        for s in m["shards"]:
            self._starts.append(self._starts[-1] + int(s["samples"]))
        if self._starts[-1] != len(self.lengths):
            raise UsageError(
                f"cache {self.dir}: shards hold {self._starts[-1]} samples, the index {len(self.lengths)}",
                "a consistent cache",
                f"eagle3 cache --verify {self.dir}",
            )
        self._handles: dict[int, object] = {}
        self._offsets: dict[int, list[int]] = {}
        self._pid = os.getpid()

    def __len__(self) -> int:
        return len(self.lengths)

    def _shard(self, j: int):
        if self._pid != os.getpid():  # forked worker: do not share mmaps/handles with the parent
            self._handles.clear()
            self._offsets.clear()
            self._pid = os.getpid()
        h = self._handles.get(j)
        if h is None:
            h = safe_open(str(self.dir / self.manifest["shards"][j]["file"]), framework="pt")
            self._handles[j] = h
            self._offsets[j] = h.get_tensor("offsets").tolist()
        return h

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range 0..{len(self) - 1}")
        j = bisect_right(self._starts, i) - 1
        h = self._shard(j)
        local = i - self._starts[j]
        a, b = self._offsets[j][local], self._offsets[j][local + 1]
        raw = {k: h.get_slice(k)[a:b] for k in feature_keys(self.storage)}
        out = {
            "input_ids": h.get_slice("input_ids")[a:b].to(torch.int64),
            "loss_mask": h.get_slice("loss_mask")[a:b].to(torch.bool),
        }
        out.update(decode(self.storage, raw))
        return out
