"""The end of a gen-data run: the dedup pass, the manifest over the shards (or over the finished ones,
--finish-early), the levers' and the throughput's records, and the errors that end a run without one."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

from ..config import config_dict
from ..console import print_table, warn
from ..errors import IncompleteError, UsageError
from ..readers.jsonl import dumps, read_records
from ..run_folder.manifest import (
    MANIFEST,
    atomic_write_json,
    atomic_write_text,
    sha256_file,
    sha256_text,
    shard_record,
    write_manifest,
)
from ..urls import redact_text
from . import dedup
from .config import GenDataConfig
from .journal import (
    PROGRESS,
    REJECTS,
    shard_name,
)
from .plan import Inputs, dedup_reference, input_fingerprints


def levers_summary(cfg: GenDataConfig, records: list[dict]) -> dict | None:
    """What the data levers made (the manifest's `levers`): settings and records written per kind; what
    each filter removed is in `counts.skipped_by_reason` (synth_*, near_duplicate, duplicate_answer...)."""
    if not (cfg.synthetic or cfg.answers_per_prompt > 1 or cfg.answer_temperatures or cfg.augment):
        return None
    out: dict[str, Any] = {}
    if cfg.synthetic:
        out["synthetic"] = {
            "planned": cfg.synthetic,
            "written": sum(1 for r in records if r["meta"].get("write_user")),
            "turns": cfg.synth_turns,
            "temperature": cfg.synth_temperature,
            "top_p": cfg.synth_top_p,
            "max_tokens": cfg.synth_max_tokens,
            "min_words": cfg.synth_min_words,
            "topics": str(cfg.synth_topics) if cfg.synth_topics else None,
            "near_dup": {
                "method": "MinHash LSH (datasketch), word 5-grams",
                "threshold": cfg.near_dup_threshold,
                "against": list(cfg.dedup_against),
            },  # fmt: skip
        }
    if cfg.answers_per_prompt > 1 or cfg.answer_temperatures:
        out["answers"] = {
            "per_prompt": cfg.answers_per_prompt,
            "temperatures": list(cfg.answer_temperatures) or [cfg.temperature],
            "written": sum(1 for r in records if "temperature" in r["meta"]),
        }
    if cfg.augment:
        names = Counter(r["meta"]["augmentation"] for r in records if "augmentation" in r["meta"])
        out["augment"] = {"file": str(cfg.augment), "fraction": cfg.augment_fraction, "written": dict(names)}
    return out


class Session:
    """This process's generation time and output, kept in `progress/sessions/` as shards finish, so
    the manifest's throughput covers every session of a corpus made over many (and survives kill -9
    up to the last finished shard)."""

    def __init__(self, prog_dir: Path):
        self.path = prog_dir / "sessions" / f"{os.uname().nodename}-{os.getpid()}-{int(time.time())}.json"
        self.t0 = time.time()

    def record(self, conversations: int, completion_tokens: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        now = time.time()
        d = {
            "seconds": round(now - self.t0, 2),
            "start": round(self.t0, 2),  # the clock interval: `--shard i/N` processes overlap in time
            "end": round(now, 2),
            "conversations": conversations,
            "completion_tokens": completion_tokens,
        }
        atomic_write_json(self.path, d)


def wall_seconds(rows: list[dict]) -> float:
    """Clock time covered by sessions: overlapping intervals (`--shard i/N` processes working side by
    side) count once; a session recorded without its interval (older eagle3) counts its own seconds."""
    spans = sorted((float(r["start"]), float(r["end"])) for r in rows if "start" in r and "end" in r)
    total = sum(float(r.get("seconds") or 0) for r in rows if not ("start" in r and "end" in r))
    merged: list[list[float]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return total + sum(b - a for a, b in merged)


def throughput(out: Path, elapsed: float, session_tokens: int, written: int) -> dict | None:
    """Generation rate over every session that worked on the folder (None if none was timed)."""
    rows = []
    for p in sorted((out / PROGRESS / "sessions").glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            rows.append(json.loads(p.read_text(encoding="utf-8")))
    seconds = wall_seconds(rows)
    if seconds <= 0:
        return None
    convs = sum(int(r.get("conversations") or 0) for r in rows)
    toks = sum(int(r.get("completion_tokens") or 0) for r in rows)
    return {
        "sessions": len(rows),
        "seconds": round(seconds, 1),  # clock time (side-by-side processes count once): the rates below are wall rates
        "process_seconds": round(sum(float(r.get("seconds") or 0) for r in rows), 1),
        "conversations": convs,
        "completion_tokens": toks,
        "conversations_per_s": round(convs / seconds, 3),
        "completion_tok_s": round(toks / seconds, 1),
    }


def finish_early(cfg, out: Path, identity, inputs: Inputs, n_shards: int, todo, journals, engine=None) -> Path:
    """--finish-early: the manifest over the finished shards of an unfinished run; the rest of the plan
    (including conversations done in unfinished shards) is left out, and the manifest says how much. The
    engine is recorded as a finished run records it, so the same command then finds the folder complete
    (without it, a rerun read the folder as made with no engine and refused it)."""
    done = [k for k in range(n_shards) if k not in todo]
    if not done:
        raise UsageError(
            f"{out} has no finished shard yet (a shard is {cfg.shard_size} conversations)",
            "an unfinished run with at least one finished shard",
            "run the same command without --finish-early until a shard is written, then finish early",
        )
    dropped = sum(len(j) for j in journals.values())
    if dropped:
        warn(f"{dropped} conversation(s) of unfinished shards are left out (only whole shards are kept)")
    partial = {"shards": len(done), "of_shards": n_shards, "conversations_planned": len(inputs.plan)}
    return finalize(
        cfg, out, identity, inputs.results, inputs.plan, inputs.read_rejects, done, 0.0, None, 0, partial,
        inputs.eval_check, engine,
    )  # fmt: skip


def pending_error(cfg: GenDataConfig, out: Path, left: dict[int, str], planned: int) -> IncompleteError:
    """Conversations left pending: the folder stays unfinished (no manifest) and a rerun retries them."""
    why = left[max(left)]
    endpoints = " ".join(f"--endpoint {redact_text(e)}" for e in cfg.endpoints)
    return IncompleteError(
        f"{len(left)} of {planned} conversations are pending after endpoint failures; nothing is lost "
        f"(finished conversations are kept in {out / PROGRESS}) and no manifest is written until all are done. "
        f"Last failure: {why}",
        "endpoints that answer POST /v1/chat/completions with HTTP 200",
        f"check the endpoint(s) ({endpoints}), then rerun the same command: it regenerates only the pending "
        "conversations (exit code 3 means: rerun later)",
    )


def no_usable_records(cfg: GenDataConfig, out: Path | None, results, read_rejects: list[dict]) -> UsageError:
    """Every record was rejected: say why (counts by reason) and keep the details in rejects.jsonl."""
    counts = Counter(r["reason"] for r in read_rejects)
    reasons = ", ".join(f"{k}: {v}" for k, v in counts.most_common()) or "no rows"
    where = ""
    if out is not None and read_rejects and not (out / MANIFEST).exists():
        atomic_write_text(out / REJECTS, "".join(dumps(r) + "\n" for r in read_rejects))
        where = f"; each rejected row with its reason is in {out / REJECTS}"
    rows = sum(r.rows for r in results)
    return UsageError(
        f"no usable conversations in the inputs: all {rows} rows were rejected ({reasons}){where}",
        "at least one record that alternates user/assistant turns (after an optional system turn) with text content",
        f"see the reasons with: eagle3 gen-data --dry-run --target {cfg.target} "
        + " ".join(f"--input {i}" for i in cfg.inputs),
    )


def nothing_kept(out: Path, rejects: list[dict]) -> UsageError:
    """Every planned conversation was rejected while generating (prompts too long, empty answers)."""
    by_reason = Counter(r["reason"] for r in rejects).most_common()
    counts = ", ".join(f"{k}: {v}" for k, v in by_reason) or "none"
    hint = {
        "prompt_too_long": "raise --max-prompt-tokens (or leave it out), or use shorter prompts",
        "empty_generation": "check that the endpoint answers with text (send it one request by hand)",
        "truncated": "raise --max-new-tokens, or keep truncated turns (leave out --drop-truncated)",
    }
    first = (
        hint.get(by_reason[0][0], "fix the inputs or settings the reasons name") if by_reason else "check the inputs"
    )
    return UsageError(
        f"gen-data kept no conversation ({len(rejects)} rejected: {counts}); no manifest is written. "
        f"Each reject with its reason is in {out / REJECTS}",
        "at least one conversation kept",
        f"{first}; then rerun (the same folder is fine)",
    )


def finalize(
    cfg,
    out: Path,
    identity,
    results,
    plan,
    read_rejects,
    shard_ids: list[int],
    elapsed,
    backend,
    session_tokens: int = 0,
    partial: dict | None = None,
    eval_check: dict | None = None,
    engine=None,
) -> Path:
    gen_rejects, shards, records = [], [], []
    if cfg.synthetic or cfg.answers_per_prompt > 1:  # repeats counted once, before the shards are summed
        gen_rejects += dedup.dedup_folder(out, shard_ids, dedup_reference(cfg, plan), cfg.near_dup_threshold)
    for k in shard_ids:
        p = out / shard_name(k)
        recs = read_records(p)
        records += recs
        shards.append(shard_record(p, records=len(recs)))
        rp = out / PROGRESS / f"rejects-{k:05d}.jsonl"
        gen_rejects += read_records(rp)
    all_rejects = read_rejects + gen_rejects
    atomic_write_text(out / REJECTS, "".join(dumps(r) + "\n" for r in all_rejects))
    if not records:  # a manifest over nothing would only move the failure to cache ("no trainable samples")
        for k in shard_ids:  # empty shards and journals: a rerun with other settings may use the folder
            (out / shard_name(k)).unlink(missing_ok=True)
        shutil.rmtree(out / PROGRESS, ignore_errors=True)
        raise nothing_kept(out, all_rejects)
    turns = [t for r in records for t in r["meta"]["turns"]]
    counts = {
        "rows_read": sum(r.rows for r in results),
        "valid": sum(len(r.records) for r in results),
        "repaired_by_kind": dict(sum((r.repair_counts for r in results), Counter()).most_common()),
        "repaired_written": sum(1 for r in records if r["meta"].get("repairs")),
        "planned": len(plan),
        "written": len(records),
        "regenerated": 0 if cfg.no_regenerate else len(records),
        "skipped": len(all_rejects),
        "skipped_by_reason": dict(Counter(r["reason"] for r in all_rejects).most_common()),
        "truncated": sum(1 for r in records if r["meta"]["truncated"]),
        "dropped_turns": sum(r["meta"]["dropped_turns"] for r in records),
        "turns": len(turns),
    }
    tokens = {
        "prompt": sum(t["prompt_tokens"] for t in turns),
        "completion": sum(t["completion_tokens"] for t in turns),
        # turns whose count the server got wrong (over max_tokens, negative, not an integer): counted here
        "completion_recounted": sum(1 for t in turns if t.get("tokens_recounted")),
    }
    write_manifest(
        out,
        "gen-data",
        target=identity.as_dict(),
        chat_template_hash=identity.chat_template_hash,
        config=config_dict(cfg),
        backend=None if cfg.no_regenerate else cfg.backend,
        # the model each reply named (`model` in an engine's answers), with its turn count: which model wrote the data
        answered_by=dict(Counter(t["model"] for t in turns if t.get("model")).most_common()) or None,
        regenerated=not cfg.no_regenerate,
        inputs=input_fingerprints(results),
        counts=counts,
        tokens=tokens,
        shards=shards,
        rejects={"file": REJECTS, "records": len(all_rejects), "sha256": sha256_file(out / REJECTS)},
        plan_ids_hash=sha256_text("\n".join(p["id"] for p in plan))[:16],
        last_session_seconds=round(elapsed, 2),
        eval_prompt_check=eval_check,
        levers=levers_summary(cfg, records),
        engine=engine.as_dict() if engine else None,
        throughput=throughput(out, elapsed, session_tokens, len(records)),
        **({"finished_early": partial} if partial else {}),
    )
    shutil.rmtree(out / PROGRESS, ignore_errors=True)
    rows = [
        ["conversations written", counts["written"]],
        ["planned", counts["planned"]],
        ["skipped", counts["skipped"]],
    ]
    rows += [[f"  {k}", v] for k, v in counts["skipped_by_reason"].items()]
    rows += [
        [
            "truncated (kept, flagged)" if not cfg.drop_truncated else "turns dropped (truncated)",
            counts["truncated"] if not cfg.drop_truncated else counts["dropped_turns"],
        ],
        ["assistant turns", counts["turns"]],
        ["completion tokens", tokens["completion"]],
        ["prompt tokens", tokens["prompt"]],
        ["shards", len(shards) if partial is None else f"{len(shards)} of {partial['of_shards']} (--finish-early)"],
    ]
    if elapsed > 0 and session_tokens and not cfg.no_regenerate:
        rows.append(["generated tok/s (this session)", round(session_tokens / elapsed, 1)])
    if getattr(backend, "retried", 0):
        rows.append(["request retries", backend.retried])
    print_table(f"gen-data -> {out}", ["", "value"], rows)
    return out
