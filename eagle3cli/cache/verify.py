"""`eagle3 cache --verify DIR`: a finished cache checked end to end, without the training run
finding out later: checksums, shard structure, finite features, the target, the draft vocab."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import StageError, UsageError
from ..model.target import open_target
from ..run_folder.manifest import check_matches, read_manifest, verify_shards
from ..speculate.aux_layers import aux_layer_problems
from .plan import rerun_cmd
from .reader import VOCAB_FILE
from .storage import feature_keys
from .validate import check_manifest, check_shard, check_vocab_file


def nonfinite_features(f, storage: str, rows: int = 8192) -> str | None:
    """The first feature tensor of an open shard holding a NaN/inf (read in row chunks), or None."""
    for key in feature_keys(storage):
        sl = f.get_slice(key)
        for a in range(0, sl.get_shape()[0], rows):
            t = sl[a : a + rows]
            if t.is_floating_point() and not bool(torch.isfinite(t.float()).all()):
                return key
    return None


def stray_files(cache_dir: Path) -> list[str]:
    """Files a finished cache does not list: temps of killed writes (ours, or a library's) and
    anything else put there."""
    from ..run_folder.folders import foreign_files
    from .run import CACHE_FILES

    temps = sorted(p.name for p in cache_dir.glob(".*.tmp") if p.is_file())
    return temps + foreign_files(cache_dir, CACHE_FILES)


def verify_cache(cache_dir: Path, target: str | None = None) -> dict:
    """Checksums, shard structure, and the manifest against the target; StageError on any problem."""
    cache_dir = Path(cache_dir)
    m = read_manifest(cache_dir, "cache", "eagle3 cache --run runs/NAME", schema=None)
    check_manifest(cache_dir, m, verifying=True)  # the fields read below, with their types
    rebuild = rerun_cmd(m.get("config") or {}, cache_dir)
    problems = verify_shards(cache_dir, m["shards"] + m.get("files", []))
    if problems:
        bad = [p.split(":")[0] for p in problems]
        raise StageError(
            f"cache {cache_dir} failed verification:\n  " + "\n  ".join(problems),
            "files whose size and sha256 match the cache manifest",
            f"remove the damaged file(s) and rerun the same cache command, which recomputes only those: "
            f"rm {' '.join(str(cache_dir / b) for b in bad)} && {rebuild}",
        )
    from safetensors import safe_open

    for s in m["shards"]:
        try:  # header, dtypes against bytes, shapes against the manifest's counts, offsets, ids in the vocab
            check_shard(cache_dir, s, m)
        except StageError as e:
            raise StageError(e.what, e.expected, f"rm {cache_dir / s['file']} && {rebuild}") from None
        with safe_open(str(cache_dir / s["file"]), framework="pt") as f:
            nonfinite = nonfinite_features(f, m["storage"])
            if nonfinite:  # written that way (a NaN target forward): the checksum matches, training would not
                raise StageError(
                    f"{s['file']}: {nonfinite} holds non-finite values (NaN/inf)",
                    "finite target features",
                    f"rm {cache_dir / s['file']} && {rebuild}   (check the target's dtype: --dtype fp32)",
                )
    target_ref = target or m["target"].get("path")
    if not target_ref or not Path(target_ref).exists():
        raise UsageError(
            f"the cache's target {target_ref!r} is not on this machine",
            "the target model folder the cache was made with",
            f"eagle3 cache --verify {cache_dir} --target MODEL_DIR",
        )
    opened = open_target(target_ref)
    path, ident = opened.path, opened.identity
    check_matches(
        f"cache {cache_dir}",
        m["target"],
        ident.comparable(),
        f"rebuild the cache for this target: eagle3 cache --run runs/NAME --target {path}",
    )
    errs = aux_layer_problems(m["aux_layer_ids"], ident.num_hidden_layers)
    if errs:
        raise StageError("; ".join(errs), "aux layer ids of this target", f"rebuild: {rebuild}")
    from safetensors.torch import load_file

    vocab = load_file(str(cache_dir / VOCAB_FILE))
    check_vocab_file(cache_dir, cache_dir / VOCAB_FILE, m, vocab)  # sizes and the map (speculate.vocab)
    stray = stray_files(cache_dir)
    if stray:
        from ..console import human_bytes, warn

        size = sum((cache_dir / n).stat().st_size for n in stray)
        warn(
            f"{len(stray)} file(s) in {cache_dir} are not part of the cache ({human_bytes(size)}), e.g. temps of "
            f"killed writes: {', '.join(stray[:6])}; a rerun of the cache command removes its own dead temps, "
            f"or: rm {' '.join(str(cache_dir / n) for n in stray[:6])}"
        )
    return {
        "stray files": len(stray),
        "cache": str(cache_dir),
        "shards": len(m["shards"]),
        "samples": m["counts"]["samples"],
        "tokens": m["counts"]["tokens"],
        "target": str(path),
        "fingerprint": ident.fingerprint,
        "aux_layer_ids": m["aux_layer_ids"],
        "storage": m["storage"],
    }
