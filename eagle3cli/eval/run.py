"""`eagle3 eval`: real speculative decoding with one or more heads (any layout) on a benchmark;
acceptance by depth, tau, wall-clock speedup over plain decoding with a spread, losslessness,
a paired head comparison, and a serving configuration chosen from measured runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config import config_dict
from ..console import log, warn
from ..errors import UsageError
from ..extras import plotting
from ..lock import locked_stage
from ..manifest import atomic_write_json, write_manifest
from .config import EvalConfig
from .decoder import DecodeResult, SpeculativeDecoder, hf_generate, plain_decode
from .metrics import TAU_NOTE, acceptance_by_depth, bootstrap_ratio, choose_config
from .prompts import load_conversations, render


@dataclass
class Lane:
    """One decoder over the whole benchmark: its results per unit (prompt or conversation turn)
    and, for multi-turn runs, its own conversation history (its own answers fed back)."""

    results: list[DecodeResult] = field(default_factory=list)
    history: list[dict] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)


def split_turns(messages: list[dict]) -> tuple[list[dict], list[dict]]:
    """(system messages before the first user turn, the user turns in order)."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "user")
    return messages[:first], [m for m in messages[first:] if m["role"] == "user"]


def _paths(cfg: EvalConfig) -> tuple[Path | None, Path]:
    head = cfg.head or (cfg.run / "head" if cfg.run else None)
    out = cfg.out or (cfg.run / "eval" if cfg.run else (head.parent / "eval" if head else Path("eval")))
    return head, out


def recorded_target(head: Path) -> str | None:
    """The target a head names (eagle3.target.path, or a speculators verifier), usable from here."""
    from ..model.heads import head_file, read_config_json
    from ..model.target import resolvable_reference

    cfg = read_config_json(head_file(head, "config.json"))
    ref = ((cfg.get("eagle3") or {}).get("target") or {}).get("path")
    ref = ref or ((cfg.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    return resolvable_reference(ref, base=Path(head))


def _target_ref(cfg: EvalConfig, head: Path) -> str:
    if cfg.target:
        return cfg.target
    recorded = recorded_target(head)
    if not recorded:
        raise UsageError(
            f"no --target given and head {head} records none",
            "--target MODEL_DIR",
            f"eagle3 eval --target models/tiny-target --head {head}",
        )
    return recorded


def check_head_fits(spec, target_cfg, ident) -> None:
    """Refuse a head made for another target (sizes, layers, tokenizer); warn on other weights."""
    problems = []
    if spec.vocab_size != target_cfg.vocab_size:
        problems.append(f"vocab_size: head {spec.vocab_size}, target {target_cfg.vocab_size}")
    if spec.target_hidden_size != target_cfg.hidden_size:
        problems.append(f"hidden size: head expects {spec.target_hidden_size}, target has {target_cfg.hidden_size}")
    rec = spec.target
    if rec.get("num_hidden_layers") not in (None, target_cfg.num_hidden_layers):
        problems.append(
            f"layers: head trained on a {rec['num_hidden_layers']}-layer target, this one has "
            f"{target_cfg.num_hidden_layers}"
        )
    if rec.get("vocab_hash") and rec["vocab_hash"] != ident.vocab_hash:
        problems.append("tokenizer: the head was trained with another vocabulary (vocab hash differs)")
    if problems:
        raise UsageError(
            f"head {spec.path} does not fit the target:\n  " + "\n  ".join(problems),
            "the target model the head was trained for",
            f"pass --target {spec.target_ref or 'MODEL_DIR'} (the target the head names)",
        )
    if rec.get("chat_template_hash") and rec["chat_template_hash"] != ident.chat_template_hash:
        warn(
            f"head {spec.path} was trained on conversations rendered with another chat template "
            f"({rec['chat_template_hash'][:12]}, this target's is {ident.chat_template_hash[:12]}): "
            "prompts here are rendered differently and acceptance may suffer"
        )
    if rec.get("fingerprint") and rec["fingerprint"] != ident.fingerprint:
        warn(
            f"head {spec.path} records target weights {rec['fingerprint'][:12]}, this target is "
            f"{ident.fingerprint[:12]}: acceptance may suffer"
        )


def _load_heads(cfg: EvalConfig, head: Path, target, ident) -> list[tuple[str, object, object]]:
    """[(label, draft, spec)] for the head and every --compare head, of any layout."""
    from ..model.heads import load_any_head

    heads = []
    for h in [head, *cfg.compare]:
        h = Path(h)
        # on CPU the head stays fp32 whatever the target: its one-row matmuls are faster there
        draft, spec = load_any_head(h, target, dtype=torch.float32 if target.device.type == "cpu" else target.dtype)
        check_head_fits(spec, target.config, ident)
        for notice in spec.notices:
            warn(notice)
        label = f"{h.parent.name}/{h.name}" if h.parent.name else str(h)
        if any(label == lab for lab, _, _ in heads):
            label = str(h)
        heads.append((label, draft.to(target.device), spec))
    return heads


def _summ(results: list[DecodeResult]) -> dict:
    toks = sum(len(r.tokens) for r in results)
    secs = sum(r.seconds for r in results)
    return {
        "tokens": toks,
        "seconds": round(secs, 4),
        "tokens_per_s": toks / secs if secs else 0.0,
        "target_calls": sum(r.target_calls for r in results),
        "draft_calls": sum(r.draft_calls for r in results),
    }


def _per_unit(results: list[DecodeResult]) -> tuple[list[int], list[float]]:
    return [len(r.tokens) for r in results], [r.seconds for r in results]


def _tau_pairs(results: list[DecodeResult]) -> tuple[list[int], list[int]]:
    """(tokens emitted by verification rounds, rounds) per unit: tau = sum / sum."""
    return [sum(r.accept_lens) + r.rounds for r in results], [r.rounds for r in results]


def _ci(b: dict) -> list[float]:
    return [round(b["low"], 4), round(b["high"], 4)]


@locked_stage("eval", lambda cfg: _paths(cfg)[1])
def run_eval(cfg: EvalConfig) -> Path:
    if cfg.endpoint:
        from .endpoint import run_endpoint_eval

        return run_endpoint_eval(cfg)
    from ..model.target import eos_token_ids, load_target, target_identity

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    head, out = _paths(cfg)
    target, tok, tpath = load_target(_target_ref(cfg, head), device=cfg.device, dtype=cfg.dtype)
    ident = target_identity(tpath, tok, target.config)
    heads = _load_heads(cfg, head, target, ident)
    eos = eos_token_ids(target, tok)
    ctx = int(getattr(target.config, "max_position_embeddings", 0) or 0)
    window = max(cfg.depth, cfg.num_draft_tokens) + 1
    convs = load_conversations(cfg.bench, cfg.num_prompts)

    def fits(uid: str, ids: list[int]) -> list[int]:
        need = len(ids) + cfg.max_new_tokens + window
        if ctx and need > ctx:
            raise UsageError(
                f"{uid} has {len(ids)} tokens; with --max-new-tokens {cfg.max_new_tokens} and the draft "
                f"window it needs {need} positions, the target has {ctx}",
                "prompts + new tokens within the target's context",
                "lower --max-new-tokens, use shorter prompts" + (" or --turns first" if cfg.turns == "all" else ""),
            )
        return ids

    first_turns = []
    for cid, msgs in convs:
        system, users = split_turns(msgs)
        first_turns.append((cid, fits(cid, render(tok, system + users[:1]))))
    modes = ["chain", "tree"] if cfg.mode == "both" else [cfg.mode]
    greedy = cfg.temperature <= 0

    def decoder(draft, aux, mode):
        return SpeculativeDecoder(
            target,
            draft,
            aux,
            mode=mode,
            depth=cfg.depth,
            topk=cfg.topk,
            num_draft_tokens=cfg.num_draft_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            eos=eos,
        )

    decoders = {(label, m): decoder(d, spec.aux_layer_ids, m) for label, d, spec in heads for m in modes}
    wp = first_turns[0][1]  # warm-up: first calls allocate and pick kernels; keep them out of the timings
    plain_decode(target, wp, 8, set(), cfg.temperature)
    for dec in decoders.values():
        dec.generate(wp, 8, seed=cfg.seed)
    pad = tok.pad_token_id if tok.pad_token_id is not None else next(iter(eos), 0)
    lanes: dict = {
        "plain": Lane(),
        **({"generate": Lane()} if cfg.generate_baseline else {}),
        **{k: Lane() for k in decoders},
    }
    units: list[str] = []
    mismatches: dict = {k: [] for k in decoders}
    log(
        f"eval: {len(convs)} {'conversations (every turn)' if cfg.turns == 'all' else 'prompts'} from {cfg.bench}, "
        f"{len(heads)} head(s), mode {cfg.mode}, depth {cfg.depth}, max {cfg.max_new_tokens} new tokens, "
        f"temperature {cfg.temperature}"
    )
    from ..console import progress

    with progress("eval", total=len(convs), unit="conv" if cfg.turns == "all" else "prompt") as bar:
        for i, (cid, msgs) in enumerate(convs):
            system, users = split_turns(msgs)
            turns = users if cfg.turns == "all" else users[:1]
            for lane in lanes.values():
                lane.history = list(system)
            conv_tokens = 0
            for t, user in enumerate(turns):
                uid = cid if len(turns) == 1 else f"{cid}#turn{t + 1}"
                units.append(uid)
                seed = cfg.seed + 1000 * i + t
                n_tok = 0
                for key, lane in lanes.items():
                    lane.history.append(user)
                    ids = fits(uid, render(tok, lane.history))
                    if key == "plain":
                        r = plain_decode(
                            target, ids, cfg.max_new_tokens, eos, cfg.temperature, cfg.top_p,
                            torch.Generator().manual_seed(seed),
                        )  # fmt: skip
                    elif key == "generate":
                        r = hf_generate(target, ids, cfg.max_new_tokens, eos, pad)
                    else:
                        r = decoders[key].generate(ids, cfg.max_new_tokens, seed=seed)
                    lane.results.append(r)
                    lane.outputs.append(r.tokens)
                    # each decoder's own answer is its history: greedy, that is the target's own answer
                    lane.history.append(
                        {"role": "assistant", "content": tok.decode(r.tokens, skip_special_tokens=True)}
                    )
                    n_tok += len(r.tokens)
                plain_out = lanes["plain"].outputs[-1]
                if greedy and "generate" in lanes and lanes["generate"].outputs[-1] != plain_out:
                    warn(f"{uid}: our plain loop and transformers generate differ (numerics of the two paths)")
                for key in decoders:
                    spec_out = lanes[key].outputs[-1]
                    if greedy and spec_out != plain_out:
                        at = next(
                            (j for j, (a, b) in enumerate(zip(spec_out, plain_out)) if a != b),
                            min(len(spec_out), len(plain_out)),
                        )
                        mismatches[key].append(
                            {
                                "prompt": uid,
                                "first_diff_at": at,
                                "speculative": tok.decode(spec_out[at : at + 12]),
                                "plain": tok.decode(plain_out[at : at + 12]),
                            }
                        )
                conv_tokens += n_tok
            bar.advance(1, tokens=conv_tokens)

    plain = lanes["plain"].results
    plain_s = _summ(plain)
    gen_s = _summ(lanes["generate"].results) if "generate" in lanes else None
    per_head: dict[str, dict] = {label: {"head": spec.summary()} for label, _, spec in heads}
    for label, mode in decoders:
        results = lanes[(label, mode)].results
        acc = acceptance_by_depth([a for r in results for a in r.accept_lens], cfg.depth, mode)
        emitted, rounds = _tau_pairs(results)
        acc["tau_interval"] = _ci(bootstrap_ratio((emitted, rounds))) if any(rounds) else [1.0, 1.0]
        s = _summ(results)
        sp = bootstrap_ratio(_per_unit(results), _per_unit(plain))
        per_head[label][mode] = {
            "config": {
                "steps": cfg.depth,
                "topk": 1 if mode == "chain" else cfg.topk,
                "num_draft_tokens": cfg.depth + 1 if mode == "chain" else cfg.num_draft_tokens,
            },
            "acceptance": acc,
            "speed": s,
            "speedup_vs_plain": s["tokens_per_s"] / plain_s["tokens_per_s"],
            "speedup_interval": _ci(sp),
            "speedup_vs_generate": s["tokens_per_s"] / gen_s["tokens_per_s"] if gen_s else None,
            "per_prompt": [
                {"prompt": u, "tokens": len(r.tokens), "rounds": r.rounds, "accepted": sum(r.accept_lens)}
                for u, r in zip(units, results)
            ],
            "lossless": _lossless(results, mismatches[(label, mode)], greedy),
        }
    main_label, main_draft, main_spec = heads[0]
    report = {
        "bench": cfg.bench,
        "num_prompts": len(convs),
        "turns": cfg.turns,
        "units": len(units),
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "depth": cfg.depth,
        "mode": cfg.mode,
        "tree": {"topk": cfg.topk, "num_draft_tokens": cfg.num_draft_tokens},
        "tau_definition": TAU_NOTE,
        "speedup_interval_definition": "90% paired bootstrap over prompts of (tokens/s) / (plain tokens/s)",
        "target": ident.as_dict(),
        "heads": per_head,
        "baselines": {"plain": plain_s, "generate": gen_s},
    }
    if len(heads) > 1:
        report["comparison"] = compare_heads(per_head, lanes, decoders, modes, main_label)
    if not greedy and cfg.sampling_check > 0:
        from .losslessness import sampling_check

        dec = decoders[(main_label, modes[0])]
        log(f"sampling check: {cfg.sampling_check} speculative vs plain draws on {first_turns[0][0]}")
        report["sampling_check"] = {
            "head": main_label,
            "mode": modes[0],
            "prompt": first_turns[0][0],
            **sampling_check(
                target, dec, first_turns[0][1], eos, cfg.sampling_check, 4, cfg.temperature, cfg.top_p, cfg.seed
            ),
        }
    if cfg.sweep:
        from .sweep import run_sweep

        report["sweep"] = run_sweep(
            target,
            main_draft,
            main_spec.aux_layer_ids,
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
        report["recommended"] = {**report["sweep"]["recommended"], "from": "sweep (measured runs per configuration)"}
    else:
        measured = [
            {"name": f"{mode} {per_head[main_label][mode]['config']}", **per_head[main_label][mode]["config"],
             "tokens": _per_unit(lanes[(main_label, mode)].results)[0],
             "seconds": _per_unit(lanes[(main_label, mode)].results)[1]}
            for mode in modes
        ]  # fmt: skip
        rec = choose_config(measured, _per_unit(plain), cfg.tie_tolerance)["recommended"]
        report["recommended"] = {
            **rec,
            "from": f"the configurations this run measured ({', '.join(modes)}); --sweep compares every depth",
        }
    from .report import plot, print_report

    out.mkdir(parents=True, exist_ok=True)
    if plotting():
        plot(out / "acceptance.png", report, f"{cfg.bench}, {len(units)} prompts, T={cfg.temperature}")
    atomic_write_json(out / "report.json", report)
    print_report(report)
    write_manifest(
        out,
        "eval",
        config=config_dict(cfg),
        target=ident.as_dict(),
        heads=[spec.summary() for _, _, spec in heads],
        counts={"prompts": len(convs), "units": len(units), "plain_tokens": plain_s["tokens"]},
        files=["report.json", "acceptance.png"],
    )
    log(f"eval: wrote {out / 'report.json'} and {out / 'acceptance.png'}")
    return out


def _lossless(results: list[DecodeResult], mism: list[dict], greedy: bool) -> dict:
    if greedy:
        return {"compared": len(results), "mismatches": len(mism), "examples": mism[:5]}
    return {
        "compared": 0,
        "note": "sampling: outputs are distributed as the target's by the per-token rejection rule; "
        "see sampling_check for the measured comparison with plain sampling",
    }


def compare_heads(per_head: dict, lanes: dict, decoders: dict, modes: list[str], main: str) -> dict:
    """Every head against the first, per mode, on the same prompts: tau ratio with a paired
    bootstrap interval over prompts, and how many prompts each head accepted more on."""
    out = {"reference": main, "interval": "90% paired bootstrap over prompts", "modes": {}}
    for mode in modes:
        ref = lanes[(main, mode)].results
        rows = []
        for label in per_head:
            if (label, mode) not in decoders:
                continue
            res = lanes[(label, mode)].results
            ratio = bootstrap_ratio(_tau_pairs(res), _tau_pairs(ref))
            taus = [(sum(r.accept_lens) + r.rounds) / r.rounds if r.rounds else 1.0 for r in res]
            ref_taus = [(sum(r.accept_lens) + r.rounds) / r.rounds if r.rounds else 1.0 for r in ref]
            st = per_head[label][mode]
            row = {
                "head": label,
                "layout": per_head[label]["head"]["layout"],
                "tau": st["acceptance"]["tau"],
                "tau_interval": st["acceptance"]["tau_interval"],
                "speedup_vs_plain": st["speedup_vs_plain"],
                "tau_ratio_vs_reference": round(ratio["value"], 4),
                "tau_ratio_interval": _ci(ratio),
                "prompts_better_worse_equal": [
                    sum(a > b for a, b in zip(taus, ref_taus)),
                    sum(a < b for a, b in zip(taus, ref_taus)),
                    sum(a == b for a, b in zip(taus, ref_taus)),
                ],
            }
            if label != main:
                lo, hi = ratio["low"], ratio["high"]
                row["verdict"] = (
                    f"higher tau than {main}"
                    if lo > 1
                    else f"lower tau than {main}"
                    if hi < 1
                    else "no significant difference"
                )
            rows.append(row)
        out["modes"][mode] = rows
    return out
