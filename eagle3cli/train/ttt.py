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
import torch.nn.functional as F


@dataclass
class Teacher:
    """The target's next-token distribution restricted to the draft vocab, per position."""

    probs: torch.Tensor  # [B, T, draft_vocab] float32, rows sum to 1 (renormalised over the draft vocab)
    argmax: torch.Tensor  # [B, T] draft id of the target's argmax (meaningless where ~valid)
    valid: torch.Tensor  # [B, T] bool: the target's argmax (over its whole vocab) is in the draft vocab


def target_to_draft_index(d2t: torch.Tensor, target_vocab: int) -> torch.Tensor:
    """LongTensor[target_vocab]: the draft id of each target id, -1 outside the draft vocab."""
    index = torch.full((target_vocab,), -1, dtype=torch.long, device=d2t.device)
    index[torch.arange(len(d2t), device=d2t.device) + d2t] = torch.arange(len(d2t), device=d2t.device)
    return index


@torch.no_grad()
def teacher_from_hidden(
    last_hidden: torch.Tensor, lm_head_weight: torch.Tensor, d2t: torch.Tensor, rows: int = 2048
) -> Teacher:
    """Teacher from the target's final-normed hidden states and its lm_head [V, H].

    Chunked over tokens: full-vocab logits of a 128k-vocab target are 0.5 MB per token.
    """
    shape = last_hidden.shape[:-1]
    flat = last_hidden.reshape(-1, last_hidden.shape[-1])
    draft_target_ids = torch.arange(len(d2t), device=d2t.device) + d2t
    index = target_to_draft_index(d2t, lm_head_weight.shape[0])
    probs, argmax = [], []
    for s in range(0, flat.shape[0], rows):
        logits = torch.matmul(flat[s : s + rows].to(lm_head_weight.dtype), lm_head_weight.t()).float()
        argmax.append(index[logits.argmax(-1)])
        probs.append(torch.softmax(logits.index_select(-1, draft_target_ids), dim=-1))
    arg = torch.cat(argmax).view(shape)
    return Teacher(probs=torch.cat(probs).view(*shape, len(d2t)), argmax=arg.clamp(min=0), valid=arg >= 0)


@torch.no_grad()
def teacher_from_topk(
    topk_ids: torch.Tensor, topk_logprobs: torch.Tensor, d2t: torch.Tensor, target_vocab: int
) -> Teacher:
    """Teacher from a compact cache: the target's top-k (ids, log-probs) per position.

    Mass outside the top-k is dropped and the in-draft-vocab part renormalised, which is the
    draft-vocab restriction of the truncated distribution.
    """
    index = target_to_draft_index(d2t, target_vocab)
    draft_ids = index[topk_ids]  # [B,T,k], -1 outside the draft vocab
    inside = draft_ids >= 0
    probs = torch.zeros(*topk_ids.shape[:-1], len(d2t), dtype=torch.float32, device=topk_ids.device)
    mass = topk_logprobs.float().exp() * inside
    probs.scatter_add_(-1, draft_ids.clamp(min=0), mass)
    total = probs.sum(-1, keepdim=True)
    probs = torch.where(total > 0, probs / total.clamp(min=1e-30), probs)
    top = topk_logprobs.argmax(-1, keepdim=True)
    argmax_draft = draft_ids.gather(-1, top).squeeze(-1)
    return Teacher(probs=probs, argmax=argmax_draft.clamp(min=0), valid=argmax_draft >= 0)


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


def ttt_loss(hiddens, logits_fn, teacher: Teacher, loss_mask: torch.Tensor, step_weight: float = 0.8) -> TTTOutput:
    """The TTT loss over the K hidden states `hiddens` (from `Eagle3Draft.ttt_unroll`).

    Each step's loss is normalised by its own anchor count; steps weigh `step_weight**k`.
    """
    hiddens = list(hiddens)
    masks = step_masks(loss_mask, teacher.valid, len(hiddens))
    losses, correct, count, chain_correct, chain_count = [], [], [], [], []
    total = None
    chain_ok = chain_in = None
    for k, h in enumerate(hiddens):
        m = masks[k]
        # Logits only on counted anchors: the [N, draft_vocab] head is most of the cost.
        p = _shift(teacher.probs, 1 + k, 0.0)[m]
        target_arg = _shift(teacher.argmax, 1 + k, 0)[m]
        logits = logits_fn(h[m])
        logp = F.log_softmax(logits if logits.dtype == torch.float64 else logits.float(), dim=-1)
        n = m.sum()
        step = -(p * logp).sum() / n.clamp(min=1)
        total = step * step_weight**k if total is None else total + step * step_weight**k
        hit = torch.zeros_like(m)
        hit[m] = logp.argmax(-1) == target_arg
        chain_in = m if chain_in is None else chain_in & m
        chain_ok = hit if chain_ok is None else chain_ok & hit
        losses.append(step.detach())
        correct.append(hit.sum())
        count.append(n)
        chain_correct.append((chain_ok & chain_in).sum())
        chain_count.append(chain_in.sum())
    return TTTOutput(
        loss=total,
        step_loss=torch.stack(losses),
        correct=torch.stack(correct).float(),
        count=torch.stack(count).float(),
        chain_correct=torch.stack(chain_correct).float(),
        chain_count=torch.stack(chain_count).float(),
    )


def draft_ttt_loss(draft, batch: dict, teacher: Teacher, steps: int, step_weight: float = 0.8) -> TTTOutput:
    """Unroll the draft K steps over a padded batch and score it (the training objective)."""
    hiddens = list(draft.ttt_unroll(batch["input_ids"], batch["aux_hidden"], steps))
    return ttt_loss(hiddens, draft.logits, teacher, batch["loss_mask"], step_weight)


# ---------------------------------------------------------------- summaries
def accuracies(correct, count) -> list[float]:
    return [float(c) / float(n) if float(n) > 0 else 0.0 for c, n in zip(correct, count, strict=True)]


def conditional_acceptance(chain_correct, chain_count) -> list[float]:
    """alpha_k: P(correct at k | correct at 0..k-1), estimated on anchors counted at all steps 0..k."""
    out, prev = [], None
    for c, n in zip(chain_correct, chain_count, strict=True):
        c, n = float(c), float(n)
        rate = c / n if n > 0 else 0.0
        out.append(rate if prev is None else (rate / prev if prev > 0 else 0.0))
        prev = rate
    return out


def simulated_accept_length(step_acc: list[float]) -> float:
    """a1 + a1*a2 + ... : expected accepted draft tokens per round if step k is right w.p. a_k
    (independently); tau = this + 1 for the target's bonus token."""
    total, run = 0.0, 1.0
    for a in step_acc:
        run *= a
        total += run
    return total
