"""`eagle3 eval`: real speculative decoding with one or more heads (any layout) on a benchmark;
acceptance by depth, tau, wall-clock speedup over plain decoding with a spread, losslessness,
a paired head comparison, and a serving configuration chosen from measured runs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..config import config_dict
from ..console import log, warn
from ..errors import UsageError
from ..extras import draw_plot
from ..head.card import CARD, eval_rows
from ..head.write import update_card
from ..node.devices import check_device
from ..options import command_line
from ..prompts import load_conversations, render
from ..run_folder.folders import claim_output, refuse_replacing
from ..run_folder.lock import locked_stage
from ..run_folder.manifest import atomic_write_json, remove_dead_temps, write_manifest
from ..speculate import Unsupported
from ..speculate.acceptance import TAU_NOTE
from ..speculate.decoder import SpeculativeDecoder, plain_decode
from .config import EvalConfig
from .lanes import decode_lanes, split_turns
from .summary import INTERVAL, compare_heads, mode_stats, recommend_measured, speed

if TYPE_CHECKING:
    from ..head.read import HeadSpec
    from ..speculate.draft import Eagle3Draft


EVAL_FILES = ("report.json", "acceptance.png")


def _paths(cfg: EvalConfig) -> tuple[Path | None, Path]:
    head = cfg.head or (cfg.run / "head" if cfg.run else None)
    return head, cfg.out or default_out(cfg.run, head)


def default_out(run: Path | None, head: Path | None) -> Path:
    """RUN/eval; a run's head (NAME/head): NAME/eval beside it; any other head folder:
    runs/eval-HEADNAME (never inside the head's own folder's parent: a committed head lives in
    models/, which eval must not write into)."""
    if run is not None:
        return run / "eval"
    if head is None:
        return Path("eval")
    if head.name == "head":
        return head.parent / "eval"
    return Path("runs") / f"eval-{head.resolve().name}"


def _target_ref(cfg: EvalConfig, head: Path) -> str:
    from ..model.target import build_hint

    if cfg.target:
        hint = build_hint(cfg.target)
        if hint and not Path(cfg.target).exists():  # models/smollm2-135m before `make smollm2`
            raise UsageError(f"--target {cfg.target} does not exist", "a model folder", hint)
        return cfg.target
    from ..head.folder import named_target

    return named_target(head, f"eagle3 eval --target models/tiny-target --head {head}")


def _cpu_choice(cfg: EvalConfig):
    """The CPU kernels for this run, chosen before anything is loaded or written: an explicit
    onednn that the CPU cannot run for the dtype is exit 2 here."""
    from ..model.cpu_kernels import choose_cpu_kernels
    from ..model.target import pick_device, pick_dtype

    dev = pick_device(cfg.device)
    return choose_cpu_kernels(cfg.cpu_kernels, dev, pick_dtype(dev, cfg.dtype))


def run_eval(cfg: EvalConfig) -> Path:
    """Check what can be checked without loading anything (the target the head names, the CPU
    kernels), so a bad command exits 2 before an output folder exists; then evaluate."""
    if cfg.endpoint is None:
        head = _paths(cfg)[0]
        if head is not None:
            _target_ref(cfg, head)
        choice = _cpu_choice(cfg)
        if choice.why != "device default (not CPU)":
            log(f"eval: CPU matmuls on {choice.why}")
            cfg = dataclasses.replace(cfg, cpu_kernels=choice.kernels)
    try:
        return _run_eval(cfg)
    except Unsupported as e:
        raise unsupported_target(e) from e


def unsupported_target(e: Unsupported) -> UsageError:
    """The wing's `Unsupported` (a target the decoder cannot run) as eval's exit 2, with the way
    that still measures it: a running engine."""
    return UsageError(e.what, e.expected, "evaluate this target against a running engine: eagle3 eval --endpoint URL")


def _load_heads(cfg: EvalConfig, head: Path, target, ident) -> list[tuple[str, Eagle3Draft, HeadSpec]]:
    """[(label, draft, spec)] for the head and every --compare head, of any layout, each refused when
    it does not fit the target (the one head check, `head.check`, as serve asks it)."""
    from ..head.check import target_facts
    from ..head.read import load_any_head

    facts = target_facts(target.config.to_dict(), Path(ident.path), ident.as_dict())
    heads: list[tuple[str, Eagle3Draft, HeadSpec]] = []
    for h in [head, *map(Path, cfg.compare)]:
        # the head takes the target's dtype, except on CPU with plain F.linear: there fp32 one-row
        # matmuls beat bf16 ones, while oneDNN-packed bf16 ones are ~2.5x faster than fp32
        fp32 = target.device.type == "cpu" and cfg.cpu_kernels == "torch"
        draft, spec = load_any_head(h, target, dtype=torch.float32 if fp32 else target.dtype, target=facts)
        for notice in spec.notices:
            warn(notice)
        label = f"{h.parent.name}/{h.name}" if h.parent.name else str(h)
        if any(label == lab for lab, _, _ in heads):
            label = str(h)
        heads.append((label, draft.to(target.device), spec))
    return heads


def _cpu_kernels(cfg: EvalConfig, target, drafts: list) -> str:
    """Pack the target's and the heads' linears for oneDNN on CPU (--cpu-kernels onednn); which
    kernels every timed decoder then ran, for the report."""
    from ..model.cpu_kernels import pack_for_inference

    kernels = pack_for_inference(target, cfg.cpu_kernels)
    for d in drafts:  # the head's weights stay readable: its decoding cache fuses q/k/v from them
        pack_for_inference(d, cfg.cpu_kernels, keep_weight=True)
    return kernels


@locked_stage("eval", lambda cfg: _paths(cfg)[1])
def _run_eval(cfg: EvalConfig) -> Path:
    check_device(cfg.device)  # before any model loads
    head, out = _paths(cfg)
    read = [("--head", head)] if head is not None else []
    claim_output(out, "eval", EVAL_FILES, [*read, *(("--compare", Path(c)) for c in cfg.compare)])
    refuse_replacing(out, "eval", config_dict(cfg), cfg.overwrite)
    remove_dead_temps(out)  # a report or plot cut by a kill
    if cfg.endpoint:
        from .endpoint import run_endpoint_eval

        return run_endpoint_eval(cfg, cfg.endpoint)
    from ..model.target import open_target
    from ..speculate.target import eos_token_ids

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    assert head is not None  # validate(): --head or --run when there is no --endpoint
    opened = open_target(_target_ref(cfg, head), load=True, device=cfg.device, dtype=cfg.dtype)
    target, tok, ident = opened.model, opened.tokenizer, opened.identity
    heads = _load_heads(cfg, head, target, ident)
    kernels = _cpu_kernels(cfg, target, [d for _, d, _ in heads])
    eos = eos_token_ids(target, tok)
    fits = _context_check(cfg, target.config)
    convs, first_turns, too_long = _prompts(cfg, tok, fits)
    modes: list[str] = ["chain", "tree"] if cfg.mode == "both" else [cfg.mode]
    decoders = {
        (label, m): _decoder(cfg, target, d, spec.aux_layer_ids, m, eos) for label, d, spec in heads for m in modes
    }
    wp = first_turns[0][1]  # warm-up: first calls allocate and pick kernels; keep them out of the timings
    plain_decode(target, wp, 8, set(), cfg.temperature)
    for dec in decoders.values():
        dec.generate(wp, 8, seed=cfg.seed)
    log(
        f"eval: {len(convs)} {'conversations (every turn)' if cfg.turns == 'all' else 'prompts'} from {cfg.bench}, "
        f"{len(heads)} head(s), mode {cfg.mode}, depth {cfg.depth}, max {cfg.max_new_tokens} new tokens, "
        f"temperature {cfg.temperature}"
    )
    run = decode_lanes(cfg, target, tok, eos, decoders, convs, fits)
    report = _report(cfg, run, heads, decoders, modes, ident, kernels, len(convs), too_long)
    main_label, main_draft, main_spec = heads[0]
    if cfg.temperature > 0 and cfg.sampling_check > 0:
        dec = decoders[(main_label, modes[0])]
        report["sampling_check"] = {
            "head": main_label,
            "mode": modes[0],
            **_sampling_check(cfg, target, dec, first_turns[0], eos),
        }
    if cfg.sweep:
        report["sweep"] = _sweep(cfg, target, main_draft, main_spec.aux_layer_ids, first_turns, eos)
        report["recommended"] = {**report["sweep"]["recommended"], "from": "sweep (measured runs per configuration)"}
    else:
        report["recommended"] = recommend_measured(cfg, run, main_label, modes)
    _write(cfg, out, report, ident, heads)
    return out


def _prompts(
    cfg: EvalConfig, tok, fits
) -> tuple[list[tuple[str, list[dict]]], list[tuple[str, list[int]]], list[dict]]:
    """(conversations, their first turns' ids, prompts skipped as longer than --max-prompt-tokens):
    the first --num-prompts of the benchmark that fit."""
    convs: list[tuple[str, list[dict]]] = []
    first_turns: list[tuple[str, list[int]]] = []
    too_long: list[dict] = []
    for cid, msgs in load_conversations(cfg.bench, cfg.num_prompts if cfg.max_prompt_tokens is None else None):
        if len(convs) == cfg.num_prompts:
            break
        system, users = split_turns(msgs)
        ids = render(tok, system + users[:1])
        if cfg.max_prompt_tokens is not None and len(ids) > cfg.max_prompt_tokens:
            too_long.append({"id": cid, "tokens": len(ids)})
            continue
        convs.append((cid, msgs))
        first_turns.append((cid, fits(cid, ids)))
    if too_long:
        warn(f"--max-prompt-tokens {cfg.max_prompt_tokens}: skipped {len(too_long)} longer prompt(s) of {cfg.bench}")
    if not convs:
        raise UsageError(
            f"no prompt of {cfg.bench} has at most {cfg.max_prompt_tokens} tokens",
            "at least one prompt within --max-prompt-tokens",
            "raise --max-prompt-tokens",
        )
    return convs, first_turns, too_long


def _report(cfg: EvalConfig, run, heads, decoders, modes, ident, kernels: str, num_prompts: int, too_long) -> dict:
    """report.json's measured part: settings, each head's numbers per mode, baselines, the comparison."""
    plain_s = speed(run.lanes["plain"].results)
    gen_s = speed(run.lanes["generate"].results) if "generate" in run.lanes else None
    per_head: dict[str, dict] = {label: {"head": spec.summary()} for label, _, spec in heads}
    for label, mode in decoders:
        per_head[label][mode] = mode_stats(cfg, run, (label, mode), plain_s, gen_s)
    report: dict[str, Any] = {
        "bench": cfg.bench,
        "num_prompts": num_prompts,
        "skipped_long_prompts": too_long,
        "turns": cfg.turns,
        "units": len(run.units),
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "depth": cfg.depth,
        "mode": cfg.mode,
        "tree": {"topk": cfg.topk, "num_draft_tokens": cfg.num_draft_tokens},
        "tau_definition": TAU_NOTE,
        "speedup_interval_definition": f"{INTERVAL} of (tokens/s) / (plain tokens/s)",
        "target": ident.as_dict(),
        "kernels": kernels,
        "heads": per_head,
        "baselines": {"plain": plain_s, "generate": gen_s},
    }
    if len(heads) > 1:
        report["comparison"] = compare_heads(per_head, run, modes, heads[0][0])
    return report


def _sweep(cfg: EvalConfig, target, draft, aux_layer_ids, first_turns, eos: set[int]) -> dict:
    """--sweep: measured runs of chains 1..D and the tree points on the first --sweep-prompts."""
    from .sweep import run_sweep

    return run_sweep(
        target,
        draft,
        aux_layer_ids,
        first_turns[: cfg.sweep_prompts],
        eos,
        depth=cfg.depth,
        tree_points=cfg.tree_points(),
        max_new_tokens=cfg.sweep_max_new_tokens,
        repeats=cfg.sweep_repeats,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        seed=cfg.seed,
        tolerance=cfg.tie_tolerance,
    )


def _context_check(cfg: EvalConfig, target_config) -> Callable[[str, list[int]], list[int]]:
    """`fits(unit id, prompt ids)`: the ids, or a UsageError when prompt + new tokens + the draft
    window would run past the target's context."""
    ctx = int(getattr(target_config, "max_position_embeddings", 0) or 0)
    window = max(cfg.depth, cfg.num_draft_tokens) + 1

    def fits(uid: str, ids: list[int]) -> list[int]:
        need = len(ids) + cfg.max_new_tokens + window
        if ctx and need > ctx:
            raise UsageError(
                f"{uid} has {len(ids)} tokens; with --max-new-tokens {cfg.max_new_tokens} and the draft "
                f"window it needs {need} positions, the target has {ctx}",
                "prompts + new tokens within the target's context",
                "lower --max-new-tokens, skip long prompts with --max-prompt-tokens N"
                + (" or --turns first" if cfg.turns == "all" else ""),
            )
        return ids

    return fits


def _decoder(cfg: EvalConfig, target, draft, aux_layer_ids, mode: str, eos: set[int]) -> SpeculativeDecoder:
    return SpeculativeDecoder(
        target,
        draft,
        aux_layer_ids,
        mode=mode,
        depth=cfg.depth,
        topk=cfg.topk,
        num_draft_tokens=cfg.num_draft_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        eos=eos,
    )


def _sampling_check(cfg: EvalConfig, target, decoder, prompt: tuple[str, list[int]], eos: set[int]) -> dict:
    """T > 0: speculative vs plain sampling draws on the first prompt, compared per position."""
    from .losslessness import sampling_check

    log(f"sampling check: {cfg.sampling_check} speculative vs plain draws on {prompt[0]}")
    draws = sampling_check(target, decoder, prompt[1], eos, cfg.sampling_check, 4, cfg.temperature, cfg.top_p, cfg.seed)
    return {"prompt": prompt[0], **draws}


def _write(cfg: EvalConfig, out: Path, report: dict, ident, heads: list) -> None:
    from .report import plot, print_report

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "report.json", report)  # first: a plot that fails must not cost the numbers
    print_report(report)
    title = f"{cfg.bench}, {report['units']} prompts, T={cfg.temperature}"
    drawn = draw_plot(out / "acceptance.png", lambda: plot(out / "acceptance.png", report, title))
    plain = report["baselines"]["plain"]
    write_manifest(
        out,
        "eval",
        config=config_dict(cfg),
        target=ident.as_dict(),
        heads=[spec.summary() for _, _, spec in heads],
        counts={"prompts": report["num_prompts"], "units": report["units"], "plain_tokens": plain["tokens"]},
        files=["report.json", *(["acceptance.png"] if drawn else [])],
    )
    log(f"eval: wrote {out / 'report.json'}" + (f" and {out / 'acceptance.png'}" if drawn else ""))
    command = command_line("eval", cfg)
    for _, _, spec in heads:  # each head's card (only one eagle3 wrote) gets the acceptance measured here
        if update_card(spec.path, eval_rows(report, spec.path, command)):
            log(f"eval: updated the model card {spec.path / CARD}")
