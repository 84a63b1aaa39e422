"""The gen-data output folder while it is being written: its state, the journals, finished shards.

Plan position p goes to shard p // shard_size. While a shard is being generated, each finished
conversation is appended to `progress/shard-NNNNN.journal.jsonl`; when the shard is complete its
records are written in plan order to `shard-NNNNN.jsonl` (atomically: the file's existence means
"done") and the journal is removed. A half-written journal line (a kill -9) is dropped.
`progress/state.json` records the target and plan settings, so a rerun with other settings is
refused instead of mixing two datasets.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from ..errors import StageError, UsageError
from ..readers.jsonl import dumps, split_byte_lines
from ..run_folder.folders import manifest_stage
from ..run_folder.lock import LOCK_NAME
from ..run_folder.manifest import MANIFEST, atomic_write_text, check_matches, read_json
from .config import PLAN_FIELDS, GenDataConfig

PROGRESS = "progress"
STATE = "state.json"
REJECTS = "rejects.jsonl"
# Reject reasons that older versions recorded for transient endpoint failures (now left pending).
TRANSIENT_REASONS = ("endpoint_error", "bad_response")


def shard_name(k: int) -> str:
    return f"shard-{k:05d}.jsonl"


# Plan settings added since a folder was written whose default is not what that version did.
LEGACY_PLAN = {"exclude_eval": False}


def recorded_plan(recorded: dict) -> dict:
    """The plan settings a folder recorded, with the ones its version did not have yet (added
    since) at what that version did (their default, or LEGACY_PLAN), so its run resumes."""
    out = {}
    for f in dataclasses.fields(GenDataConfig):
        if f.name not in PLAN_FIELDS:
            continue
        if f.name in recorded:
            out[f.name] = recorded[f.name]
        elif f.name in LEGACY_PLAN:
            out[f.name] = LEGACY_PLAN[f.name]
        else:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            out[f.name] = list(default) if isinstance(default, tuple) else default
    return out


def check_engine(out: Path, recorded: dict | None, engine, nxt: str) -> None:
    """A corpus is never resumed on another engine or dtype (greedy texts differ between them)."""
    old = {k: (recorded or {}).get(k) for k in ("engine", "dtype")}
    new = engine.comparable() if engine is not None else {"engine": None, "dtype": None}
    if old != new:
        raise StageError(
            f"{out} was regenerated with engine {old['engine'] or 'none'} ({old['dtype'] or 'no dtype recorded'}), "
            f"this run would use {new['engine'] or 'none'} ({new['dtype'] or 'no dtype recorded'})",
            "the same --engine and --dtype as the run that started the folder",
            nxt,
        )


def check_folder(out: Path, identity, pcfg: dict, plan_ids_hash: str, engine=None) -> dict | None:
    """Refuse a folder made with another target or other plan settings; returns an existing
    finished manifest (nothing to do) or None."""
    nxt = f"choose a new folder (--run runs/OTHER), or delete {out} to start over"
    other = "choose a new folder for gen-data (--run runs/OTHER or --out NEW); that one is not gen-data's to change"
    if (out / MANIFEST).exists():
        stage = manifest_stage(out)
        if stage != "gen-data":
            what = (
                f"the output of `eagle3 {stage}`" if stage else f"a {MANIFEST} eagle3 did not write (or a damaged one)"
            )
            raise UsageError(
                f"{out} holds {what}, not gen-data's", "a new or empty folder, or a gen-data folder", other
            )
        m = read_json(out / MANIFEST)
        check_matches(f"data folder {out}", m.get("target", {}), identity.comparable(), nxt)
        old = recorded_plan(m.get("config", {}))
        check_engine(out, m.get("engine"), engine, nxt)
        if old != pcfg:
            diffs = ", ".join(f"{k}: {old[k]!r} -> {pcfg[k]!r}" for k in PLAN_FIELDS if old[k] != pcfg[k])
            raise StageError(
                f"{out} was generated with other settings ({diffs})", "the same inputs and sampling settings", nxt
            )
        return m
    state_path = out / PROGRESS / STATE
    if state_path.exists():
        st = read_json(state_path)
        check_matches(f"unfinished data folder {out}", st.get("target", {}), identity.comparable(), nxt)
        old = recorded_plan(st.get("plan_config", {}))
        check_engine(out, st.get("engine"), engine, nxt)
        if old != pcfg or st.get("plan_ids_hash") != plan_ids_hash:
            diffs = (
                ", ".join(f"{k}: {old.get(k)!r} -> {pcfg[k]!r}" for k in PLAN_FIELDS if old.get(k) != pcfg[k])
                or "the input files changed"
            )
            raise StageError(
                f"{out} holds an unfinished run with other settings ({diffs})",
                "the same command as the interrupted run",
                nxt,
            )
        return None
    # (a `progress/` without state.json is a run killed before it wrote its first byte of state)
    ours = (".gitkeep", PROGRESS, REJECTS)  # and locks: .lock, .lock.shard-i-of-N of --shard processes
    foreign = (
        sorted(p.name for p in out.iterdir() if p.name not in ours and not p.name.startswith(LOCK_NAME))
        if out.is_dir()
        else []
    )
    if foreign:
        raise UsageError(
            f"{out} exists and is not a gen-data folder (it holds {', '.join(foreign[:6])})",
            "an empty or new folder",
            other,
        )
    return None


def read_journal(path: Path) -> dict[int, dict]:
    """Entries by plan index. A line cut by a kill is dropped (and cut off the file)."""
    if not path.exists():
        return {}
    data = path.read_bytes()
    good_end = data.rfind(b"\n") + 1
    entries = {}
    for line in split_byte_lines(data[:good_end]):
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue
        entries[e["plan_index"]] = e
    if good_end != len(data):
        with open(path, "r+b") as f:
            f.truncate(good_end)
    return entries


class Journal:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(path, "a", encoding="utf-8")

    def add(self, entry: dict) -> None:
        # flush per conversation: a kill -9 then loses nothing already finished (page cache survives it).
        self.f.write(dumps(entry) + "\n")
        self.f.flush()

    def close(self) -> None:
        if self.f.closed:  # closed when its shard completed, then again on the way out
            return
        os.fsync(self.f.fileno())
        self.f.close()


def finish_shard(out: Path, k: int, entries: list[dict]) -> None:
    """Rejects first, then the shard (its existence marks the shard done), then the journal goes."""
    prog_dir = out / PROGRESS
    rejects = [e["reject"] for e in entries if "reject" in e]
    atomic_write_text(prog_dir / f"rejects-{k:05d}.jsonl", "".join(dumps(r) + "\n" for r in rejects))
    atomic_write_text(out / shard_name(k), "".join(dumps(e["record"]) + "\n" for e in entries if "record" in e))
    (prog_dir / f"shard-{k:05d}.journal.jsonl").unlink(missing_ok=True)
