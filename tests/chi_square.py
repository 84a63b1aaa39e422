"""Pearson's chi-square goodness of fit, for the losslessness tests of speculative sampling."""

from __future__ import annotations

import torch


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's test; cells with expected count < 5 are pooled into one."""
    n = counts.sum()
    exp = probs * n
    small = exp < 5
    obs = torch.cat([counts[~small], counts[small].sum().view(1)]).double()
    ex = torch.cat([exp[~small], exp[small].sum().view(1)]).double()
    keep = ex > 0
    obs, ex = obs[keep], ex[keep]
    stat = ((obs - ex) ** 2 / ex).sum()
    df = obs.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.double), stat / 2))
