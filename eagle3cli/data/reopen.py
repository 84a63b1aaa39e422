"""A finished gen-data folder met again: refused when its inputs changed (another plan), reopened for
exactly the shards that no longer match its manifest."""

from __future__ import annotations

import json
from pathlib import Path

from ..console import warn
from ..errors import StageError
from ..readers.jsonl import dumps, split_byte_lines
from ..run_folder.manifest import (
    MANIFEST,
    atomic_write_text,
    sha256_file,
    sha256_text,
    verify_shards,
)
from .formats import ReadResult
from .journal import (
    PROGRESS,
    REJECTS,
    shard_name,
)


def refuse_changed_inputs(out: Path, manifest: dict, results: list[ReadResult], plan_ids_hash: str) -> None:
    """A finished folder made from other input bytes is another plan: regenerating only the shards
    that look missing would mix two plans (records duplicated, others never generated)."""
    recorded = manifest.get("plan_ids_hash")
    now: dict[str, str] = {r.spec.spec: r.sha256 for r in results if r.sha256}
    was: dict[str, str] = {
        str(d.get("spec")): str(d["sha256"])
        for d in manifest.get("inputs") or []
        if isinstance(d, dict) and d.get("sha256")
    }
    changed = [s for s in now if s in was and was[s] != now[s]]
    if (recorded is None or recorded == plan_ids_hash) and not changed:
        return
    what = (
        "; ".join(f"{s}: sha256 {was[s][:12]}... -> {now[s][:12]}..." for s in changed)
        or "the planned conversations differ"
    )
    raise StageError(
        f"{out} is a finished gen-data run over other input bytes ({what}): the plan changed, so it cannot be "
        "topped up (shards would mix two plans); nothing was changed",
        "the same input files as the finished run",
        f"write the new data into a new folder (--run runs/OTHER or --out NEW), or delete {out} to start over",
    )


def reopen_damaged(out: Path, manifest: dict, plan: list[dict], shard_size: int, n_read_rejects: int) -> list[str]:
    """A finished folder whose shards no longer match its manifest (a shard deleted, cut or edited)
    is reopened: the good shards stay, their generation rejects go back to `progress/`, the bad
    ones are removed and the manifest last, so the run regenerates exactly those (and a kill
    during this leaves the manifest, and the same repair next time). Returns the bad names.

    A `rejects.jsonl` that no longer matches its checksum costs no shard: its records are read
    back (blank or cut lines skipped); when that restores the recorded bytes (an extra newline)
    the file is rewritten and nothing else changes; otherwise each good shard keeps the rejects
    that name its conversations, and only a shard whose conversations are neither written nor
    rejected is regenerated."""
    n_shards = (len(plan) + shard_size - 1) // shard_size
    listed = {s.get("file"): s for s in manifest.get("shards") or [] if isinstance(s, dict)}
    bad = [k for k in range(n_shards) if shard_name(k) not in listed or verify_shards(out, [listed[shard_name(k)]])]
    rej = manifest.get("rejects") or {}
    rejects_ok = (out / REJECTS).is_file() and rej.get("sha256") in (None, sha256_file(out / REJECTS))
    if not bad and rejects_ok:
        return []
    records = _readable_records(out / REJECTS) if (out / REJECTS).is_file() else []
    if not rejects_ok and not bad:
        canonical = "".join(dumps(r) + "\n" for r in records)
        if sha256_text(canonical) == rej.get("sha256"):  # the same records, reformatted: restore the bytes
            atomic_write_text(out / REJECTS, canonical)
            warn(f"{out / REJECTS} had changed in form only (blank lines); restored it, no shard touched")
            return []
    shard_of = {p["id"]: i // shard_size for i, p in enumerate(plan)}
    per_shard: dict[int, list[str]] = {k: [] for k in range(n_shards)}
    rejected: set[str] = set()
    gen = records[n_read_rejects:] if rejects_ok else [r for r in records if r.get("id") in shard_of]
    for r in gen:  # finalize writes the read rejects first
        k = shard_of.get(r.get("id"))
        if k is not None:
            per_shard[k].append(dumps(r) + "\n")
            rejected.add(r["id"])
    if not rejects_ok:  # a good shard must account for each of its conversations: written or rejected
        for k in range(n_shards):
            if k in bad:
                continue
            written = {r.get("id") for r in _readable_records(out / shard_name(k))}
            ids = [p["id"] for p in plan[k * shard_size : (k + 1) * shard_size]]
            if any(i not in written and i not in rejected for i in ids):
                bad.append(k)
    prog_dir = out / PROGRESS
    for k in range(n_shards):
        if k not in bad:
            atomic_write_text(prog_dir / f"rejects-{k:05d}.jsonl", "".join(per_shard[k]))
    for k in bad:
        (out / shard_name(k)).unlink(missing_ok=True)
    (out / MANIFEST).unlink()
    names = [shard_name(k) for k in sorted(bad)]
    return names if rejects_ok else [f"{REJECTS} (rebuilt from the readable records)", *names]


def _readable_records(path: Path) -> list[dict]:
    """The JSON objects of a JSONL file, skipping lines that are not (cut or edited by hand)."""
    out = []
    for line in split_byte_lines(path.read_bytes()):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict):
            out.append(r)
    return out
