"""From a gen-data folder to the cache plan, and the bookkeeping of shards.

Everything here is a pure function of the data and the settings, so every `--shard i/N` process
computes the same plan: records read and checked, tokenised with assistant masks, the draft vocab
chosen, samples split into shards of about `--shard-tokens` tokens. A shard is done when its file
and its `.shard-NNNNN.json` record exist and agree.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..config import config_dict
from ..console import log, warn
from ..errors import StageError, UsageError
from ..readers.jsonl import iter_file
from ..run_folder.manifest import (
    atomic_write_json,
    check_matches,
    read_json,
    read_manifest,
    same_fingerprint,
    verify_shards,
)
from ..speculate import vocab as V
from .config import CacheConfig
from .masks import TemplateRefusal, _special_ids, has_assistant_output, mask_data_record
from .writer import Sample

PLAN_FILE = "plan.json"
GEN_DATA_CMD = "eagle3 gen-data --target TARGET --input FILE --run runs/NAME"


# ------------------------------------------------------------------ inputs
def rerun_cmd(cfg: CacheConfig | dict, out: Path | None = None) -> str:
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
        for lineno, line in iter_file(path):
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
            f"rerun the gen-data command that wrote it ({GEN_DATA_CMD}): it regenerates exactly the missing or "
            "damaged shards",
        )
    return m


def check_target_matches_data(data_manifest: dict, ident, data_dir: Path) -> None:
    expected = ident.comparable()
    if data_manifest.get("regenerated") is False:
        # Original answers were kept: no model wrote them, but tokenizer and template still matter.
        expected.pop("fingerprint", None)
    recorded = data_manifest.get("target") or {}
    nxt = "cache with the target the data was made with (--target), or regenerate the data: " + GEN_DATA_CMD
    same_place = recorded.get("path") and str(recorded.get("path")) == str(ident.as_dict().get("path"))
    if (
        same_place
        and recorded.get("fingerprint")
        and not same_fingerprint(recorded["fingerprint"], expected.get("fingerprint"))
    ):
        # passing --target would name the same, changed folder: say what changed instead
        inputs = (
            " ".join(f"--input {i}" for i in (data_manifest.get("config") or {}).get("inputs") or []) or "--input FILE"
        )
        nxt = (
            f"the target at {recorded['path']} changed since the data was generated (its files differ): put the "
            f"original files back, or regenerate the data with it into a new run: eagle3 gen-data --target "
            f"{recorded['path']} {inputs} --run runs/NEW"
        )
    check_matches(f"data folder {data_dir}", recorded, expected, nxt)


# ------------------------------------------------------------------ plan
def tokenize_all(cfg: CacheConfig, tok, data_dir: Path, data_manifest: dict) -> tuple[list[Sample], dict]:
    """The samples of every record in data order, and the counts (with skips by reason) the
    manifest reports."""
    special = _special_ids(tok)
    samples: list[Sample] = []
    counts = dict.fromkeys(("records", "samples", "turn_samples", "tokens", "masked_tokens", "truncated"), 0)
    skipped: dict[str, int] = {}

    def skip(reason: str) -> None:
        skipped[reason] = skipped.get(reason, 0) + 1

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
            f"no trainable samples in {data_dir} ({counts['records']} records; skipped: {skipped})",
            "conversations with at least one non-empty assistant message",
            GEN_DATA_CMD,
        )
    return samples, {**counts, "skipped": skipped}


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


def done_file(out: Path, j: int) -> Path:
    return out / f".shard-{j:05d}.json"


def shard_done(out: Path, j: int) -> dict | None:
    """The shard's record if it was completed (file renamed into place and record written)."""
    p, d = out / shard_name(j), done_file(out, j)
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
                f"pass a new --out, or remove {out} to rebuild: rm -r {out} && {rerun_cmd(cfg)}",
            )
        return
    atomic_write_json(p, plan)


@dataclass
class CachePlan:
    """What every process agrees on before a target forward runs."""

    samples: list[Sample]
    lengths: list[int]  # tokens per sample
    ranges: list[tuple[int, int]]  # samples [a, b) of each shard
    plan: dict  # plan.json: settings (and their hash), target, config, counts, shards
    vocab: dict[str, torch.Tensor]  # d2t, t2d, token_counts
    coverage: float


def make_plan(
    cfg: CacheConfig, tok, ident, data_manifest: dict, aux_ids: tuple[int, ...], draft_vocab_size: int
) -> CachePlan:
    """Tokenise every record (cheap) in data order, choose the draft vocab, split into shards."""
    t0 = time.time()
    samples, counts = tokenize_all(cfg, tok, cfg.data_dir, data_manifest)
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
        "data": {"dir": str(cfg.data_dir), "regenerated": data_manifest.get("regenerated")},
    }
    return CachePlan(samples, lengths, ranges, plan, {"d2t": d2t, "t2d": t2d, "token_counts": freq}, cov)
