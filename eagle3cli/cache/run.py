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

import contextlib
import shutil
import time
from pathlib import Path

import torch

from ..config import parse_shard
from ..console import human_bytes, log, print_table, progress, warn
from ..errors import UsageError
from ..model.cpu_kernels import pack_for_inference
from ..model.sharded import Lockstep
from ..model.target import open_target
from ..node.devices import check_device, shard_device
from ..run_folder.folders import claim_output
from ..run_folder.lock import LOCK_NAME, locked_stage
from ..run_folder.manifest import atomic_write_json, read_json, remove_dead_temps, shard_record, write_manifest
from ..speculate.aux_layers import aux_layer_problems, default_aux_layer_ids
from . import sharded
from .config import STORAGES, CacheConfig
from .engine_route import remove_stash
from .features import Features, ModelFeatures
from .masks import check_template
from .plan import (
    PLAN_FILE,
    CachePlan,
    check_data,
    check_target_matches_data,
    done_file,
    make_plan,
    rerun_cmd,
    shard_done,
    shard_name,
    write_or_check_plan,
)
from .reader import INDEX_FILE, VOCAB_FILE
from .storage import bf16_layout_bytes, bytes_per_token
from .writer import save_atomic, shard_metadata, shard_tensors

# What a cache folder holds (besides manifest, locks and temps): plan, vocab, index, shards, records.
CACHE_FILES = (
    PLAN_FILE,
    VOCAB_FILE,
    INDEX_FILE,
    "shard-*.safetensors",
    ".shard-*.json",
    ".verified.json",
    "engine*.log",  # --engine vllm|sglang: the engine's own log
    ".final-*.safetensors",  # --engine sglang: a shard's final states between its two passes
)


def _lock_name(cfg: CacheConfig) -> str:
    """`--shard i/N` processes share the folder by design: one lock per shard slice."""
    i, n = parse_shard(cfg.shard)
    return LOCK_NAME if n == 1 else f"{LOCK_NAME}.shard-{i}-of-{n}"


def run_cache(cfg: CacheConfig) -> Path:
    """The cache run; with --tensor-parallel-size N on the hf route, its N ranks (`sharded.py`)."""
    role = sharded.role(cfg)
    if role == "launch":
        check_device(cfg.device)
        return sharded.launch(cfg, _target(cfg, check_data(cfg))[0])  # refused before any rank starts
    if role == "follow":
        return sharded.follow(cfg)
    if role == "drive":
        with sharded.driver(cfg) as lock:
            return _run_cache(cfg, lock)
    return _run_cache(cfg, None)


@locked_stage("cache", lambda cfg: cfg.out_dir, _lock_name)
def _run_cache(cfg: CacheConfig, lock: Lockstep | None) -> Path:
    check_device(cfg.device)  # before any model loads
    out = cfg.out_dir
    claim_output(out, "cache", CACHE_FILES, [("--data", cfg.data_dir)], resumable=(".shard-*.json", PLAN_FILE))
    data_manifest = check_data(cfg)
    target_path, tok, ident = _target(cfg, data_manifest)
    aux_ids = _aux_ids(cfg, ident.num_hidden_layers)
    draft_vocab_size = cfg.draft_vocab_size
    if draft_vocab_size > ident.vocab_size:
        warn(f"--draft-vocab-size {draft_vocab_size} exceeds the target vocab {ident.vocab_size}: capped")
        draft_vocab_size = ident.vocab_size
    check_template(tok)

    # ---- tokens, masks, vocab, plan (deterministic; every process computes and writes the same)
    cp = make_plan(cfg, tok, ident, data_manifest, aux_ids, draft_vocab_size)
    out.mkdir(parents=True, exist_ok=True)
    write_or_check_plan(out, cp.plan, cfg)
    remove_dead_temps(out)
    save_atomic(out / VOCAB_FILE, cp.vocab, {"coverage": f"{cp.coverage:.6f}"})
    save_atomic(out / INDEX_FILE, {"lengths": torch.tensor(cp.lengths, dtype=torch.int32)}, {})

    # ---- what is left for this process, and does it fit on disk
    rank, world = parse_shard(cfg.shard)
    mine = [j for j in range(len(cp.ranges)) if j % world == rank]
    todo = [j for j in mine if shard_done(out, j) is None]
    _check_disk(
        cfg,
        out,
        ident,
        len(aux_ids),
        sum(sum(cp.lengths[a:b]) for a, b in (cp.ranges[j] for j in todo)),
        len(todo),
        len(mine),
    )
    if todo:
        _compute_shards(cfg, target_path, tok, ident, aux_ids, cp, mine, todo, lock)
    remaining = [j for j in range(len(cp.ranges)) if shard_done(out, j) is None]
    if remaining:
        log(
            f"shard {rank}/{world} finished; {len(remaining)} shard(s) of other processes still missing. "
            f"When all are done the last one writes the manifest, or run: eagle3 cache --merge {out}"
        )
        return out
    return merge_cache(out)


def _target(cfg: CacheConfig, data_manifest: dict):
    """(path, tokenizer, identity) of the target: --target or the data's, checked against the data."""
    target_ref = cfg.target or (data_manifest.get("target") or {}).get("path")
    if not target_ref:
        raise UsageError(
            "no target given and the data manifest names none",
            "--target MODEL_DIR",
            f"{rerun_cmd(cfg)} --target models/tiny-target",
        )
    target = open_target(target_ref)
    check_target_matches_data(data_manifest, target.identity, cfg.data_dir)
    return target.path, target.tokenizer, target.identity


def _aux_ids(cfg: CacheConfig, n_layers: int) -> tuple[int, ...]:
    aux_ids = tuple(cfg.aux_layers) if cfg.aux_layers else default_aux_layer_ids(n_layers)
    errs = aux_layer_problems(aux_ids, n_layers)
    if errs:
        raise UsageError(
            "--aux-layers: " + "; ".join(errs),
            f"ids in 1..{n_layers - 1}, e.g. --aux-layers " + ",".join(map(str, default_aux_layer_ids(n_layers))),
        )
    return aux_ids


def _check_disk(cfg: CacheConfig, out: Path, ident, n_aux: int, todo_tokens: int, n_todo: int, n_mine: int) -> None:
    """Refuse to start what cannot finish: the shards left need about tokens x bytes/token."""
    bpt = bytes_per_token(cfg.storage, ident.hidden_size, n_aux, ident.vocab_size, cfg.topk)
    # --engine sglang also holds each shard's final states between its two passes (engine_route.py)
    bpt += ident.hidden_size * (4 if cfg.dtype == "fp32" else 2) if cfg.engine == "sglang" else 0
    need = todo_tokens * bpt + 4096 * n_todo
    free = shutil.disk_usage(out).free
    log(
        f"disk: {n_todo}/{n_mine} shards to compute, {todo_tokens:,} tokens x {bpt} B/token "
        f"({cfg.storage}) = {human_bytes(need)} needed, {human_bytes(free)} free in {out}"
    )
    if need > free:
        compact = bytes_per_token("compact", ident.hidden_size, n_aux, ident.vocab_size, cfg.topk) / bpt
        raise UsageError(
            f"the cache needs about {human_bytes(need)} more but {out} has {human_bytes(free)} free "
            f"({n_todo} shard(s) left to compute; finished shards are kept)",
            "enough free disk space for the cache",
            f"free space, pick a smaller layout (--storage compact is ~{compact:.2f}x), "
            "or cache a part with --max-samples",
        )


def _compute_shards(cfg: CacheConfig, target_path, tok, ident, aux_ids, cp: CachePlan, mine, todo, lock) -> None:
    """Run the target over each shard left, write it atomically, then its done record."""
    with contextlib.ExitStack() as stack:
        features = _features(cfg, target_path, tok, ident, aux_ids, cp, todo, stack, lock)
        _write_shards(cfg, features, ident, aux_ids, cp, mine, todo)


def _features(cfg: CacheConfig, target_path, tok, ident, aux_ids, cp: CachePlan, todo, stack, lock) -> Features:
    """The target in this process (hf), split over this launch's ranks (`lock`: rank 0 drives), or in
    an engine that lives as long as `stack`."""
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    if lock is not None:
        return sharded.driven_features(lock, target_path, aux_ids, pad_id)
    if cfg.engine == "hf":
        rank, world = parse_shard(cfg.shard)
        device = shard_device(cfg.device, rank) if world > 1 else cfg.device
        if device != cfg.device:
            log(f"cache: shard {rank}/{world} on {device} (no --device: shard i runs on cuda:(i mod GPUs))")
        model = open_target(target_path, load=True, device=device, dtype=cfg.dtype).model
        log(f"cache: target matmuls on {pack_for_inference(model, cfg.cpu_kernels)}")
        return ModelFeatures(model, aux_ids, pad_id)
    from .engine_route import engine_features

    return engine_features(cfg, target_path, ident, aux_ids, cp, todo, stack)


def _write_shards(cfg: CacheConfig, features: Features, ident, aux_ids, cp: CachePlan, mine, todo) -> None:
    out = cfg.out_dir
    size = {j: cp.ranges[j][1] - cp.ranges[j][0] for j in mine}
    done_samples = sum(n for j, n in size.items() if j not in todo)
    with progress("caching target features", total=sum(size.values()), unit="samples", completed=done_samples) as bar:
        for j in todo:
            a, b = cp.ranges[j]
            ts = time.time()
            path = out / shard_name(j)
            tensors = shard_tensors(
                cp.samples[a:b],
                features,
                len(aux_ids),
                cfg.storage,
                token_budget=cfg.token_budget,
                vocab_size=ident.vocab_size,
                topk=cfg.topk,
            )
            save_atomic(path, tensors, shard_metadata(cp.samples[a:b], cfg.storage))
            tokens = sum(cp.lengths[a:b])
            rec = shard_record(
                path,
                samples=b - a,
                tokens=tokens,
                masked_tokens=int(sum(int(s.loss_mask.sum()) for s in cp.samples[a:b])),
                seconds=round(time.time() - ts, 4),
            )
            atomic_write_json(done_file(out, j), rec)
            remove_stash(out, j)  # --engine sglang's first pass, now in the shard
            bar.advance(b - a, tokens=tokens)


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
    bpt = _bytes_per_token(plan, sum(r["bytes"] for r in records))
    tokens = plan["counts"]["tokens"]
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


def _bytes_per_token(plan: dict, on_disk: int) -> dict:
    """Measured bytes per token on disk, against the payload of each storage option and the plain
    bf16 layout (what the manifest reports as the cache's cost)."""
    s, target = plan["settings"], plan["target"]
    hidden, vocab_size = target["hidden_size"], target["vocab_size"]
    n_aux, topk = len(s["aux_layer_ids"]), plan["config"]["topk"]
    tokens = plan["counts"]["tokens"]
    layout = bf16_layout_bytes(hidden, vocab_size)
    return {
        "measured": round(on_disk / tokens, 2),
        "payload": bytes_per_token(s["storage"], hidden, n_aux, vocab_size, topk),
        "bf16_layout": layout,
        "ratio_vs_bf16_layout": round(on_disk / tokens / layout, 4),
        "options": {o: bytes_per_token(o, hidden, n_aux, vocab_size, topk) for o in STORAGES},
    }


def _world(plan: dict) -> int:
    spec = plan["config"].get("shard")
    return parse_shard(spec)[1] if spec else 1
