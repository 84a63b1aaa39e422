"""Sampled-mode losslessness, checked on outputs: speculative and plain sampling from the same
prompt, many seeds each, compared position by position with a two-sample chi-square test.

What makes sampling lossless is the per-token rule the decoder applies (accept a drafted token
with min(1, p/q), else resample from max(0, p - q); trees: sibling-by-sibling rejection), whose
output distribution equals the target's exactly; tests/unit/test_speculate.py checks that rule
against exact distributions. This check is the end-to-end witness on real generations: a
decoder bug (wrong cache crop, wrong position, a biased resample) shows up as a distribution
shift at some position after the first speculative round.
"""

from __future__ import annotations

from collections import Counter

import torch

from ..speculate.decoder import plain_decode

RULE = (
    "per-token speculative sampling: a drafted token x is accepted with probability min(1, p(x)/q(x)), "
    "else one token is drawn from max(0, p - q) renormalised (trees: siblings tried in turn against the "
    "target's renormalised remainder); every emitted token is then distributed as the target's p"
)


def two_sample_chi_square(a: list[int], b: list[int]) -> dict:
    """Homogeneity test of two samples of categories; cells with expected count < 5 are pooled."""
    ca, cb = Counter(a), Counter(b)
    na, nb = len(a), len(b)
    cells, pooled = [], [0, 0]
    for k in set(ca) | set(cb):
        tot = ca[k] + cb[k]
        if min(tot * na, tot * nb) / (na + nb) < 5:
            pooled[0] += ca[k]
            pooled[1] += cb[k]
        else:
            cells.append((ca[k], cb[k]))
    if sum(pooled):
        cells.append((pooled[0], pooled[1]))
    stat = 0.0
    for x, y in cells:
        tot = x + y
        for obs, n in ((x, na), (y, nb)):
            exp = tot * n / (na + nb)
            stat += (obs - exp) ** 2 / exp if exp else 0.0
    dof = max(len(cells) - 1, 0)
    p = (
        float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.double), torch.tensor(stat / 2)))
        if dof
        else 1.0
    )
    return {"chi2": round(stat, 3), "dof": dof, "p_value": p}


@torch.inference_mode()
def sampling_check(
    target,
    decoder,
    prompt_ids: list[int],
    eos: set[int],
    draws: int,
    positions: int,
    temperature: float,
    top_p: float,
    seed: int = 0,
) -> dict:
    """Token distributions at positions 1..positions-1 (position 0 is sampled from the target in
    both decoders) of `draws` speculative vs `draws` plain generations."""
    spec_tok: list[list[int]] = [[] for _ in range(positions)]
    plain_tok: list[list[int]] = [[] for _ in range(positions)]
    for s in range(draws):
        r = decoder.generate(prompt_ids, positions, seed=seed + s)
        p = plain_decode(target, prompt_ids, positions, eos, temperature, top_p, seed=10_000_019 + seed + s)
        for j in range(positions):
            if j < len(r.tokens):
                spec_tok[j].append(r.tokens[j])
            if j < len(p.tokens):
                plain_tok[j].append(p.tokens[j])
    tests = []
    for j in range(1, positions):
        if len(spec_tok[j]) >= 20 and len(plain_tok[j]) >= 20:
            tests.append({"position": j, **two_sample_chi_square(spec_tok[j], plain_tok[j])})
    # Bonferroni over positions: one test at the 1% level overall
    worst = min((t["p_value"] for t in tests), default=1.0)
    return {
        "rule": RULE,
        "draws": draws,
        "positions": tests,
        "min_p_value": worst,
        "passed": worst * max(len(tests), 1) >= 0.01,
        "test": "two-sample chi-square per output position, speculative vs plain sampling, Bonferroni 1%",
    }
