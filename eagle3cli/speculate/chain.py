"""Chain verification: the target checks D drafted tokens in one pass and emits accept_len + 1.

Rows of `target_logits`/`target_probs` are aligned with the verification input
`[last committed token, d_1, ..., d_D]`: row j is the target's prediction after d_j (row 0:
after the committed prefix), so row j judges d_{j+1} and row accept_len gives the bonus token.
"""

from __future__ import annotations

import torch

from .sampling import residual, sample_from


def verify_chain_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, torch.Tensor]:
    """(accept_len, emitted tokens [accept_len + 1]): the longest prefix equal to the target's
    argmax, then the target's own argmax (the bonus token). Output == greedy target decoding."""
    target_argmax = target_logits.argmax(-1)  # [D+1]
    d = draft_tokens.shape[0]
    mismatch = (draft_tokens != target_argmax[:d]).nonzero()
    accept_len = int(mismatch[0, 0]) if mismatch.numel() else d
    return accept_len, target_argmax[: accept_len + 1].clone()


def verify_chain_sampling(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[int, torch.Tensor]:
    """Lossless speculative sampling (Leviathan et al. / Chen et al.).

    draft_tokens [D] were drawn from draft_probs [D, V] (in target-vocab space); target_probs
    [D+1, V]. Token d_j is accepted with probability min(1, p(d_j) / q(d_j)); at the first
    rejection one token is drawn from normalize(max(0, p - q)); if all D are accepted a bonus
    token is drawn from the last target row. The emitted tokens follow the target's distribution.
    """
    d = draft_tokens.shape[0]
    idx = torch.arange(d, device=target_probs.device)
    p = target_probs[idx, draft_tokens]
    q = draft_probs[idx, draft_tokens]
    u = torch.rand(d, generator=generator, dtype=p.dtype, device=p.device)
    rejected = (u * q > p).nonzero()  # u < p/q without dividing by q
    if rejected.numel() == 0:
        bonus = sample_from(target_probs[d], generator)
        return d, torch.cat([draft_tokens, bonus.view(1)])
    j = int(rejected[0, 0])
    fix = sample_from(residual(target_probs[j], draft_probs[j]), generator)
    return j, torch.cat([draft_tokens[:j], fix.view(1)])
