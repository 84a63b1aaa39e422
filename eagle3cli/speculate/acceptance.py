"""Acceptance, defined once: tau (tokens emitted per target verification pass = accepted draft
tokens + the target's bonus token) and alpha_k (draft token k accepted given tokens 1..k-1 were),
from each place they are measured or estimated:

  measured rounds        `acceptance_by_depth`, `tau_of`        eval's decoder (accept length per round)
  engine counters        `tau_from_counts`, `unconditional_from_counts`   vLLM's /metrics (drafts, accepted, per position)
  the held-out walk      `accept_lengths`, `walk_rounds`, `chain_summary` train's learning curve (no decoding)
  the TTT estimate       `conditional_acceptance`, `simulated_tau`        train's metrics.jsonl (`sim_tau`)

Each converts its counts into P(first k draft tokens accepted) = p_k, and then
tau = 1 + sum_k p_k and alpha_k = p_k / p_{k-1}; tests/unit/test_acceptance.py builds one case and
checks that every route gives the same tau and alpha_k. `simulated_accept_length` is the TTT
estimate without the bonus token (metrics.jsonl's `sim_accept_len`, kept for old runs' readers).
Pure functions on numbers and tensors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .ttt import Teacher, _shift


# ---------------------------------------------------------------- the definitions
def tau_from_unconditional(p: Sequence[float]) -> float:
    """tau = 1 + sum_k P(first k draft tokens accepted): the expected tokens per target pass."""
    return 1.0 + sum(float(x) for x in p)


def conditional_from_unconditional(p: Sequence[float]) -> list[float]:
    """alpha_k = p_k / p_{k-1} (alpha_1 = p_1); 0 where nothing reached depth k-1."""
    p = [float(x) for x in p]
    return [p[0]] + [p[k] / p[k - 1] if p[k - 1] > 0 else 0.0 for k in range(1, len(p))] if p else []


def tau_from_counts(accepted: float, rounds: float) -> float | None:
    """tau from totals: 1 + accepted draft tokens / verification rounds (vLLM's counters:
    1 + num_accepted_tokens / num_drafts); None without a round."""
    return 1.0 + accepted / rounds if rounds else None


def unconditional_from_counts(accepted_per_pos: Sequence[float], rounds: float) -> list[float]:
    """p_k from per-position totals (vLLM's num_accepted_tokens_per_pos / num_drafts: in a chain a
    token at position k is accepted only with all before it)."""
    return [a / rounds if rounds else math.nan for a in accepted_per_pos]


# ---------------------------------------------------------------- measured rounds (eval)
TAU_NOTE = "tau = tokens emitted per target verification pass (accepted draft tokens + the bonus token)"
CHAIN_ALPHA = (
    "chain: alpha_k = P(draft token k accepted | draft tokens 1..k-1 accepted), over chain rounds; "
    "unconditional = P(first k draft tokens all accepted)"
)
TREE_ALPHA = (
    "tree: alpha_k = P(the accepted path reaches depth k | it reached depth k-1), over tree rounds (any "
    "branch at each depth); unconditional = P(accepted path length >= k). Not comparable to chain alpha_k: "
    "a tree offers several candidates per depth"
)
ESTIMATE_NOTE = (
    "ESTIMATE, not a measurement: tau(d) for d < D from truncating the depth-D chain rounds' accept lengths "
    "at d. A real depth-d run restarts its rounds at other positions, so it differs (see sweep.tau_error)"
)


def acceptance_by_depth(accept_lens: list[int], depth: int, mode: str = "chain") -> dict:
    """Per-depth acceptance with counts, and tau over the rounds (bonus token included).

    For a chain, also `tau_by_depth_estimate[d] = 1 + sum_{k<=d} P(first k accepted)`: what the same
    rounds would give if cut at depth d. Only index D is measured; the rest is an estimate."""
    rounds = len(accept_lens)
    rows = []
    running = 1.0
    taus = [1.0]
    for k in range(1, depth + 1):
        attempts = sum(1 for a in accept_lens if a >= k - 1)
        accepted = sum(1 for a in accept_lens if a >= k)
        uncond = accepted / rounds if rounds else 0.0
        running += uncond
        taus.append(running)
        rows.append(
            {
                "depth": k,
                "attempts": attempts,
                "accepted": accepted,
                "alpha": accepted / attempts if attempts else None,
                "unconditional": uncond,
            }
        )
    out = {
        "rounds": rounds,
        "tau": (sum(accept_lens) + rounds) / rounds if rounds else 1.0,
        "alpha_definition": CHAIN_ALPHA if mode == "chain" else TREE_ALPHA,
        "per_depth": rows,
        "accept_len_histogram": [sum(1 for a in accept_lens if a == n) for n in range(depth + 1)],
    }
    if mode == "chain":
        out["tau_by_depth_estimate"] = taus  # index d; d = D is the run's own (measured) tau
        out["tau_by_depth_note"] = ESTIMATE_NOTE
    return out


def tau_of(accept_lens: Sequence[int]) -> float:
    return (sum(accept_lens) + len(accept_lens)) / len(accept_lens) if accept_lens else 1.0


POSITION_EDGES = (0, 64, 128, 256, 512, 1024, 2048)


def tau_by_position(per_prompt: Sequence[Sequence[int]], edges: Sequence[int] = POSITION_EDGES) -> list[dict]:
    """Tau of the rounds that start in each span of the answer ([edges[i], edges[i+1]) tokens in; the
    last span is open). A round starting at answer token t emits accept_len + 1 tokens, so the next
    starts that much later. Late tokens of long answers are easier to draft than an answer's opening:
    an eval capped at 128 new tokens and a benchmark decoding whole answers measure different taus, and
    this says by how much. Spans no round started in are left out."""
    spans: list[list[int]] = [[] for _ in edges]
    for lens in per_prompt:
        pos = 0
        for a in lens:
            i = max(j for j, e in enumerate(edges) if pos >= e)
            spans[i].append(a)
            pos += a + 1
    rows = []
    for i, lens in enumerate(spans):
        if lens:
            hi = edges[i + 1] if i + 1 < len(edges) else None
            rows.append({"from": edges[i], "to": hi, "rounds": len(lens), "tau": tau_of(lens)})
    return rows


# ---------------------------------------------------------------- the held-out walk (train)
def accept_lengths(hiddens, logits_fn, teacher: Teacher, loss_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] accepted draft tokens of a round anchored at t (the target has just produced token
    t+1; draft token k predicts x[t+2+k]): the leading steps whose argmax equals the target's and
    whose token is still part of the answer (a chain is never accepted past its end)."""
    ok: torch.Tensor | None = None
    length = torch.zeros(loss_mask.shape, dtype=torch.long, device=loss_mask.device)
    for k, h in enumerate(hiddens):
        m = _shift(loss_mask, 2 + k, False)  # token t+2+k is an assistant token
        valid = _shift(teacher.valid, 1 + k, False)
        target = _shift(teacher.argmax, 1 + k, 0)
        hit = torch.zeros_like(m)
        sel = m & valid
        if bool(sel.any()):
            hit[sel] = logits_fn(h[sel]).argmax(-1) == target[sel]
        ok = hit if ok is None else ok & hit
        length += ok.long()
    return length


def walk_rounds(length: torch.Tensor, loss_mask: torch.Tensor, depth: int) -> tuple[torch.Tensor, int]:
    """([depth] rounds that accepted at least k+1 tokens, rounds) of a greedy chain decoder over
    each answer: a round anchored at t accepts length[t] tokens, the target adds one, and the next
    round is anchored at t + length[t] + 1; the answer's first token comes from the prompt's pass.
    Rounds start where the last one failed, as a decoder's do, which is harder than an average
    position: scoring every position alike overstates tau."""
    accepted = torch.zeros(depth, dtype=torch.float64)
    rounds = 0
    lens, mask = length.tolist(), loss_mask.tolist()
    for row_len, row_mask in zip(lens, mask, strict=True):
        n = len(row_mask)
        for s in range(1, n):
            if not row_mask[s] or row_mask[s - 1]:
                continue  # not the first token of an answer
            t = s - 1
            while t + 2 < n and row_mask[t + 2]:
                got = row_len[t]
                rounds += 1
                if got:
                    accepted[:got] += 1
                t += got + 1
    return accepted, rounds


def chain_summary(accepted: torch.Tensor, counted: torch.Tensor) -> dict:
    """tau = 1 + sum_k P(tokens 0..k accepted) (tokens per target pass); alpha_k = P(k accepted |
    0..k-1 accepted), as `eagle3 eval` reports them."""
    p = [float(a / c) if c > 0 else 0.0 for a, c in zip(accepted, counted, strict=True)]
    alpha = conditional_from_unconditional(p)
    tau = tau_from_unconditional(p)
    if not math.isfinite(tau):
        raise ValueError(f"held-out tau is {tau}")
    return {"tau": round(tau, 4), "alpha_k": [round(a, 4) for a in alpha], "p_accept_k": [round(x, 4) for x in p]}


# ---------------------------------------------------------------- the TTT estimate (train)
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


def simulated_tau(step_acc: list[float]) -> float:
    """The TTT estimate as a tau (bonus token included, as every other tau here): 1 + a1 + a1*a2 + ...
    With the conditional acceptances alpha_k it is exactly `tau_from_unconditional`."""
    return 1.0 + simulated_accept_length(step_acc)
