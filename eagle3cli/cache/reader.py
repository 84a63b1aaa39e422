"""`CacheReader`: the only way other stages read a cache folder.

Random access is memory-mapped: `safe_open` maps each shard and `get_slice` reads just one
sample's rows, so a 12 TB cache costs no RAM to open and a sample costs its own bytes.
Handles are opened lazily per process, so a reader survives DataLoader worker forks.

Trust, cheaply: a shard's sha256 is checked against the manifest the first time the shard is
opened, and remembered by (size, mtime) in `.verified.json`, so a resumed or repeated run does
not hash the cache again (hashing a shard costs about as much as reading it once). Every sample's
features are also checked to be finite: NaN bytes that passed the checksum (the cache was written
with them) stop training with the shard's name instead of training a NaN head.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from ..errors import StageError, UsageError
from ..run_folder.manifest import atomic_write_json, read_json, read_manifest, sha256_file, verify_shards
from .storage import OPTIONAL_KEYS, decode, feature_keys
from .validate import check_manifest, check_shard, check_vocab_file, damaged, read_header

INDEX_FILE = "index.safetensors"
VOCAB_FILE = "vocab.safetensors"
VERIFIED_FILE = ".verified.json"
REBUILD = "eagle3 cache --run runs/NAME"


class CacheReader:
    def __init__(self, cache_dir: str | Path):
        self.dir = Path(cache_dir)
        self.manifest = read_manifest(self.dir, "cache", REBUILD, schema=None)  # check_manifest: its typed reader
        m = self.manifest
        check_manifest(self.dir, m)  # every field read below, with its type; files inside the folder
        missing = [s["file"] for s in m["shards"] if not (self.dir / s["file"]).exists()]
        missing += [f for f in (INDEX_FILE, VOCAB_FILE) if not (self.dir / f).exists()]
        if missing:
            raise UsageError(
                f"cache {self.dir} is incomplete: missing {', '.join(missing[:5])}"
                + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""),
                "every file the cache manifest lists",
                f"eagle3 cache --verify {self.dir}, then rebuild with `{REBUILD}` (completed shards are kept)",
            )
        problems = verify_shards(self.dir, m.get("files", []))  # vocab + index: small, checked every time
        if problems:
            raise StageError(
                f"cache {self.dir} is damaged: " + "; ".join(problems),
                "files whose size and sha256 match the cache manifest",
                f"eagle3 cache --verify {self.dir}, then rebuild with `{REBUILD}`",
            )
        self.storage: str = m["storage"]
        self.target: dict = m["target"]
        self.aux_layer_ids: tuple[int, ...] = tuple(m["aux_layer_ids"])
        self.draft_vocab_size: int = int(m["draft_vocab_size"])
        self.hidden_size: int = int(m["target"]["hidden_size"])
        self.teacher: str = "topk" if self.storage == "compact" else "last_hidden"
        read_header(self.dir, self.dir / VOCAB_FILE)  # checksummed, but the manifest may have been rewritten too
        read_header(self.dir, self.dir / INDEX_FILE)
        vocab = load_file(str(self.dir / VOCAB_FILE))
        check_vocab_file(self.dir, self.dir / VOCAB_FILE, m, vocab)
        self.d2t: torch.Tensor = vocab["d2t"].to(torch.int64)
        self.t2d: torch.Tensor = vocab["t2d"].to(torch.bool)
        # assistant-token frequencies the draft vocab was chosen from (absent in hand-made caches)
        self.token_counts: torch.Tensor | None = vocab.get("token_counts")
        index = load_file(str(self.dir / INDEX_FILE)).get("lengths")
        if index is None or index.dim() != 1:
            raise damaged(self.dir, INDEX_FILE, "lacks a 1-dim `lengths`", "the index `eagle3 cache` writes")
        self.lengths: list[int] = index.tolist()
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
        self._keys: dict[int, set[str]] = {}
        self._pid = os.getpid()
        self._verified: dict | None = None

    def __len__(self) -> int:
        return len(self.lengths)

    def _shard(self, j: int):
        if self._pid != os.getpid():  # forked worker: do not share mmaps/handles with the parent
            self._handles.clear()
            self._offsets.clear()
            self._keys.clear()
            self._pid = os.getpid()
        h = self._handles.get(j)
        if h is None:
            self._verify(j)
            # structure, dtypes, offsets, ids in the vocab: a crafted shard whose checksum was rewritten too
            offsets = check_shard(self.dir, self.manifest["shards"][j], self.manifest)
            h = safe_open(str(self.dir / self.manifest["shards"][j]["file"]), framework="pt")
            self._handles[j] = h
            self._offsets[j] = offsets
            self._keys[j] = set(h.keys())
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
        raw.update({k: h.get_slice(k)[a:b] for k in OPTIONAL_KEYS[self.storage] if k in self._keys[j]})
        out = {
            "input_ids": h.get_slice("input_ids")[a:b].to(torch.int64),
            "loss_mask": h.get_slice("loss_mask")[a:b].to(torch.bool),
        }
        out.update(decode(self.storage, raw))
        bad = [k for k, v in out.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
        if bad:
            name = self.manifest["shards"][j]["file"]
            raise StageError(
                f"cache {self.dir}: {name} holds non-finite values (NaN/inf) in {', '.join(bad)} of sample {local} "
                f"(global sample {i})",
                "finite target features (a NaN here would train a NaN head)",
                f"eagle3 cache --verify {self.dir} checks every shard; rm {self.dir / name} and rerun the cache "
                "command to recompute it (if the target itself overflows, cache with --dtype fp32)",
            )
        return out

    def where(self, i: int) -> str:
        """'shard-00003.safetensors sample 12': where global sample i lives (for error messages)."""
        j = bisect_right(self._starts, i) - 1
        return f"{self.manifest['shards'][j]['file']} sample {i - self._starts[j]}"

    # ---------------------------------------------------------------- checksums
    def _verify(self, j: int) -> None:
        """Check shard j's size and sha256 against the manifest, unless this (size, mtime) passed before."""
        s = self.manifest["shards"][j]
        path = self.dir / s["file"]
        st = path.stat()
        stamp = [st.st_size, st.st_mtime_ns]
        memo = self._memo()
        if memo.get(s["file"]) == [*stamp, s["sha256"]]:
            return
        if st.st_size != s["bytes"]:
            problem = f"{st.st_size} bytes, the manifest says {s['bytes']}"
        elif sha256_file(path) != s["sha256"]:
            problem = "its sha256 does not match the manifest (corrupted or modified)"
        else:
            memo[s["file"]] = [*stamp, s["sha256"]]
            try:  # best effort: a read-only cache is verified again next run
                atomic_write_json(self.dir / VERIFIED_FILE, memo)
            except OSError:
                pass
            return
        raise StageError(
            f"cache {self.dir}: {s['file']} is damaged: {problem}",
            "shards whose size and sha256 match the cache manifest",
            f"rm {path} and rerun the cache command, which recomputes only that shard "
            f"(eagle3 cache --verify {self.dir} checks them all)",
        )

    def _memo(self) -> dict:
        if self._verified is None:
            try:
                memo = read_json(self.dir / VERIFIED_FILE)
                self._verified = memo if isinstance(memo, dict) else {}
            except (OSError, ValueError):
                self._verified = {}
        return self._verified
