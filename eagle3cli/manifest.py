"""The run-folder contract: atomic writes, checksums, fingerprints, manifests.

Every stage writes `manifest.json` atomically and last; the next stage reads it and refuses
inputs that do not match its own (target, tokenizer/template, layer ids, vocab size).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
import time
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from .errors import StageError, UsageError

MANIFEST = "manifest.json"
SCHEMA_VERSION = 1


# ---------------------------------------------------------------- atomic writes
def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a temp file in the same folder + fsync + rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


# ---------------------------------------------------------------- checksums
def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def shard_record(path: Path, **extra: Any) -> dict:
    """What a manifest stores per shard: name, bytes, sha256 (+ caller's counts)."""
    path = Path(path)
    return {"file": path.name, "bytes": path.stat().st_size, "sha256": sha256_file(path), **extra}


def verify_shards(folder: Path, shards: list[dict]) -> list[str]:
    """Re-check every shard listed in a manifest; returns a list of problems (empty = all good)."""
    problems = []
    for s in shards:
        p = Path(folder) / s["file"]
        if not p.exists():
            problems.append(f"{s['file']}: missing")
        elif p.stat().st_size != s["bytes"]:
            problems.append(f"{s['file']}: {p.stat().st_size} bytes, manifest says {s['bytes']}")
        elif sha256_file(p) != s["sha256"]:
            problems.append(f"{s['file']}: checksum mismatch (corrupted or modified)")
    return problems


# ---------------------------------------------------------------- fingerprints
def _safetensors_header_digest(path: Path, h: hashlib._Hash) -> None:
    # The header names every tensor with dtype, shape and byte offsets; with a 1 MiB sample of the
    # data this identifies a checkpoint without reading 16 GB of weights.
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        h.update(f.read(n))
        size = path.stat().st_size
        f.seek(max(8 + n, size // 2))
        h.update(f.read(1 << 20))


def model_fingerprint(model_dir: Path) -> str:
    """A cheap, stable identity of a local model folder: config + weight headers + data samples."""
    model_dir = Path(model_dir)
    h = hashlib.sha256()
    cfg = model_dir / "config.json"
    if cfg.exists():
        h.update(json.dumps(json.loads(cfg.read_text()), sort_keys=True).encode())
    for f in sorted(model_dir.glob("*.safetensors")):
        h.update(f.name.encode())
        h.update(str(f.stat().st_size).encode())
        _safetensors_header_digest(f, h)
    for f in sorted(model_dir.glob("*.bin")):
        h.update(f.name.encode())
        h.update(str(f.stat().st_size).encode())
    return h.hexdigest()[:16]


def tokenizer_fingerprint(tokenizer) -> dict:
    """Hash of the vocabulary and of the chat template: either changing invalidates data and caches."""
    vocab = tokenizer.get_vocab()
    vocab_hash = sha256_text(json.dumps(sorted(vocab.items(), key=lambda kv: kv[1])))[:16]
    template = getattr(tokenizer, "chat_template", None) or ""
    return {
        "vocab_hash": vocab_hash,
        "chat_template_hash": sha256_text(template)[:16],
        "tokenizer_vocab_size": len(tokenizer),
    }


# ---------------------------------------------------------------- provenance
def package_versions() -> dict:
    out = {"python": platform.python_version()}
    for pkg in ("eagle3cli", "torch", "transformers", "deepspeed", "datasets", "sglang"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def write_manifest(folder: Path, stage: str, **fields: Any) -> Path:
    """Write `folder/manifest.json` atomically, with schema version, stage, time and versions."""
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "stage": stage,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": package_versions(),
        **fields,
    }
    path = Path(folder) / MANIFEST
    atomic_write_json(path, manifest)
    return path


def read_manifest(folder: Path, stage: str, produced_by: str) -> dict:
    """Read a previous stage's manifest, or explain which command makes it."""
    path = Path(folder) / MANIFEST
    if not Path(folder).exists():
        raise UsageError(f"{folder} does not exist", f"a folder written by `eagle3 {stage}`", produced_by)
    if not path.exists():
        raise UsageError(
            f"{folder} has no manifest.json: the `{stage}` stage never finished there",
            f"a completed `eagle3 {stage}` output folder",
            produced_by,
        )
    try:
        m = read_json(path)
    except json.JSONDecodeError as e:
        raise UsageError(f"{path} is not valid JSON ({e})", "a manifest written by eagle3", produced_by) from e
    if m.get("stage") != stage:
        raise UsageError(
            f"{path} was written by stage '{m.get('stage')}', not '{stage}'",
            f"the output folder of `eagle3 {stage}`",
            produced_by,
        )
    return m


def check_matches(what: str, found: Mapping[str, Any], expected: Mapping[str, Any], next_step: str) -> None:
    """Refuse a mismatch between an input's recorded identity and ours, listing every difference."""
    diffs = [
        f"  {k}: {what} has {found.get(k)!r}, expected {v!r}"
        for k, v in expected.items()
        if v is not None and found.get(k) is not None and found.get(k) != v
    ]
    if diffs:
        raise StageError(
            f"{what} does not match this run:\n" + "\n".join(diffs),
            "inputs produced with the same target model, tokenizer/chat template and layer ids",
            next_step,
        )
