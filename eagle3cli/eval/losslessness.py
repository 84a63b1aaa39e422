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

from ..node.devices import MATMUL_RELATIVE_ERROR, matmul_precision
from ..speculate.decoder import plain_decode, target_forward
from ..speculate.target import target_logits
from ..speculate.target_kv import TargetKV

RULE = (
    "per-token speculative sampling: a drafted token x is accepted with probability min(1, p(x)/q(x)), "
    "else one token is drawn from max(0, p - q) renormalised (trees: siblings tried in turn against the "
    "target's renormalised remainder); every emitted token is then distributed as the target's p"
)


def first_diff(a: list[int], b: list[int]) -> int:
    return next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def greedy_reference(target) -> dict:
    """What greedy outputs are compared with, and how strictly. The reference is always plain decoding
    of the same target in the same dtype on the same device (the same kernels); but the speculative
    verify pass scores D+1 tokens per forward where plain decoding scores one, and the two matmul
    shapes sum in different orders. In fp32 on IEEE matmuls they part only at exact ties (1.6e-5
    apart, measured once in 40 prompts); in bf16/fp16, or fp32 under TF32 (GPUs), at every near tie
    within that precision's rounding. Such a difference is numerics, counted apart with its logit
    gap; any other is a decoder bug."""
    dtype = next(target.parameters()).dtype
    matmuls = matmul_precision(dtype, target.device)
    tol = MATMUL_RELATIVE_ERROR[matmuls]
    return {
        "reference": "plain decoding, same target, dtype and device (one token per forward)",
        "dtype": str(dtype).removeprefix("torch."),
        "device": str(target.device),
        "matmuls": matmuls,
        "exact": matmuls == "fp32",  # the two paths round alike up to fp32 sums
        "near_tie_tolerance": tol,
        "definition": f"token-for-token equality, except where the first differing tokens' logits are within "
        f"{tol:g} x the largest logit ({matmuls} rounding): a near tie, counted apart",
    }


@torch.inference_mode()
def near_tie(target, context: list[int], a: int, b: int, reference: dict) -> dict | None:
    """{logit_gap, tolerance} when tokens a and b are a near tie after `context` under the reference's
    precision (the target's logits as plain decoding computes them), else None."""
    kv = TargetKV(target, len(context) + 1)
    hidden = target_forward(target, kv, torch.tensor([context], device=target.device), 0)[-1:]
    logits = target_logits(target, hidden)[0].float()
    gap = abs(float(logits[a] - logits[b]))
    tol = reference["near_tie_tolerance"] * max(1.0, float(logits.abs().max()))
    return {"logit_gap": round(gap, 5), "tolerance": round(tol, 5)} if gap <= tol else None


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
