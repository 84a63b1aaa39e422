"""`run_cache(cfg)`: data/ -> cache/ (tokens, assistant masks, draft vocab, target features).

Order of work, chosen so a run can die anywhere and resume exactly:
1. check the data manifest against the target (fingerprint, tokenizer, template) and the
   template against offset masking, before any weights are loaded;
2. tokenise every record (cheap) in data order: the sample order, the draft vocab, the
   lengths index and the shard plan are pure functions of data + settings;
3. write `plan.json`, `vocab.safetensors`, `index.safetensors` (identical in every process);
4. compute the shards this process owns that are not done yet (a shard is done when its
   file and its `.shard-NNNNN.json` record exist and agree), each written atomically;
5. when every shard is done, write `manifest.json`, last.
`--shard i/N` processes share one folder and each computes shards j with j % N == i; the
last one to finish (or `eagle3 cache --merge DIR`) writes the manifest.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from ..config import config_dict
from ..console import human_bytes, log, print_table, progress, warn
from ..errors import StageError, UsageError
from ..lock import LOCK_NAME, locked_stage
from ..manifest import (
    atomic_write_json,
    check_matches,
    read_json,
    read_manifest,
    remove_dead_temps,
    shard_record,
    verify_shards,
    write_manifest,
)
from ..model.target import (
    default_aux_layer_ids,
    load_target,
    load_tokenizer,
    resolve_model_path,
    target_identity,
    validate_aux_layer_ids,
)
from . import vocab as V
from .config import STORAGES, CacheConfig, parse_shard
from .masks import TemplateRefusal, _special_ids, check_template, has_assistant_output, mask_data_record
from .reader import INDEX_FILE, VOCAB_FILE
from .storage import bf16_layout_bytes, bytes_per_token, feature_keys
from .writer import Sample, save_atomic, shard_metadata, shard_tensors

PLAN_FILE = "plan.json"
GEN_DATA_CMD = "eagle3 gen-data --target TARGET --input FILE --run runs/NAME"


# ------------------------------------------------------------------ inputs
def _rerun_cmd(cfg: CacheConfig | dict, out: Path | None = None) -> str:
    """The cache command with every setting that differs from the defaults (what resume needs)."""
    d = config_dict(cfg) if isinstance(cfg, CacheConfig) else dict(cfg)
    defaults = config_dict(CacheConfig())
    if out is not None and d.get("run") is None:
        d["out"] = str(out)
    parts = ["eagle3 cache"]
    for k, v in d.items():
        if k in ("shard", "device", "dtype") or v is None or v == defaults.get(k):
            continue
        v = ",".join(map(str, v)) if isinstance(v, list | tuple) else v
        parts.append(f"--{k.replace('_', '-')} {v}")
    return " ".join(parts)


def read_records(data_dir: Path, manifest: dict, limit: int | None):
    """(record, file, line) in data order; a malformed line is a usage error naming it."""
    n = 0
    for s in manifest["shards"]:
        path = data_dir / s["file"]
        with open(path) as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                if limit is not None and n >= limit:
                    return
                try:
                    rec = json.loads(line)
                    msgs = rec["messages"]
                    assert isinstance(msgs, list) and all(_is_message(m) for m in msgs)
                except (json.JSONDecodeError, KeyError, TypeError, AssertionError) as e:
                    raise UsageError(
                        f"{path}:{lineno} is not a data record ({type(e).__name__})",
                        '{"id": ..., "source": ..., "messages": [{"role": "system|user|assistant|tool", "content": str, '
                        '"reasoning_content"?: str, "tool_calls"?: [...]}], "tools"?: [...]}',
                        GEN_DATA_CMD,
                    ) from e
                n += 1
                yield rec, f"{s['file']}:{lineno}"


def _is_message(m) -> bool:
    return (
        isinstance(m, dict)
        and m["role"] in ("system", "user", "assistant", "tool")
        and isinstance(m["content"], str)
        and isinstance(m.get("reasoning_content", ""), str)
        and isinstance(m.get("tool_calls", []), list)
    )


def check_data(cfg: CacheConfig) -> dict:
    data_dir = cfg.data_dir
    m = read_manifest(data_dir, "gen-data", GEN_DATA_CMD)
    problems = verify_shards(data_dir, m.get("shards", []))
    if problems:
        raise StageError(
            f"data folder {data_dir} is damaged:\n  " + "\n  ".join(problems),
            "data shards whose size and sha256 match its manifest",
            f"regenerate it: {GEN_DATA_CMD}",
        )
    return m


def check_target_matches_data(data_manifest: dict, ident, data_dir: Path) -> None:
    expected = ident.comparable()
    if data_manifest.get("regenerated") is False:
        # Original answers were kept: no model wrote them, but tokenizer and template still matter.
        expected.pop("fingerprint", None)
    check_matches(
        f"data folder {data_dir}",
        data_manifest.get("target") or {},
        expected,
        "cache with the target the data was made with (--target), or regenerate the data: " + GEN_DATA_CMD,
    )


# ------------------------------------------------------------------ plan
def tokenize_all(cfg: CacheConfig, tok, data_dir: Path, data_manifest: dict):
    special = _special_ids(tok)
    samples: list[Sample] = []
    counts = {
        "records": 0,
        "samples": 0,
        "turn_samples": 0,
        "tokens": 0,
        "masked_tokens": 0,
        "truncated": 0,
        "skipped": {},
    }

    def skip(reason: str) -> None:
        counts["skipped"][reason] = counts["skipped"].get(reason, 0) + 1

    refused = 0
    for rec, where in read_records(data_dir, data_manifest, cfg.max_samples):
        counts["records"] += 1
        sid = str(rec.get("id", where))
        if not has_assistant_output(rec["messages"]):
            skip("no assistant message")
            continue
        try:
            masked = mask_data_record(tok, rec, cfg.max_length, special, sid)
        except TemplateRefusal as e:
            # one conversation the template will not render (e.g. a system turn for Gemma-2): skip it, go on
            skip("chat template refused the conversation")
            refused += 1
            if refused <= 3:
                warn(f"{where}: {e.message}")
            continue
        for s in masked:
            if s.truncated:
                counts["truncated"] += 1
            if not any(s.loss_mask):
                skip(f"no assistant tokens within --max-length {cfg.max_length}")
                continue
            counts["turn_samples"] += bool(s.suffix)  # a reasoning turn the whole render drops, trained alone
            samples.append(
                Sample(
                    len(samples),
                    sid + s.suffix,
                    np.asarray(s.input_ids, dtype=np.int32),
                    np.asarray(s.loss_mask, dtype=bool),
                )
            )
            counts["samples"] += 1
            counts["tokens"] += len(s.input_ids)
            counts["masked_tokens"] += int(sum(s.loss_mask))
    if not samples:
        raise UsageError(
            f"no trainable samples in {data_dir} ({counts['records']} records; skipped: {counts['skipped']})",
            "conversations with at least one non-empty assistant message",
            GEN_DATA_CMD,
        )
    return samples, counts


def plan_shards(lengths: list[int], shard_tokens: int) -> list[tuple[int, int]]:
    """Consecutive sample ranges [a, b) of about shard_tokens tokens each (at least one sample)."""
    out, a, tokens = [], 0, 0
    for i, n in enumerate(lengths):
        if tokens and tokens + n > shard_tokens:
            out.append((a, i))
            a, tokens = i, 0
        tokens += n
    out.append((a, len(lengths)))
    return out


def shard_name(j: int) -> str:
    return f"shard-{j:05d}.safetensors"


def _done_file(out: Path, j: int) -> Path:
    return out / f".shard-{j:05d}.json"


def shard_done(out: Path, j: int) -> dict | None:
    """The shard's record if it was completed (file renamed into place and record written)."""
    p, d = out / shard_name(j), _done_file(out, j)
    if not p.exists():
        return None
    if d.exists():
        rec = read_json(d)
        if rec.get("bytes") == p.stat().st_size:
            return rec
    return None


def settings_hash(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def write_or_check_plan(out: Path, plan: dict, cfg: CacheConfig) -> None:
    p = out / PLAN_FILE
    if p.exists():
        old = read_json(p)
        if old.get("settings_hash") != plan["settings_hash"]:
            diffs = [k for k in plan["settings"] if old.get("settings", {}).get(k) != plan["settings"][k]]
            raise UsageError(
                f"{out} holds a cache built with other settings (differs in: {', '.join(diffs) or 'data'})",
                "the same data, target and cache settings to resume, or an empty folder",
                f"pass a new --out, or remove {out} to rebuild: rm -r {out} && {_rerun_cmd(cfg)}",
            )
        return
    atomic_write_json(p, plan)


# ------------------------------------------------------------------ the stage
def _lock_name(cfg: CacheConfig) -> str:
    """`--shard i/N` processes share the folder by design: one lock per shard slice."""
    i, n = parse_shard(cfg.shard)
    return LOCK_NAME if n == 1 else f"{LOCK_NAME}.shard-{i}-of-{n}"


@locked_stage("cache", lambda cfg: cfg.out_dir, _lock_name)
def run_cache(cfg: CacheConfig) -> Path:
    data_dir, out = cfg.data_dir, cfg.out_dir
    data_manifest = check_data(cfg)
    target_ref = cfg.target or (data_manifest.get("target") or {}).get("path")
    if not target_ref:
        raise UsageError(
            "no target given and the data manifest names none",
            "--target MODEL_DIR",
            f"{_rerun_cmd(cfg)} --target models/tiny-target",
        )
    target_path = resolve_model_path(target_ref)
    tok = load_tokenizer(target_path)
    ident = target_identity(target_path, tok)
    check_target_matches_data(data_manifest, ident, data_dir)
    n_layers = ident.num_hidden_layers
    aux_ids = tuple(cfg.aux_layers) if cfg.aux_layers else default_aux_layer_ids(n_layers)
    errs = validate_aux_layer_ids(aux_ids, n_layers)
    if errs:
        raise UsageError(
            "; ".join(errs),
            f"ids in 0..{n_layers - 1}, e.g. --aux-layers " + ",".join(map(str, default_aux_layer_ids(n_layers))),
        )
    draft_vocab_size = cfg.draft_vocab_size
    if draft_vocab_size > ident.vocab_size:
        warn(f"--draft-vocab-size {draft_vocab_size} exceeds the target vocab {ident.vocab_size}: capped")
        draft_vocab_size = ident.vocab_size
    check_template(tok)

    # ---- tokens, masks, vocab, plan (deterministic; every process computes the same)
    t0 = time.time()
    samples, counts = tokenize_all(cfg, tok, data_dir, data_manifest)
    log(
        f"tokenised {counts['records']} records -> {counts['samples']} samples, {counts['tokens']:,} tokens "
        f"({counts['masked_tokens']:,} assistant), {counts['truncated']} truncated, in {time.time() - t0:.1f}s"
    )
    freq = V.token_counts(((s.input_ids, s.loss_mask) for s in samples), ident.vocab_size)
    d2t, t2d = V.build_mapping(V.select_draft_tokens(freq, draft_vocab_size), ident.vocab_size)
    cov = V.coverage(freq, t2d)
    lengths = [len(s.input_ids) for s in samples]
    ranges = plan_shards(lengths, cfg.shard_tokens)
    settings = {
        "data_shards": [s["sha256"] for s in data_manifest["shards"]],
        "target": ident.comparable(),
        "aux_layer_ids": list(aux_ids),
        "draft_vocab_size": draft_vocab_size,
        "max_length": cfg.max_length,
        "storage": cfg.storage,
        "topk": cfg.topk if cfg.storage == "compact" else None,
        "shard_tokens": cfg.shard_tokens,
        "max_samples": cfg.max_samples,
    }
    plan = {
        "settings_hash": settings_hash(settings),
        "settings": settings,
        "target": ident.as_dict(),
        "config": config_dict(cfg),
        "counts": counts,
        "coverage": cov,
        "shards": [{"file": shard_name(j), "first": a, "end": b} for j, (a, b) in enumerate(ranges)],
        "data": {"dir": str(data_dir), "regenerated": data_manifest.get("regenerated")},
    }
    out.mkdir(parents=True, exist_ok=True)
    write_or_check_plan(out, plan, cfg)
    remove_dead_temps(out)
    save_atomic(out / VOCAB_FILE, {"d2t": d2t, "t2d": t2d, "token_counts": freq}, {"coverage": f"{cov:.6f}"})
    save_atomic(out / INDEX_FILE, {"lengths": torch.tensor(lengths, dtype=torch.int32)}, {})

    # ---- what is left for this process, and does it fit on disk
    rank, world = parse_shard(cfg.shard)
    mine = [j for j in range(len(ranges)) if j % world == rank]
    todo = [j for j in mine if shard_done(out, j) is None]
    n_aux = len(aux_ids)
    bpt = bytes_per_token(cfg.storage, ident.hidden_size, n_aux, ident.vocab_size, cfg.topk)
    todo_tokens = sum(sum(lengths[a:b]) for a, b in (ranges[j] for j in todo))
    need = todo_tokens * bpt + 4096 * len(todo)
    free = shutil.disk_usage(out).free
    log(
        f"disk: {len(todo)}/{len(mine)} shards to compute, {todo_tokens:,} tokens x {bpt} B/token "
        f"({cfg.storage}) = {human_bytes(need)} needed, {human_bytes(free)} free in {out}"
    )
    if need > free:
        raise UsageError(
            f"the cache needs about {human_bytes(need)} more but {out} has {human_bytes(free)} free "
            f"({len(todo)} shard(s) left to compute; finished shards are kept)",
            "enough free disk space for the cache",
            f"free space, pick a smaller layout (--storage compact is ~{bytes_per_token('compact', ident.hidden_size, n_aux, ident.vocab_size, cfg.topk) / bpt:.2f}x), "
            "or cache a part with --max-samples",
        )

    if todo:
        model, _tok, _ = load_target(target_path, cfg.device, cfg.dtype)
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
        done_samples = sum(ranges[j][1] - ranges[j][0] for j in mine if j not in todo)
        with progress(
            "caching target features",
            total=sum(ranges[j][1] - ranges[j][0] for j in mine),
            unit="samples",
            completed=done_samples,
        ) as bar:
            for j in todo:
                a, b = ranges[j]
                ts = time.time()
                path = out / shard_name(j)
                tensors = shard_tensors(
                    samples[a:b],
                    model,
                    aux_ids,
                    cfg.storage,
                    token_budget=cfg.token_budget,
                    vocab_size=ident.vocab_size,
                    topk=cfg.topk,
                    pad_id=pad_id,
                )
                save_atomic(path, tensors, shard_metadata(samples[a:b], cfg.storage))
                tokens = sum(lengths[a:b])
                rec = shard_record(
                    path,
                    samples=b - a,
                    tokens=tokens,
                    masked_tokens=int(sum(int(s.loss_mask.sum()) for s in samples[a:b])),
                    seconds=round(time.time() - ts, 4),
                )
                atomic_write_json(_done_file(out, j), rec)
                bar.advance(b - a, tokens=tokens)
    remaining = [j for j in range(len(ranges)) if shard_done(out, j) is None]
    if remaining:
        log(
            f"shard {rank}/{world} finished; {len(remaining)} shard(s) of other processes still missing. "
            f"When all are done the last one writes the manifest, or run: eagle3 cache --merge {out}"
        )
        return out
    return merge_cache(out)


def merge_cache(out: Path) -> Path:
    """Write manifest.json once every planned shard is done (the end of a run, or of --shard i/N)."""
    out = Path(out)
    if not (out / PLAN_FILE).exists():
        raise UsageError(
            f"{out} has no {PLAN_FILE}: no cache run started there",
            "a folder written by `eagle3 cache`",
            "eagle3 cache --run runs/NAME",
        )
    plan = read_json(out / PLAN_FILE)
    records, missing = [], []
    for j, _s in enumerate(plan["shards"]):
        rec = shard_done(out, j)
        if rec is None:
            missing.append(shard_name(j))
        else:
            records.append(rec)
    if missing:
        n = len(plan["shards"])
        raise UsageError(
            f"{len(missing)} of {n} shards are not done yet: {', '.join(missing[:6])}"
            + (" ..." if len(missing) > 6 else ""),
            "every `--shard i/N` process finished",
            "run the missing processes: "
            + " ; ".join(
                sorted({f"eagle3 cache ... --shard {int(m[6:11]) % _world(plan)}/{_world(plan)}" for m in missing})[:4]
            ),
        )
    s = plan["settings"]
    hidden, vocab_size = plan["target"]["hidden_size"], plan["target"]["vocab_size"]
    n_aux, topk = len(s["aux_layer_ids"]), plan["config"]["topk"]
    tokens = plan["counts"]["tokens"]
    on_disk = sum(r["bytes"] for r in records)
    layout = bf16_layout_bytes(hidden, vocab_size)
    bpt = {
        "measured": round(on_disk / tokens, 2),
        "payload": bytes_per_token(s["storage"], hidden, n_aux, vocab_size, topk),
        "bf16_layout": layout,
        "ratio_vs_bf16_layout": round(on_disk / tokens / layout, 4),
        "options": {o: bytes_per_token(o, hidden, n_aux, vocab_size, topk) for o in STORAGES},
    }
    seconds = sum(r.get("seconds", 0.0) for r in records)
    manifest_shards = [
        {k: r[k] for k in ("file", "bytes", "sha256", "samples", "tokens", "masked_tokens")} for r in records
    ]
    write_manifest(
        out,
        "cache",
        target=plan["target"],
        aux_layer_ids=s["aux_layer_ids"],
        draft_vocab_size=s["draft_vocab_size"],
        max_length=s["max_length"],
        storage=s["storage"],
        topk=s["topk"],
        teacher="topk_logprobs" if s["storage"] == "compact" else "last_hidden",
        coverage=plan["coverage"],
        counts=plan["counts"],
        bytes_per_token=bpt,
        throughput={
            "tokens_per_s": round(tokens / seconds, 1) if seconds else None,
            "forward_seconds": round(seconds, 2),
            "note": "target forward + encode + write, summed over shards (all processes)",
        },
        config=plan["config"],
        data=plan["data"],
        settings_hash=plan["settings_hash"],
        shards=manifest_shards,
        files=[shard_record(out / VOCAB_FILE), shard_record(out / INDEX_FILE)],
    )
    c = plan["counts"]
    print_table(
        f"cache {out}",
        ["item", "value"],
        [
            ["samples", c["samples"]],
            ["tokens", c["tokens"]],
            ["assistant tokens", c["masked_tokens"]],
            ["truncated", c["truncated"]],
            ["skipped", sum(c["skipped"].values())],
            ["draft vocab coverage", f"{plan['coverage']:.4f}"],
            ["storage", s["storage"]],
            ["bytes/token (measured)", bpt["measured"]],
            ["vs bf16 layout", bpt["ratio_vs_bf16_layout"]],
            ["tokens/s", round(tokens / seconds) if seconds else "-"],
            ["shards", len(records)],
        ],
    )
    return out


def _world(plan: dict) -> int:
    spec = plan["config"].get("shard")
    return parse_shard(spec)[1] if spec else 1


# ------------------------------------------------------------------ verify
def nonfinite_features(f, storage: str, rows: int = 8192) -> str | None:
    """The first feature tensor of an open shard holding a NaN/inf (read in row chunks), or None."""
    for key in feature_keys(storage):
        sl = f.get_slice(key)
        for a in range(0, sl.get_shape()[0], rows):
            t = sl[a : a + rows]
            if t.is_floating_point() and not bool(torch.isfinite(t.float()).all()):
                return key
    return None


def verify_cache(cache_dir: Path, target: str | None = None) -> dict:
    """Checksums, shard structure, and the manifest against the target; StageError on any problem."""
    cache_dir = Path(cache_dir)
    m = read_manifest(cache_dir, "cache", "eagle3 cache --run runs/NAME")
    rebuild = _rerun_cmd(m.get("config") or {}, cache_dir)
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
        with safe_open(str(cache_dir / s["file"]), framework="pt") as f:
            offsets = f.get_tensor("offsets")
            if offsets.numel() != s["samples"] + 1 or int(offsets[-1]) != s["tokens"]:
                raise StageError(
                    f"{s['file']}: holds {offsets.numel() - 1} samples / {int(offsets[-1])} tokens, "
                    f"manifest says {s['samples']} / {s['tokens']}",
                    "a consistent shard",
                    f"rm {cache_dir / s['file']} && {rebuild}",
                )
            bad = nonfinite_features(f, m["storage"])
            if bad:  # written that way (a NaN target forward): the checksum matches, training would not
                raise StageError(
                    f"{s['file']}: {bad} holds non-finite values (NaN/inf)",
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
    path = resolve_model_path(target_ref)
    ident = target_identity(path, load_tokenizer(path))
    check_matches(
        f"cache {cache_dir}",
        m["target"],
        ident.comparable(),
        f"rebuild the cache for this target: eagle3 cache --run runs/NAME --target {path}",
    )
    errs = validate_aux_layer_ids(tuple(m["aux_layer_ids"]), ident.num_hidden_layers)
    if errs:
        raise StageError("; ".join(errs), "aux layer ids of this target", f"rebuild: {rebuild}")
    from safetensors.torch import load_file

    vocab = load_file(str(cache_dir / VOCAB_FILE))
    d2t, t2d = vocab["d2t"], vocab["t2d"]
    ids = torch.arange(d2t.numel()) + d2t
    if (
        d2t.numel() != m["draft_vocab_size"]
        or t2d.numel() != ident.vocab_size
        or int(t2d.sum()) != d2t.numel()
        or not bool(t2d[ids.clamp(0, t2d.numel() - 1)].all())
        or int(ids.max()) >= ident.vocab_size
    ):
        raise StageError(
            f"{VOCAB_FILE}: d2t/t2d do not describe a {m['draft_vocab_size']}-token draft vocab "
            f"of a {ident.vocab_size}-token target",
            "a consistent draft vocab",
            f"rebuild: {rebuild}",
        )
    return {
        "cache": str(cache_dir),
        "shards": len(m["shards"]),
        "samples": m["counts"]["samples"],
        "tokens": m["counts"]["tokens"],
        "target": str(path),
        "fingerprint": ident.fingerprint,
        "aux_layer_ids": m["aux_layer_ids"],
        "storage": m["storage"],
    }
