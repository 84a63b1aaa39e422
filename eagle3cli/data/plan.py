"""What a gen-data run will regenerate: the inputs read, eval prompts and held prompts refused, the levers
applied (augment, K answers, written prompts), and what the manifest records of the inputs. A pure
function of the inputs and the config, so a rerun rebuilds the same plan (what resume relies on)."""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Callable
from pathlib import Path

from ..config import config_dict
from ..console import warn
from ..errors import UsageError
from ..run_folder.manifest import (
    sha256_file,
)
from . import dedup, levers
from .config import PLAN_FIELDS, GenDataConfig
from .contamination import eval_index, eval_reject
from .formats import ReadResult, limit_turns, parse_input_spec, read_input, reject_row
from .mixture import build_plan, first_prompt_key, first_user, prompt_key


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


@dataclasses.dataclass(frozen=True)
class Inputs:
    """What `read_inputs` found: the readers' results, the plan, the records refused while reading, and
    what the inputs were checked against for eval prompts."""

    results: list[ReadResult]
    plan: list[dict]
    read_rejects: list[dict]
    eval_check: dict | None
