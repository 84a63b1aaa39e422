"""Paired bootstrap intervals and the choice of a serving configuration from measured runs. Pure
functions on numbers. Acceptance itself (tau, alpha_k by depth) is `speculate/acceptance.py`."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence


# ---------------------------------------------------------------- paired bootstrap
def sum_ratio(num: Sequence[float], den: Sequence[float], idx: Sequence[int]) -> float:
    """sum(num) / sum(den) over the prompts IDX (nan when den sums to 0)."""
    d = sum(den[i] for i in idx)
    return sum(num[i] for i in idx) / d if d else math.nan


def bootstrap(
    stat: Callable[[Sequence[int]], float], n: int, *, samples: int = 2000, level: float = 0.9, seed: int = 0
) -> tuple[float, float, float]:
    """STAT over all N prompts, and the ends of its LEVEL percentile interval over the prompts resampled
    with replacement (STAT takes the resampled prompts' indices)."""
    rng = random.Random(seed)
    values = sorted(stat([rng.randrange(n) for _ in range(n)]) for _ in range(samples))
    return stat(range(n)), values[int((1 - level) / 2 * (samples - 1))], values[int((1 + level) / 2 * (samples - 1))]


def bootstrap_ratio(
    a: tuple[Sequence[float], Sequence[float]],
    b: tuple[Sequence[float], Sequence[float]] | None = None,
    *,
    samples: int = 2000,
    level: float = 0.9,
    seed: int = 0,
) -> dict:
    """Point value and percentile interval of sum(a_num)/sum(a_den) [ / sum(b_num)/sum(b_den) ],
    resampling prompts with replacement; a and b are paired per prompt (same index = same prompt).
    The interval says how much the value would move on other prompts of the same kind, timing
    noise included (each prompt's times carry it)."""
    n = len(a[0])
    if n == 0 or any(len(s) != n for s in (*a, *(b or ()))):
        raise ValueError("bootstrap_ratio: per-prompt sequences of one non-zero length expected")

    def stat(idx):
        v = sum_ratio(a[0], a[1], idx)
        return v / sum_ratio(b[0], b[1], idx) if b is not None else v

    point, low, high = bootstrap(stat, n, samples=samples, level=level, seed=seed)
    return {"value": point, "low": low, "high": high, "level": level, "prompts": n}


# ---------------------------------------------------------------- choosing a configuration
def config_cost(c: dict) -> tuple[int, int, int]:
    """Cheaper first: fewer tokens verified per pass (target compute at batch > 1), then fewer draft
    steps, then a narrower tree."""
    return (c["num_draft_tokens"], c["steps"], c["topk"])


def choose_config(candidates: list[dict], plain: tuple[Sequence[float], Sequence[float]], tolerance: float) -> dict:
    """The configuration to serve, from measured per-prompt (tokens, seconds) of each candidate.

    candidates: [{"name", "steps", "topk", "num_draft_tokens", "tokens": [...], "seconds": [...]}],
    plain: (tokens, seconds) per prompt of plain decoding on the same prompts.
    The best is the highest measured speedup. Every candidate whose speedup relative to the best
    could be within `tolerance` (upper end of the paired 90% interval of S_c / S_best >= 1 - tol)
    is tied with it; the cheapest of the tied set is recommended, so two runs that see the same
    plateau pick the same point."""
    if not candidates:
        raise ValueError("choose_config: no candidates")
    rows = []
    for c in candidates:
        sp = bootstrap_ratio((c["tokens"], c["seconds"]), plain)
        rows.append({**{k: c[k] for k in ("name", "steps", "topk", "num_draft_tokens")}, "speedup": sp})
    best_i = max(range(len(rows)), key=lambda i: rows[i]["speedup"]["value"])
    best = candidates[best_i]
    for c, row in zip(candidates, rows):
        rel = bootstrap_ratio((c["tokens"], c["seconds"]), (best["tokens"], best["seconds"]))
        row["vs_best"] = rel
        row["tied_with_best"] = rel["high"] >= 1 - tolerance
    tied = [r for r in rows if r["tied_with_best"]]
    pick = min(tied, key=config_cost)
    best_row = rows[best_i]
    rec = {
        "steps": pick["steps"],
        "topk": pick["topk"],
        "num_draft_tokens": pick["num_draft_tokens"],
        "name": pick["name"],
        "speedup": round(pick["speedup"]["value"], 4),
        "speedup_interval": [round(pick["speedup"]["low"], 4), round(pick["speedup"]["high"], 4)],
        "best_measured": best_row["name"],
        "tied": sorted((r["name"] for r in tied), key=lambda n: config_cost(next(x for x in rows if x["name"] == n))),
        "rule": (
            f"highest measured speedup; configurations within {tolerance:.0%} of it (upper end of the paired "
            f"90% bootstrap interval over prompts) are tied, and the cheapest tied one (fewest verified "
            f"tokens, then steps) is recommended"
        ),
    }
    notes = []
    if len(tied) > 1:
        notes.append(f"{len(tied)} configurations are tied within noise; recommending the cheapest, {pick['name']}")
    if best_row["speedup"]["high"] < 1.0:
        notes.append("no configuration beats plain decoding with this head (measured)")
    elif pick["speedup"]["low"] <= 1.0:
        notes.append("the recommended configuration is not distinguishable from plain decoding within noise")
    rec["notes"] = notes
    return {"recommended": rec, "candidates": rows}
