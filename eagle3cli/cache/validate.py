"""The cache's one validating reader of its own files: the manifest's shape and every shard's
structure, checked before a byte of them is used, by `CacheReader` (train) and `cache --verify` alike.

A cache folder is data that may have been edited by hand, damaged, or crafted: a manifest without
`shards` ended train in a `KeyError`, `samples: "eleven"` in a `ValueError`, a header length past
the end of a shard in a `SafetensorError`, an input id of 30000 with a 4096-token vocab (or -7) in
an `IndexError` inside the embedding. Each is a `StageError` here (exit 2) naming the file and what
is wrong, with `eagle3 cache --verify` as the next step. The checks read the shard's header and
its small tensors (ids, mask, offsets: a few bytes per token), never the features.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import StageError
from ..run_folder.manifest import MANIFEST, SCHEMA_VERSION, contained, for_run
from ..speculate.vocab import map_problems
from .storage import OPTIONAL_KEYS, feature_keys

STORAGES = ("bf16", "fp8", "compact")
ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
_IDS = ("I16", "I32")
_FP8 = "F8_E4M3"
# the dtype each tensor is written in (cache/storage.py, cache/writer.py), by storage
DTYPES: dict[str, dict[str, tuple[str, ...]]] = {
    s: {
        "input_ids": _IDS,
        "loss_mask": ("BOOL",),
        "offsets": ("I64",),
        "target_argmax": _IDS,
        "aux_hidden": ("BF16",) if s == "bf16" else (_FP8,),
        "last_hidden": ("BF16",) if s == "bf16" else (_FP8,),
        "aux_scale": ("BF16",),
        "last_scale": ("BF16",),
        "topk_ids": _IDS,
        "topk_logprobs": ("F16",),
    }
    for s in STORAGES
}
MAX_HEADER = 100 << 20  # safetensors' own limit on a header


def _next(cache_dir: Path, verifying: bool = False) -> str:
    rebuild = for_run(
        "rebuild the cache with the command that made it (eagle3 cache --run runs/NAME: shards removed are "
        "recomputed, the rest kept)",
        cache_dir,
    )
    return rebuild if verifying else f"eagle3 cache --verify {cache_dir} names every problem; {rebuild}"


def damaged(cache_dir: Path, file: str, what: str, expected: str) -> StageError:
    return StageError(f"cache {cache_dir}: {file} {what}", expected, _next(cache_dir))


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def check_manifest(cache_dir: Path, m: Mapping[str, Any], verifying: bool = False) -> None:
    """Every field of a cache manifest the stages read, with its type, or one StageError listing all
    that are wrong (a missing target fingerprint too: it would silently skip the identity check)."""
    for key in ("shards", "files"):  # first: a file outside the folder is refused on its own, with no rm advice
        recs = m.get(key)
        for s in recs if isinstance(recs, list) else ():
            if isinstance(s, dict) and isinstance(s.get("file"), str):
                contained(cache_dir, s["file"])
    problems: list[str] = []
    v = m.get("schema_version")
    if v != SCHEMA_VERSION:
        problems.append(f"schema_version {v!r} (this eagle3 reads {SCHEMA_VERSION}: written by another version?)")
    if m.get("storage") not in STORAGES:
        problems.append(f"storage {m.get('storage')!r} is not one of {', '.join(STORAGES)}")
    target = m.get("target")
    if not isinstance(target, dict):
        problems.append("target is missing (the target's identity)")
    else:
        if not isinstance(target.get("fingerprint"), str) or not target["fingerprint"]:
            problems.append("target.fingerprint is missing: the cache could not be checked against its target")
        for k in ("hidden_size", "vocab_size"):
            if not _count(target.get(k)) or not target[k]:
                problems.append(f"target.{k} {target.get(k)!r} is not a positive integer")
    ids = m.get("aux_layer_ids")
    if not isinstance(ids, list) or not ids or not all(_count(i) for i in ids):
        problems.append(f"aux_layer_ids {ids!r} is not a list of layer numbers")
    if not _count(m.get("draft_vocab_size")) or not m["draft_vocab_size"]:
        problems.append(f"draft_vocab_size {m.get('draft_vocab_size')!r} is not a positive integer")
    counts = m.get("counts")
    if not isinstance(counts, dict) or not all(_count(counts.get(k)) for k in ("samples", "tokens")):
        problems.append("counts.samples / counts.tokens are not counts")
    for key, required in (("shards", True), ("files", False)):
        recs = m.get(key)
        if recs is None and not required:
            continue
        if not isinstance(recs, list):
            problems.append(f"{key} is {'missing' if recs is None else type(recs).__name__}, expected a list of files")
            continue
        for i, s in enumerate(recs):
            fields = ("file", "bytes", "sha256", *(("samples", "tokens") if key == "shards" else ()))
            bad = (
                [
                    f"{f}={s.get(f)!r}"
                    for f in fields
                    if not (isinstance(s.get(f), str) if f in ("file", "sha256") else _count(s.get(f)))
                ]
                if isinstance(s, dict)
                else ["not an object"]
            )
            if bad:
                problems.append(f"{key}[{i}]: {', '.join(bad)[:200]}")
    if problems:
        raise StageError(
            f"cache {cache_dir}: {MANIFEST} is not a cache manifest this eagle3 can read:\n  " + "\n  ".join(problems),
            "the manifest `eagle3 cache` writes (it is not edited by hand)",
            _next(cache_dir, verifying),
        )


def read_header(cache_dir: Path, path: Path) -> dict[str, dict]:
    """A safetensors header whose every tensor has a known dtype, a shape whose bytes are exactly its
    data offsets, and offsets inside the file that do not overlap; else StageError."""
    name = path.name
    expected = "a safetensors file as `eagle3 cache` writes it"
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        n = int.from_bytes(raw, "little") if len(raw) == 8 else -1
        if not 0 < n <= min(size - 8, MAX_HEADER):
            raise damaged(
                cache_dir,
                name,
                f"has a header length of {n} bytes, the file {size} (cut short or not safetensors)",
                expected,
            )
        try:
            header = json.loads(f.read(n))
        except (ValueError, RecursionError) as e:
            raise damaged(cache_dir, name, f"has a header that is not JSON ({type(e).__name__})", expected) from None
    if not isinstance(header, dict):
        raise damaged(cache_dir, name, "has a header that is not a JSON object", expected)
    data = size - 8 - n
    spans = []
    tensors = {}
    for k, t in header.items():
        if k == "__metadata__":
            continue
        ok = (
            isinstance(t, dict)
            and t.get("dtype") in ITEMSIZE
            and isinstance(t.get("shape"), list)
            and all(_count(d) for d in t["shape"])
            and isinstance(t.get("data_offsets"), list)
            and len(t["data_offsets"]) == 2
            and all(_count(o) for o in t["data_offsets"])
        )
        if not ok:
            raise damaged(cache_dir, name, f"describes tensor {k!r} as {str(t)[:120]}", expected)
        a, b = t["data_offsets"]
        if not a <= b <= data:
            raise damaged(cache_dir, name, f"puts tensor {k!r} at bytes {a}..{b}, past its {data} data bytes", expected)
        want = math.prod(t["shape"]) * ITEMSIZE[t["dtype"]]
        if b - a != want:
            raise damaged(
                cache_dir,
                name,
                f"gives tensor {k!r} ({t['dtype']} {t['shape']}) {b - a} bytes; that dtype and shape take {want}",
                expected,
            )
        spans.append((a, b, k))
        tensors[k] = t
    spans.sort()
    end, last = 0, ""  # the furthest end so far: a span inside an earlier long one overlaps it too
    for a, b, k in spans:
        if a < end:
            raise damaged(cache_dir, name, f"stores tensors {last!r} and {k!r} in overlapping bytes", expected)
        if b > end:
            end, last = b, k
    return tensors


def check_shard(cache_dir: Path, rec: Mapping[str, Any], m: Mapping[str, Any]) -> list[int]:
    """Shard `rec` holds what the (checked) manifest says: every tensor of its storage in its dtype and
    shape, `offsets` from 0 to its token count, ids inside the target's vocab. Returns the offsets."""
    from safetensors import safe_open

    path = Path(cache_dir) / rec["file"]
    header = read_header(cache_dir, path)  # before safetensors parses it: its errors name no file
    with safe_open(str(path), framework="pt") as f:
        return _check_tensors(cache_dir, rec, m, header, f)


def _check_tensors(cache_dir: Path, rec: Mapping[str, Any], m: Mapping[str, Any], header: dict, f) -> list[int]:
    name = rec["file"]
    storage = m["storage"]
    needed = ("input_ids", "loss_mask", "offsets", *feature_keys(storage))
    missing = [k for k in needed if k not in header]
    if missing:
        raise damaged(
            cache_dir, name, f"lacks {', '.join(missing)} (storage {storage})", f"the tensors of a {storage} cache"
        )
    n_aux, hidden = len(m["aux_layer_ids"]), m["target"]["hidden_size"]
    tokens, samples = rec["tokens"], rec["samples"]
    width = {"aux_hidden": n_aux * hidden, "last_hidden": hidden, "aux_scale": n_aux, "last_scale": 1}
    for k in (*needed, *(k for k in OPTIONAL_KEYS[storage] if k in header)):
        t = header[k]
        if t["dtype"] not in DTYPES[storage].get(k, (t["dtype"],)):
            raise damaged(cache_dir, name, f"stores {k} as {t['dtype']}", f"{k} in {' or '.join(DTYPES[storage][k])}")
        shape = t["shape"]
        if k == "offsets":
            want: list[int | None] = [samples + 1]
        elif k in width:
            want = [tokens, width[k]]
        elif k in ("topk_ids", "topk_logprobs"):
            want = [tokens, m.get("topk") if _count(m.get("topk")) else None]
        else:
            want = [tokens]
        if len(shape) != len(want) or any(w is not None and s != w for s, w in zip(shape, want)):
            raise damaged(
                cache_dir,
                name,
                f"holds {k} of shape {shape}",
                f"shape {[w if w is not None else 'k' for w in want]} for {samples} samples / {tokens} tokens",
            )
    offsets = f.get_tensor("offsets").tolist()
    if offsets[0] != 0 or offsets[-1] != tokens or any(b < a for a, b in zip(offsets, offsets[1:])):
        raise damaged(
            cache_dir,
            name,
            f"has offsets {str(offsets[:4])[:-1]}, ... {offsets[-1]}] that do not run from 0 to its {tokens} tokens",
            "non-decreasing offsets from 0 to the shard's token count",
        )
    vocab = m["target"]["vocab_size"]
    for k in ("input_ids", "target_argmax", "topk_ids"):
        if k in header and header[k]["shape"][0]:
            ids = f.get_tensor(k)
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= vocab:
                bad = lo if lo < 0 else hi
                raise damaged(
                    cache_dir,
                    name,
                    f"holds {k} {bad}, outside the target's vocab (0..{vocab - 1})",
                    "token ids of the target's tokenizer",
                )
    return offsets


def check_vocab_file(cache_dir: Path, path: Path, m: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> None:
    """vocab.safetensors holds d2t and t2d of the manifest's sizes, and a valid map (the one rule for
    maps, `speculate.vocab.map_problems`, which heads are read through too)."""
    d2t, t2d = tensors.get("d2t"), tensors.get("t2d")
    if d2t is None or t2d is None or d2t.dim() != 1 or t2d.dim() != 1:
        raise damaged(cache_dir, path.name, "lacks a 1-dim d2t or t2d", "the draft vocab maps `eagle3 cache` writes")
    if d2t.numel() != m["draft_vocab_size"] or t2d.numel() != m["target"]["vocab_size"]:
        raise damaged(
            cache_dir,
            path.name,
            f"maps {d2t.numel()} draft tokens over {t2d.numel()} target tokens",
            f"{m['draft_vocab_size']} draft tokens over the target's {m['target']['vocab_size']}",
        )
    bad = map_problems(d2t, t2d, int(m["target"]["vocab_size"]))
    if bad:
        raise damaged(cache_dir, path.name, "; ".join(bad), "a draft vocab map `eagle3 cache` writes")
