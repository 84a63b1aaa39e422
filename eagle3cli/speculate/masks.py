"""Attention masks for one verification pass over a KV cache, as transformers defines them
(masking_utils): causal is `key position <= query position`, a sliding window of W adds
`key position > query position - W`."""

from __future__ import annotations

import torch


def attention_mask(
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    start: int,
    visible: torch.Tensor | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Bool [n, S] (True = attend) for n new inputs at rope positions `query_positions` [n], over
    S keys at `key_positions` [S]: the committed prefix (keys [0, start)) then the n new inputs.

    visible [n, n]: which new inputs each one sees (a tree's ancestor mask); None = causal by
    position (a chain). `window`: a sliding-window layer's window, applied to positions, so a
    tree node sees what its path would see as a plain sequence.
    """
    q = query_positions[:, None]
    if visible is None:
        mask = key_positions[None, :] <= q
    else:
        n = query_positions.shape[0]
        prefix = torch.ones(n, start, dtype=torch.bool, device=visible.device)
        mask = torch.cat([prefix, visible.to(torch.bool)], dim=1)
    if window is not None:
        mask = mask & (key_positions[None, :] > q - window)
    return mask
