"""`run_gen_data(cfg) -> Path`: inputs -> plan -> regenerated shards -> manifest (written last).

Resume: the plan (which records, in which order) is a pure function of the inputs and the
config, so a re-run rebuilds the same plan; finished conversations are journaled and finished
shards written atomically (`journal.py`), so a kill -9 at any point loses at most the
conversations in flight. Sampling is seeded per (record, turn), so the resumed run writes
exactly what an uninterrupted one would.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

from ..config import config_dict, parse_shard
from ..console import console, log, print_table, progress, warn
from ..errors import IncompleteError, UsageError
from ..jsonl import dumps, read_records
from ..lock import LOCK_NAME, locked_stage
from ..manifest import (
    MANIFEST,
    atomic_write_json,
    atomic_write_text,
    remove_dead_temps,
    sha256_file,
    sha256_text,
    shard_record,
    verify_shards,
    write_manifest,
)
from ..model.chat import TemplateRefusal, render
from ..urls import redact_text
from .config import PLAN_FIELDS, GenDataConfig
from .formats import ReadResult, limit_turns, parse_input_spec, read_input
from .journal import (
    PROGRESS,
    REJECTS,
    STATE,
    TRANSIENT_REASONS,
    Journal,
    check_folder,
    finish_shard,
    read_journal,
    shard_name,
)
from .mixture import build_plan
from .regen import Conversation, Sampling, template_kwargs_for


# ---------------------------------------------------------------- inputs and plan
def read_inputs(cfg: GenDataConfig) -> tuple[list[ReadResult], list[dict], list[dict]]:
    specs = [parse_input_spec(s) for s in cfg.inputs]
    by_label: dict[str, list[str]] = {}
    for sp in specs:
        by_label.setdefault(sp.label, []).append(sp.spec)
    twice = {k: v for k, v in by_label.items() if len(v) > 1}
    if twice:  # record ids are LABEL:ROW: two files named train.jsonl would both give train:0
        k, v = next(iter(twice.items()))
        raise UsageError(
            f"{len(v)} inputs are named {k!r} ({', '.join(v)}): their record ids would collide ({k}:0 twice)",
            "inputs with distinct names (a file's name without its suffix names its records)",
            "rename or link one of the files under another name (ln -s a/train.jsonl a-train.jsonl)",
        )
    if cfg.out_dir is not None and not cfg.dry_run:
        out = Path(cfg.out_dir).resolve()
        inside = [sp.spec for sp in specs if sp.path is not None and out in sp.path.resolve().parents]
        if inside:
            raise UsageError(
                f"the output folder {cfg.out_dir} holds this run's input {inside[0]}: gen-data never writes "
                "into the folder of its own input",
                "an output folder apart from the inputs",
                "move the input out of it, or give gen-data another --out (or --run runs/NAME)",
            )
    results = [read_input(s) for s in specs]
    if cfg.max_turns is not None:
        for r in results:
            r.records = [limit_turns(rec, cfg.max_turns) for rec in r.records]
    plan, dup_rejects = build_plan(results, cfg.num_samples, cfg.seed)
    read_rejects = [r for res in results for r in res.rejects]
    if cfg.num_samples and len(plan) < cfg.num_samples:
        warn(f"asked for {cfg.num_samples} conversations, the inputs hold {len(plan)} usable ones after dedup")
    return results, plan, read_rejects + dup_rejects


def input_fingerprints(results: list[ReadResult]) -> list[dict]:
    out = []
    for r in results:
        d = {
            "spec": r.spec.spec,
            "format": r.shape,
            "rows": r.rows,
            "valid": len(r.records),
            "rejected": len(r.rejects),
            "weight": r.spec.weight,
        }
        if r.other_split:
            d["other_split"] = r.other_split  # e.g. ShareGPT's held-out conversations, left for eval
        if r.spec.path is not None:  # the bytes that were read: a pipe (<(cat f)) is empty by now
            d["sha256"] = r.sha256 or sha256_file(r.spec.path)
        out.append(d)
    return out


def plan_config(cfg: GenDataConfig) -> dict:
    d = config_dict(cfg)
    return {k: (list(d[k]) if isinstance(d[k], tuple) else d[k]) for k in PLAN_FIELDS}


# ---------------------------------------------------------------- target
def load_target_identity(cfg: GenDataConfig):
    from ..model.target import open_target

    assert cfg.target is not None  # validate() requires --target
    target = open_target(cfg.target)
    return target.path, target.tokenizer, target.identity


# ---------------------------------------------------------------- no-regenerate
def keep_original(conv: Conversation, tokenizer) -> None:
    """--no-regenerate: the record's own answers, token-counted; prompt-only records are rejected,
    and so are conversations the target's template refuses (the cache could not render them)."""

    def count(m: dict) -> int:
        text = (m.get("reasoning_content") or "") + (m.get("content") or "")
        return len(tokenizer(text, add_special_tokens=False).input_ids)

    conv.keep(count)
    if conv.reject is not None:
        return
    try:
        render(tokenizer, conv.result()["messages"], False, conv.tools, conv.template_kwargs, conv.record["id"])
    except TemplateRefusal as e:
        conv.fail(TemplateRefusal.reason, e.message)


# ---------------------------------------------------------------- backends
def make_backend(cfg: GenDataConfig, tokenizer):
    sampling = Sampling(cfg.max_new_tokens, float(cfg.temperature), float(cfg.top_p), cfg.seed)
    if cfg.backend == "openai":
        from .openai import OpenAIBackend

        return OpenAIBackend(
            list(cfg.endpoints),
            sampling,
            cfg.concurrency,
            cfg.timeout_s,
            cfg.retries,
            cfg.backoff_s,
            cfg.served_model_name,
            os.environ.get("OPENAI_API_KEY"),
            tokenizer=tokenizer,
        )
    from ..model.cpu_kernels import pack_for_inference
    from ..model.target import open_target
    from .hf import HFBackend

    assert cfg.target is not None  # validate() requires --target
    model = open_target(cfg.target, load=True, device=cfg.device, dtype=cfg.dtype).model
    log(f"gen-data: target matmuls on {pack_for_inference(model, cfg.cpu_kernels)}")
    return HFBackend(model, tokenizer, sampling, cfg.batch_size, cfg.max_prompt_tokens)


def conversation(cfg: GenDataConfig, index: int, record: dict) -> Conversation:
    kw = template_kwargs_for(cfg.seed, record["id"], cfg.thinking, tuple(cfg.reasoning_effort))
    return Conversation(index, record, cfg.drop_truncated, kw)


# ---------------------------------------------------------------- dry run
def dry_run(cfg: GenDataConfig, results, plan, rejects, tokenizer) -> None:
    from .hf import render_prompt

    counts = Counter(r["reason"] for r in rejects)
    print_table(
        "gen-data --dry-run: inputs",
        ["input", "format", "rows", "valid", "rejected", "weight", "planned"],
        [
            [
                r.spec.spec,
                r.shape,
                r.rows,
                len(r.records),
                len(r.rejects),
                r.spec.weight,
                sum(1 for p in plan if p["source"] == r.spec.label),
            ]
            for r in results
        ],
    )
    if counts:
        print_table("rejected while reading", ["reason", "records"], [[k, v] for k, v in counts.most_common()])
    log(
        f"would regenerate {len(plan)} conversations ({sum(len([m for m in p['messages'] if m['role'] == 'user']) for p in plan)} "
        f"user turns) with backend {cfg.backend} into {cfg.out_dir or '(no output folder given)'}"
    )
    if plan:
        first = conversation(cfg, 0, plan[0])
        log(f"[bold]first prompt[/] ({plan[0]['id']}), rendered with the target's chat template:")
        try:
            text = render_prompt(tokenizer, first.history(), first.tools, first.template_kwargs)
        except TemplateRefusal as e:
            warn(f"the template refuses it (gen-data rejects such records): {e.message}")
        else:
            console.print(text, markup=False, highlight=False)


# ---------------------------------------------------------------- the stage
def _lock_name(cfg: GenDataConfig) -> str:
    """`--shard i/N` processes share the folder by design: one lock per slice of the shards."""
    i, n = parse_shard(cfg.shard)
    return LOCK_NAME if n == 1 else f"{LOCK_NAME}.shard-{i}-of-{n}"


@locked_stage("gen-data", lambda cfg: None if cfg.dry_run else cfg.out_dir, _lock_name)
def run_gen_data(cfg: GenDataConfig) -> Path:
    results, plan, read_rejects = read_inputs(cfg)
    path, tokenizer, identity = load_target_identity(cfg)
    if cfg.dry_run:
        dry_run(cfg, results, plan, read_rejects, tokenizer)
        return cfg.out_dir or Path(".")
    out = cfg.out_dir
    assert out is not None  # validate(): --run or --out unless --dry-run
    if not plan:
        raise no_usable_records(cfg, out, results, read_rejects)
    pcfg = plan_config(cfg)
    plan_ids_hash = sha256_text("\n".join(p["id"] for p in plan))[:16]
    done = check_folder(out, identity, pcfg, plan_ids_hash)
    if done is not None and not done.get("finished_early"):
        damaged = reopen_damaged(out, done, plan, cfg.shard_size, len(read_rejects))
        if damaged:
            warn(f"{out}: {', '.join(damaged)} missing or damaged; regenerating exactly those (the plan is the same)")
            done = None
    if done is not None:
        log(f"{out} is already complete ({done['counts']['written']} conversations); nothing to do")
        old = sum(v for k, v in (done["counts"].get("skipped_by_reason") or {}).items() if k in TRANSIENT_REASONS)
        if old:
            warn(
                f"{old} record(s) in {out / REJECTS} were rejected for endpoint failures by an older eagle3 "
                f"(today they would be left pending and retried); regenerate into a new folder to get them"
            )
        return out
    prog_dir = out / PROGRESS
    prog_dir.mkdir(parents=True, exist_ok=True)
    for d in (out, prog_dir):  # atomic writes cut by a kill (a live --shard sibling's temps are kept)
        remove_dead_temps(d)
    atomic_write_json(
        prog_dir / STATE,
        {"target": identity.as_dict(), "plan_config": pcfg, "plan_ids_hash": plan_ids_hash, "planned": len(plan)},
    )

    n_shards = (len(plan) + cfg.shard_size - 1) // cfg.shard_size
    rank, world = parse_shard(cfg.shard)
    todo = [k for k in range(n_shards) if not (out / shard_name(k)).exists()]
    mine = [k for k in todo if k % world == rank]  # this process's slice (all of them without --shard)
    already = sum(min(cfg.shard_size, len(plan) - k * cfg.shard_size) for k in range(n_shards) if k not in todo)
    journals = {k: read_journal(prog_dir / f"shard-{k:05d}.journal.jsonl") for k in todo}
    already += sum(len(j) for j in journals.values())
    if already:
        log(f"resuming {out}: {already} of {len(plan)} conversations already done")

    if cfg.finish_early:
        return finish_early(cfg, out, identity, results, plan, read_rejects, n_shards, todo, journals)
    backend = None if cfg.no_regenerate else make_backend(cfg, tokenizer)
    t0 = time.time()
    left: dict[int, str] = {}  # plan index -> why it is pending (transient endpoint failures)
    with progress("gen-data", total=len(plan), unit="conv", completed=already) as bar:
        for k in mine:
            lo, hi = k * cfg.shard_size, min(len(plan), (k + 1) * cfg.shard_size)
            entries = journals[k]
            down = getattr(backend, "unavailable", None)
            if down is not None:  # the endpoints are down: later shards would only wait through retries
                left.update({p: f"not sent: {down}" for p in range(lo, hi) if p not in entries})
                continue
            pending = [conversation(cfg, p, plan[p]) for p in range(lo, hi) if p not in entries]
            journal = Journal(prog_dir / f"shard-{k:05d}.journal.jsonl")

            def on_done(c: Conversation, journal=journal, entries=entries) -> None:
                if c.pending is not None:
                    left[c.index] = c.pending
                    return
                e: dict[str, Any] = {"plan_index": c.index}
                if c.reject is not None:
                    e["reject"] = c.reject_record()
                else:
                    e["record"] = c.result()
                entries[c.index] = e
                journal.add(e)
                bar.advance(1, tokens=sum(t["completion_tokens"] for t in c.turn_meta))

            try:
                if backend is None:
                    for c in pending:
                        keep_original(c, tokenizer)
                        on_done(c)
                else:
                    backend.regenerate(pending, on_done)
            except KeyboardInterrupt:
                warn(f"interrupted: finished conversations are kept in {prog_dir}; re-run the same command to resume")
                raise
            finally:
                journal.close()
            if all(p in entries for p in range(lo, hi)):
                finish_shard(out, k, [entries[p] for p in range(lo, hi)])
        session_tokens = bar.tokens
    if left:
        raise pending_error(cfg, out, left, len(plan))
    others = [k for k in range(n_shards) if not (out / shard_name(k)).exists()]
    if others:  # --shard: the other slices are still running; the last process to finish finalizes
        log(
            f"shard slice {rank}/{world} done; {len(others)} shard(s) of other slices are not finished yet: the last "
            f"`--shard i/{world}` process to finish writes the manifest (or rerun without --shard once they are done)"
        )
        return out
    elapsed = time.time() - t0
    return finalize(
        cfg, out, identity, results, plan, read_rejects, list(range(n_shards)), elapsed, backend, session_tokens
    )


def reopen_damaged(out: Path, manifest: dict, plan: list[dict], shard_size: int, n_read_rejects: int) -> list[str]:
    """A finished folder whose shards no longer match its manifest (a shard deleted, cut or edited)
    is reopened: the good shards stay, their generation rejects go back to `progress/`, the bad
    ones are removed and the manifest last, so the run regenerates exactly those (and a kill
    during this leaves the manifest, and the same repair next time). Returns the bad names."""
    n_shards = (len(plan) + shard_size - 1) // shard_size
    listed = {s.get("file"): s for s in manifest.get("shards") or [] if isinstance(s, dict)}
    bad = [k for k in range(n_shards) if shard_name(k) not in listed or verify_shards(out, [listed[shard_name(k)]])]
    rej = manifest.get("rejects") or {}
    rejects_ok = (out / REJECTS).is_file() and rej.get("sha256") in (None, sha256_file(out / REJECTS))
    if not bad and rejects_ok:
        return []
    if not rejects_ok:  # which shard each generation reject belonged to is lost with the file
        bad = list(range(n_shards))
    shard_of = {p["id"]: i // shard_size for i, p in enumerate(plan)}
    per_shard: dict[int, list[str]] = {k: [] for k in range(n_shards)}
    if rejects_ok:
        for r in read_records(out / REJECTS)[n_read_rejects:]:  # finalize writes the read rejects first
            k = shard_of.get(r.get("id"))
            if k is not None:
                per_shard[k].append(dumps(r) + "\n")
    prog_dir = out / PROGRESS
    for k in range(n_shards):
        if k not in bad:
            atomic_write_text(prog_dir / f"rejects-{k:05d}.jsonl", "".join(per_shard[k]))
    for k in bad:
        (out / shard_name(k)).unlink(missing_ok=True)
    (out / MANIFEST).unlink()
    return [shard_name(k) for k in bad] if rejects_ok else [f"{REJECTS} (so every shard is regenerated)"]


def finish_early(cfg, out: Path, identity, results, plan, read_rejects, n_shards: int, todo, journals) -> Path:
    """--finish-early: the manifest over the finished shards of an unfinished run; the rest of the plan
    (including conversations done in unfinished shards) is left out, and the manifest says how much."""
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
    partial = {"shards": len(done), "of_shards": n_shards, "conversations_planned": len(plan)}
    return finalize(cfg, out, identity, results, plan, read_rejects, done, 0.0, None, 0, partial)


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
) -> Path:
    gen_rejects, shards, records = [], [], []
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
    }
    write_manifest(
        out,
        "gen-data",
        target=identity.as_dict(),
        chat_template_hash=identity.chat_template_hash,
        config=config_dict(cfg),
        backend=None if cfg.no_regenerate else cfg.backend,
        regenerated=not cfg.no_regenerate,
        inputs=input_fingerprints(results),
        counts=counts,
        tokens=tokens,
        shards=shards,
        rejects={"file": REJECTS, "records": len(all_rejects), "sha256": sha256_file(out / REJECTS)},
        last_session_seconds=round(elapsed, 2),
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
