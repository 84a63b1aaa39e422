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


def target_ids(d2t: torch.Tensor) -> torch.Tensor:
    """The law every engine applies, LongTensor[draft vocab]: target id = draft id + d2t[draft id]."""
    return torch.arange(len(d2t), device=d2t.device) + d2t.to(torch.long)


def draft_to_target(draft_ids: torch.Tensor, d2t: torch.Tensor) -> torch.Tensor:
    """`target_ids` at some draft ids only (the decode step's), without the whole vector."""
    return draft_ids + d2t[draft_ids].to(torch.long)


def t2d_of(d2t: torch.Tensor, target_vocab: int) -> torch.Tensor:
    """The bool mask over the target vocab that a valid `d2t` implies (its target ids marked)."""
    t2d = torch.zeros(target_vocab, dtype=torch.bool, device=d2t.device)
    t2d[target_ids(d2t)] = True
    return t2d


def target_to_draft_index(d2t: torch.Tensor, target_vocab: int) -> torch.Tensor:
    """LongTensor[target_vocab]: the draft id of each target id, -1 outside the draft vocab."""
    index = torch.full((target_vocab,), -1, dtype=torch.long, device=d2t.device)
    index[target_ids(d2t)] = torch.arange(len(d2t), device=d2t.device)
    return index


def map_problems(d2t: torch.Tensor, t2d: torch.Tensor | None, target_vocab: int) -> list[str]:
    """What makes a d2t/t2d pair unusable, [] when nothing does. Every reader of a map (a head in eval,
    export and serve, a cache in train and `cache --verify`) asks this, so one map is valid everywhere:

      d2t    1-D, an integer dtype (a float d2t would be truncated by one reader and refused by another)
      range  every target id in 0..target_vocab-1
      unique no two draft ids on one target id (one of their logits would be lost: llama.cpp scatters
             them into the target vocab, and the teacher's distribution would count one id twice)
      t2d    when present: 1-D bool over the target vocab, marking exactly d2t's target ids"""
    if d2t.dim() != 1 or d2t.dtype == torch.bool or d2t.is_floating_point() or d2t.is_complex():
        return [f"d2t is {d2t.dtype} of shape {tuple(d2t.shape)}: it must be a 1-D integer tensor (int64)"]
    problems = []
    ids = target_ids(d2t.cpu())
    outside = (ids < 0) | (ids >= target_vocab)
    if bool(outside.any()):
        problems.append(
            f"d2t sends {int(outside.sum())} draft id(s) to target ids outside the target vocab 0..{target_vocab - 1} "
            f"({int(ids.min())}..{int(ids.max())})"
        )
        return problems
    taken = len(ids) - len(torch.unique(ids))
    if taken:
        problems.append(f"d2t maps {taken} draft id(s) to the same target id as another draft id (not injective)")
        return problems
    if t2d is not None:
        if t2d.dim() != 1 or t2d.dtype != torch.bool or t2d.numel() != target_vocab:
            problems.append(
                f"t2d is {t2d.dtype} of shape {tuple(t2d.shape)}: it must be a bool mask over the {target_vocab} "
                "target ids"
            )
        elif not torch.equal(t2d.cpu(), t2d_of(d2t.cpu(), target_vocab)):
            problems.append(
                f"t2d disagrees with d2t: it marks {int(t2d.sum())} target ids, d2t reaches "
                f"{len(torch.unique(ids))} (the two maps were not made together)"
            )
    return problems


def coverage(counts: torch.Tensor, t2d: torch.Tensor) -> float:
    """Share of masked tokens whose target id is inside the draft vocab."""
    total = int(counts.sum())
    return float(counts[t2d].sum()) / total if total else 0.0
