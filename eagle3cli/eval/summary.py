"""From decoded lanes to the report's numbers: speed, acceptance and tau per (head, mode) with
paired bootstrap intervals over prompts, losslessness, the head comparison, the recommendation."""

from __future__ import annotations

from ..speculate.acceptance import acceptance_by_depth, tau_by_position
from ..speculate.decoder import DecodeResult
from .config import EvalConfig
from .lanes import Decoded
from .metrics import bootstrap_ratio, choose_config

INTERVAL = "90% paired bootstrap over prompts"


def speed(results: list[DecodeResult]) -> dict:
    toks = sum(len(r.tokens) for r in results)
    secs = sum(r.seconds for r in results)
    return {
        "tokens": toks,
        "seconds": round(secs, 4),
        "tokens_per_s": toks / secs if secs else 0.0,
        "target_calls": sum(r.target_calls for r in results),
        "draft_calls": sum(r.draft_calls for r in results),
    }


def per_unit(results: list[DecodeResult]) -> tuple[list[int], list[float]]:
    """(tokens, seconds) per unit: what speedup intervals are resampled from."""
    return [len(r.tokens) for r in results], [r.seconds for r in results]


def tau_pairs(results: list[DecodeResult]) -> tuple[list[int], list[int]]:
    """(tokens emitted by verification rounds, rounds) per unit: tau = sum / sum."""
    return [sum(r.accept_lens) + r.rounds for r in results], [r.rounds for r in results]


def interval(b: dict) -> list[float]:
    return [round(b["low"], 4), round(b["high"], 4)]


def served_config(cfg: EvalConfig, mode: str) -> dict:
    """The engine numbers (SGLang's steps / topk / draft tokens) this mode was decoded with."""
    chain = mode == "chain"
    return {
        "steps": cfg.depth,
        "topk": 1 if chain else cfg.topk,
        "num_draft_tokens": cfg.depth + 1 if chain else cfg.num_draft_tokens,
    }


def mode_stats(cfg: EvalConfig, run: Decoded, key: tuple[str, str], plain: dict, generate: dict | None) -> dict:
    """One (head, mode): acceptance by depth, tau and speedup with their intervals, losslessness."""
    results, plain_results = run.lanes[key].results, run.lanes["plain"].results
    mode = key[1]
    acc = acceptance_by_depth([a for r in results for a in r.accept_lens], cfg.depth, mode)
    emitted, rounds = tau_pairs(results)
    acc["tau_interval"] = interval(bootstrap_ratio((emitted, rounds))) if any(rounds) else [1.0, 1.0]
    acc["tau_by_position"] = tau_by_position([r.accept_lens for r in results])  # answer tokens in, by span
    s = speed(results)
    return {
        "config": served_config(cfg, mode),
        "acceptance": acc,
        "speed": s,
        "speedup_vs_plain": s["tokens_per_s"] / plain["tokens_per_s"],
        "speedup_interval": interval(bootstrap_ratio(per_unit(results), per_unit(plain_results))),
        "speedup_vs_generate": s["tokens_per_s"] / generate["tokens_per_s"] if generate else None,
        "per_prompt": [
            {"prompt": u, "tokens": len(r.tokens), "rounds": r.rounds, "accepted": sum(r.accept_lens)}
            for u, r in zip(run.units, results)
        ],
        "lossless": lossless(
            results, run.mismatches[key], cfg.temperature <= 0, run.near_ties.get(key, []), run.reference
        ),
    }


def lossless(
    results: list[DecodeResult], mism: list[dict], greedy: bool, ties: list[dict] | None = None, ref: dict | None = None
) -> dict:
    if greedy:
        ties = ties or []
        return {
            "compared": len(results),
            "mismatches": len(mism),
            "examples": mism[:5],
            "near_ties": len(ties),
            "near_tie_examples": ties[:5],
            "reference": ref or {},
        }
    return {
        "compared": 0,
        "note": "sampling: outputs are distributed as the target's by the per-token rejection rule; "
        "see sampling_check for the measured comparison with plain sampling",
    }


def recommend_measured(cfg: EvalConfig, run: Decoded, head: str, modes: list[str]) -> dict:
    """Without --sweep: the best of the configurations this run decoded with, ties to the cheapest."""
    measured = []
    for mode in modes:
        tokens, seconds = per_unit(run.lanes[(head, mode)].results)
        config = served_config(cfg, mode)
        measured.append({"name": f"{mode} {config}", **config, "tokens": tokens, "seconds": seconds})
    rec = choose_config(measured, per_unit(run.lanes["plain"].results), cfg.tie_tolerance)["recommended"]
    return {**rec, "from": f"the configurations this run measured ({', '.join(modes)}); --sweep compares every depth"}


def _taus(results: list[DecodeResult]) -> list[float]:
    return [(sum(r.accept_lens) + r.rounds) / r.rounds if r.rounds else 1.0 for r in results]


def compare_heads(per_head: dict, run: Decoded, modes: list[str], main: str) -> dict:
    """Every head against the first, per mode, on the same prompts: tau ratio with a paired
    bootstrap interval over prompts, and how many prompts each head accepted more on."""
    out: dict = {"reference": main, "interval": INTERVAL, "modes": {}}
    for mode in modes:
        ref = run.lanes[(main, mode)].results
        rows = []
        for label in per_head:
            if (label, mode) not in run.mismatches:
                continue
            res = run.lanes[(label, mode)].results
            ratio = bootstrap_ratio(tau_pairs(res), tau_pairs(ref))
            taus, ref_taus = _taus(res), _taus(ref)
            st = per_head[label][mode]
            row = {
                "head": label,
                "layout": per_head[label]["head"]["layout"],
                "tau": st["acceptance"]["tau"],
                "tau_interval": st["acceptance"]["tau_interval"],
                "speedup_vs_plain": st["speedup_vs_plain"],
                "tau_ratio_vs_reference": round(ratio["value"], 4),
                "tau_ratio_interval": interval(ratio),
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
