"""Training-time test: teacher distributions, the masked TTT loss, and its statistics.

Pure tensor functions (no files, no screen). Alignment, with x the token ids of a sequence:
  * the target's distribution at position p predicts x[p+1] (teacher row p);
  * draft step k at anchor t reads x[t+1+k] and predicts x[t+2+k], so its teacher is row t+1+k;
  * an anchor counts at step k when x[t+2+k] is an assistant token (`loss_mask[t+2+k]`) and the
    target's argmax at row t+1+k lies in the draft vocab (else the draft cannot express it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .target import LogitSpec, apply_logit_spec
from .vocab import target_ids, target_to_draft_index


@dataclass
class Teacher:
    """The target's next-token distribution restricted to the draft vocab, at the positions the
    loss reads: only rows whose next token is trained and whose target argmax is a draft token
    are computed (the rest are never read), so a 16k-wide softmax is not paid on prompt tokens."""

    probs: torch.Tensor  # [M, draft_vocab] float32, rows sum to 1 (renormalised over the draft vocab)
    row: torch.Tensor  # [B, T] long: the row of `probs` for position (b, t), -1 where not computed
    argmax: torch.Tensor  # [B, T] draft id of the target's argmax (meaningless where ~valid)
    valid: torch.Tensor  # [B, T] bool: the target's argmax (over its whole vocab) is in the draft vocab

    def at(self, b: int, t: int) -> torch.Tensor:
        """The distribution at one position (tests and debugging)."""
        r = int(self.row[b, t])
        if r < 0:
            raise IndexError(f"teacher row ({b}, {t}) was not computed (not a counted position)")
        return self.probs[r]


def needed_rows(valid: torch.Tensor, loss_mask: torch.Tensor | None) -> torch.Tensor:
    """[B, T] positions any TTT step reads: step k at anchor t reads row t+1+k when token
    t+2+k is trained, i.e. row p is read iff loss_mask[p+1] and valid[p]."""
    return valid if loss_mask is None else valid & _shift(loss_mask, 1, False)


def _rows_index(need: torch.Tensor) -> torch.Tensor:
    """The k-th needed position (row-major) gets row k, the rest -1: a running count, so the host
    need not read how many there are."""
    count = need.reshape(-1).long().cumsum(0).view(need.shape)
    return torch.where(need, count - 1, torch.full_like(count, -1))


@torch.no_grad()
def full_vocab_argmax(last_hidden: torch.Tensor, lm_head_weight: torch.Tensor, rows: int = 2048) -> torch.Tensor:
    """[...] target id of the argmax of `last_hidden @ lm_head.T`, chunked over tokens (full-vocab
    logits of a 128k-vocab target are 0.5 MB per token). Caches store this, so training rarely runs it."""
    flat = last_hidden.reshape(-1, last_hidden.shape[-1])
    out = [
        torch.matmul(flat[s : s + rows].to(lm_head_weight.dtype), lm_head_weight.t()).argmax(-1)
        for s in range(0, flat.shape[0], rows)
    ]
    return torch.cat(out).view(last_hidden.shape[:-1])


@torch.no_grad()
def teacher_from_hidden(
    last_hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    d2t: torch.Tensor,
    loss_mask: torch.Tensor | None = None,
    target_argmax: torch.Tensor | None = None,
    rows: int = 2048,
    compute_dtype: torch.dtype | None = None,
    spec: LogitSpec | None = None,
) -> Teacher:
    """Teacher from the target's final-normed hidden states and its lm_head [V, H], with the
    family's logit processing `spec` (Gemma-2 softcapping: monotonic, so the argmax is the plain
    one, but the distribution changes).

    `target_argmax` ([B, T] target ids, stored by the cache) saves the full-vocab matmul; only the
    draft-vocab rows of lm_head are then multiplied, at the rows the loss reads (`loss_mask`).
    `compute_dtype` (e.g. bf16 on CPUs with AMX) is the matmul's input dtype; softmax is fp32.
    """
    if target_argmax is None:
        target_argmax = full_vocab_argmax(last_hidden, lm_head_weight, rows)
    index = target_to_draft_index(d2t, lm_head_weight.shape[0])
    arg = index[target_argmax.long()]
    valid = arg >= 0
    need = needed_rows(valid, loss_mask)
    dtype = compute_dtype or lm_head_weight.dtype
    head = lm_head_weight.index_select(0, target_ids(d2t)).to(dtype)
    hidden = last_hidden[need]
    chunks = [
        torch.softmax(apply_logit_spec(torch.matmul(hidden[s : s + rows].to(dtype), head.t()).float(), spec), dim=-1)
        for s in range(0, hidden.shape[0], rows)
    ]
    probs = torch.cat(chunks) if chunks else torch.zeros(0, len(d2t), device=last_hidden.device)
    return Teacher(probs=probs, row=_rows_index(need), argmax=arg.clamp(min=0), valid=valid)


@torch.no_grad()
def teacher_from_topk(
    topk_ids: torch.Tensor,
    topk_logprobs: torch.Tensor,
    d2t: torch.Tensor,
    target_vocab: int,
    loss_mask: torch.Tensor | None = None,
) -> Teacher:
    """Teacher from a compact cache: the target's top-k (ids, log-probs) per position.

    Mass outside the top-k is dropped and the in-draft-vocab part renormalised, which is the
    draft-vocab restriction of the truncated distribution.
    """
    index = target_to_draft_index(d2t, target_vocab)
    draft_ids = index[topk_ids]  # [B,T,k], -1 outside the draft vocab
    top = topk_logprobs.argmax(-1, keepdim=True)
    argmax_draft = draft_ids.gather(-1, top).squeeze(-1)
    valid = argmax_draft >= 0
    need = needed_rows(valid, loss_mask)
    ids, lps = draft_ids[need], topk_logprobs[need]
    inside = ids >= 0
    probs = torch.zeros(ids.shape[0], len(d2t), dtype=torch.float32, device=topk_ids.device)
    probs.scatter_add_(-1, ids.clamp(min=0), lps.float().exp() * inside)
    total = probs.sum(-1, keepdim=True)
    probs = torch.where(total > 0, probs / total.clamp(min=1e-30), probs)
    return Teacher(probs=probs, row=_rows_index(need), argmax=argmax_draft.clamp(min=0), valid=valid)


def _shift(x: torch.Tensor, n: int, fill) -> torch.Tensor:
    """x[:, n:] right-padded to the same length with `fill` (rows past the end do not exist)."""
    if n == 0:
        return x
    pad = torch.full_like(x[:, :n], fill)
    return torch.cat([x[:, n:], pad], dim=1)


def step_masks(loss_mask: torch.Tensor, valid: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Anchor masks [B,T] per step k: loss_mask[t+2+k] & valid[t+1+k]."""
    return [_shift(loss_mask, 2 + k, False) & _shift(valid, 1 + k, False) for k in range(steps)]


@dataclass
class TTTOutput:
    loss: torch.Tensor  # scalar: sum_k w^k * loss_k
    step_loss: torch.Tensor  # [K] detached, mean soft cross-entropy per step (0 where no anchors)
    correct: torch.Tensor  # [K] number of anchors whose draft argmax == teacher argmax
    count: torch.Tensor  # [K] number of anchors counted at step k
    chain_correct: torch.Tensor  # [K] anchors correct at all steps 0..k (among those counted at all of them)
    chain_count: torch.Tensor  # [K] anchors counted at all steps 0..k


class _SoftCrossEntropy(torch.autograd.Function):
    """sum over rows of -(p * log_softmax(z)), computed as logsumexp(z) - p.z (rows of p sum to 1):
    one fp32 softmax in forward, reused in backward (grad = softmax(z) - p), no log-prob tensor kept."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, p: torch.Tensor):
        z = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 logits -> fp32 maths
        p = p.to(z.dtype)
        lse = torch.logsumexp(z, dim=-1)
        loss = (lse - (p * z).sum(-1)).sum()
        soft = torch.exp(z - lse.unsqueeze(-1))
        arg = z.argmax(-1)
        ctx.save_for_backward(soft, p)
        ctx.in_dtype = logits.dtype
        ctx.mark_non_differentiable(arg)
        return loss, arg

    @staticmethod
    def backward(ctx, grad_loss, _grad_arg):
        soft, p = ctx.saved_tensors
        return ((soft - p) * grad_loss).to(ctx.in_dtype), None


def soft_cross_entropy(logits: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed soft cross-entropy, argmax per row) of `logits` [N, V] against rows of probs `p`."""
    return _SoftCrossEntropy.apply(logits, p)


def total_variation(logits: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed total variation 0.5*|p - softmax(logits)|_1, argmax per row). Speculative sampling
    accepts a drafted token with probability 1 - TV(p, q), so this loss is the acceptance the
    draft gives up, not a proxy for it."""
    q = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    return 0.5 * (p.to(q.dtype) - q).abs().sum(), logits.detach().argmax(-1)


LK_FLOOR = 1e-6  # an anchor the draft gives no overlap at all costs -log(1e-6) ~ 13.8, not inf


def neg_log_acceptance(logits: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed -log(alpha) with alpha = sum_v min(p_v, q_v) = 1 - TV(p, q), argmax per row): the LK loss
    (Samarin et al., "LK Losses: Direct Acceptance Rate Optimization for Speculative Decoding", 2026),
    its hyperparameter-free form. alpha is the chance that a sampled draft token is accepted, so this
    optimises acceptance itself; its gradient is TV's scaled by 1/alpha, which keeps it from vanishing
    where the draft overlaps the target little (where plain TV stalls), and at a one-hot p it is
    cross-entropy."""
    q = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    alpha = torch.minimum(p.to(q.dtype), q).sum(-1)
    return -torch.log(alpha.clamp(min=LK_FLOOR)).sum(), logits.detach().argmax(-1)


STEP_LOSSES = {"ce": soft_cross_entropy, "tv": total_variation, "lk": neg_log_acceptance}


def ttt_loss(
    hiddens, logits_fn, teacher: Teacher, loss_mask: torch.Tensor, step_weight: float = 0.8, kind: str = "ce"
) -> TTTOutput:
    """The TTT loss over the K hidden states `hiddens` (from `Eagle3Draft.ttt_unroll`).

    Each step's loss (`kind`: soft cross-entropy, total variation or LK's -log acceptance) is normalised by its own
    anchor count; steps weigh `step_weight**k`.
    """
    step_loss = STEP_LOSSES[kind]
    hiddens = list(hiddens)
    masks = step_masks(loss_mask, teacher.valid, len(hiddens))
    losses, correct, count, chain_correct, chain_count = [], [], [], [], []
    total = None
    chain_ok = chain_in = None
    for k, h in enumerate(hiddens):
        m = masks[k]
        # Logits only on counted anchors: the [N, draft_vocab] head is most of the cost.
        p = teacher.probs[_shift(teacher.row, 1 + k, -1)[m]]
        target_arg = _shift(teacher.argmax, 1 + k, 0)[m]
        ce, arg = step_loss(logits_fn(h[m]), p)
        n = m.sum()
        step = ce / n.clamp(min=1)
        total = step * step_weight**k if total is None else total + step * step_weight**k
        hit = torch.zeros_like(m)
        hit[m] = arg == target_arg
        chain_in = m if chain_in is None else chain_in & m
        chain_ok = hit if chain_ok is None else chain_ok & hit
        losses.append(step.detach())
        correct.append(hit.sum())
        count.append(n)
        chain_correct.append((chain_ok & chain_in).sum())
        chain_count.append(chain_in.sum())
    assert total is not None, "ttt_loss needs at least one TTT step"
    return TTTOutput(
        loss=total,
        step_loss=torch.stack(losses),
        correct=torch.stack(correct).float(),
        count=torch.stack(count).float(),
        chain_correct=torch.stack(chain_correct).float(),
        chain_count=torch.stack(chain_count).float(),
    )


def draft_ttt_loss(
    draft, batch: dict, teacher: Teacher, steps: int, step_weight: float = 0.8, kind: str = "ce"
) -> TTTOutput:
    """Unroll the draft K steps over a padded batch and score it (the training objective)."""
    hiddens = list(draft.ttt_unroll(batch["input_ids"], batch["aux_hidden"], steps))
    return ttt_loss(hiddens, draft.logits, teacher, batch["loss_mask"], step_weight, kind)


def _unroll(draft, input_ids: torch.Tensor, aux_hidden: torch.Tensor, steps: int) -> tuple[torch.Tensor, ...]:
    return tuple(draft.ttt_unroll(input_ids, aux_hidden, steps))


def compiled_ttt_loss(backend: str = "inductor"):
    """`draft_ttt_loss` with the unroll under torch.compile (dynamic batch and length: compiled once,
    not per shape). The scoring stays eager: it selects the counted anchors, whose number depends
    on the data (a graph break inside the step loop would send the whole step back to eager), and
    it is one large matmul plus an already fused cross-entropy."""
    unroll = torch.compile(_unroll, dynamic=True, backend=backend)

    def loss(draft, batch: dict, teacher: Teacher, steps: int, step_weight: float = 0.8, kind: str = "ce") -> TTTOutput:
        hiddens = unroll(draft, batch["input_ids"], batch["aux_hidden"], steps)
        return ttt_loss(hiddens, draft.logits, teacher, batch["loss_mask"], step_weight, kind)

    return loss


# ---------------------------------------------------------------- summaries
def accuracies(correct, count) -> list[float]:
    return [float(c) / float(n) if float(n) > 0 else 0.0 for c, n in zip(correct, count, strict=True)]
