"""The draft vocabulary: the most frequent assistant (masked) tokens, as SGLang/vLLM map it.

`d2t[draft_id] = target_id - draft_id` (int64, length draft vocab), so an engine recovers the
target id as `draft_id + d2t[draft_id]`; `t2d` is a bool mask over the target vocab. Draft ids
are assigned in ascending target-id order (what SpecForge does), which keeps d2t monotone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # the type of a cache's token arrays; the maps themselves are torch
    import numpy as np


def token_counts(
    samples: Iterable[tuple[Sequence[int] | np.ndarray, Sequence[bool] | np.ndarray]], target_vocab_size: int
) -> torch.Tensor:
    """Frequencies of masked tokens: LongTensor[target_vocab_size]."""
    counts = torch.zeros(target_vocab_size, dtype=torch.int64)
    for ids, mask in samples:
        t = torch.as_tensor(ids, dtype=torch.int64)[torch.as_tensor(mask, dtype=torch.bool)]
        if t.numel():
            counts += torch.bincount(t, minlength=target_vocab_size)[:target_vocab_size]
    return counts


def select_draft_tokens(counts: torch.Tensor, draft_vocab_size: int) -> torch.Tensor:
    """Target ids of the draft vocab, ascending. Ties (incl. unseen tokens) go to the lower id,
    so the choice is deterministic and a small corpus still fills the whole draft vocab."""
    if not 0 < draft_vocab_size <= counts.numel():
        raise ValueError(f"draft_vocab_size {draft_vocab_size} not in 1..{counts.numel()}")
    ids = torch.arange(counts.numel())
    # Stable sort on -count keeps ascending id order among equal counts.
    order = torch.sort(-counts, stable=True).indices
    chosen = ids[order[:draft_vocab_size]]
    return torch.sort(chosen).values


def build_mapping(draft_token_ids: torch.Tensor, target_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t int64[draft], t2d bool[target]) from the ascending target ids of the draft vocab."""
    draft_token_ids = draft_token_ids.to(torch.int64)
    d2t = draft_token_ids - torch.arange(draft_token_ids.numel(), dtype=torch.int64)
    t2d = torch.zeros(target_vocab_size, dtype=torch.bool)
    t2d[draft_token_ids] = True
    return d2t, t2d


def draft_to_target(draft_ids: torch.Tensor, d2t: torch.Tensor) -> torch.Tensor:
    return draft_ids + d2t[draft_ids]


def target_to_draft_index(d2t: torch.Tensor, target_vocab: int) -> torch.Tensor:
    """LongTensor[target_vocab]: the draft id of each target id, -1 outside the draft vocab."""
    index = torch.full((target_vocab,), -1, dtype=torch.long, device=d2t.device)
    draft = torch.arange(len(d2t), device=d2t.device)
    index[draft + d2t] = draft
    return index


def coverage(counts: torch.Tensor, t2d: torch.Tensor) -> float:
    """Share of masked tokens whose target id is inside the draft vocab."""
    total = int(counts.sum())
    return float(counts[t2d].sum()) / total if total else 0.0
