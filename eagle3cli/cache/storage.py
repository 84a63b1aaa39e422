"""How a batch of target features becomes shard tensors, and back (per storage option).

Options (bytes/token for hidden size H, 3 aux layers, k teacher entries):
- `bf16`    aux [T, 3H] + last hidden [T, H] in bf16: 8H (+ ids/mask). Teacher logits are
            recomputed exactly as `target_logits(target, last_hidden)` (lm_head + softcapping).
- `fp8`     the same two tensors as float8_e4m3fn with one bf16 scale per token and layer:
            4H + 8 (+ ids/mask), about 0.5x.
- `compact` fp8 aux with per-token scales + the target's top-k log-probs (ids + fp16): no
            last hidden, so 3H + 6 + k(id + 2) (+ ids/mask), about 0.375x at 8B scale.
Per-token scales matter: hidden-state norms vary by orders of magnitude between tokens
(attention sinks, BOS) and between layers; one scale per tensor would crush the quiet ones.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
# Scales are stored in bf16; quantising with the rounded scale makes dequantisation consistent.
SCALE_DTYPE = torch.bfloat16


def id_dtype(vocab_size: int) -> torch.dtype:
    """int16 ids when the vocab fits (tiny targets), int32 otherwise (128k vocabularies)."""
    return torch.int16 if vocab_size <= 32767 else torch.int32


def quantize_fp8(x: torch.Tensor, n_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, n*H] float -> (fp8 [T, n*H], bf16 scale [T, n]), one scale per token and group."""
    t = x.shape[0]
    g = x.float().reshape(t, n_groups, -1)
    scale = (g.abs().amax(dim=-1) / FP8_MAX).clamp_min(1e-12).to(SCALE_DTYPE)
    q = (g / scale.float().unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.reshape(t, -1), scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    t, n = scale.shape
    return (q.float().reshape(t, n, -1) * scale.float().unsqueeze(-1)).reshape(t, -1)


@torch.no_grad()
def topk_logprobs(last_hidden: torch.Tensor, logits_fn, k: int, rows: int = 1024):
    """Top-k target log-probs per token; chunked so a 128k-vocab logits tensor stays small.
    `logits_fn` maps final-normed hidden states to the target's logits (`target_logits`)."""
    ids, lps = [], []
    for s in range(0, last_hidden.shape[0], rows):
        logits = logits_fn(last_hidden[s : s + rows]).float()
        # top-k of the logits minus logsumexp: one pass fewer than materialising log_softmax.
        v, i = logits.topk(k, dim=-1)
        ids.append(i)
        lps.append(v - torch.logsumexp(logits, dim=-1, keepdim=True))
    return torch.cat(ids), torch.cat(lps)


@torch.no_grad()
def target_argmax(last_hidden: torch.Tensor, logits_fn, rows: int = 1024) -> torch.Tensor:
    """The target's own next-token argmax per position. Stored with the features, it saves
    training a full-vocabulary matmul per token in every epoch (the teacher then needs only the
    draft-vocab rows of lm_head)."""
    return torch.cat([logits_fn(last_hidden[s : s + rows]).argmax(-1) for s in range(0, last_hidden.shape[0], rows)])


def encode(
    storage: str,
    aux: torch.Tensor,
    last_hidden: torch.Tensor,
    n_aux: int,
    *,
    vocab_size: int,
    logits_fn=None,
    topk: int = 0,
) -> dict[str, torch.Tensor]:
    """Feature tensors of stacked tokens ([T, n_aux*H], [T, H]) -> the tensors a shard stores."""
    argmax = (
        {} if logits_fn is None else {"target_argmax": target_argmax(last_hidden, logits_fn).to(id_dtype(vocab_size))}
    )
    if storage == "bf16":
        return {"aux_hidden": aux.to(torch.bfloat16), "last_hidden": last_hidden.to(torch.bfloat16), **argmax}
    if storage == "fp8":
        aq, asc = quantize_fp8(aux, n_aux)
        lq, lsc = quantize_fp8(last_hidden, 1)
        return {"aux_hidden": aq, "aux_scale": asc, "last_hidden": lq, "last_scale": lsc, **argmax}
    if storage == "compact":
        aq, asc = quantize_fp8(aux, n_aux)
        ids, lps = topk_logprobs(last_hidden.float(), logits_fn, topk)
        return {
            "aux_hidden": aq,
            "aux_scale": asc,
            "topk_ids": ids.to(id_dtype(vocab_size)),
            "topk_logprobs": lps.clamp_min(-1e4).to(torch.float16),
        }
    raise ValueError(f"unknown storage {storage!r}")


def decode(storage: str, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Shard tensors for a slice of tokens -> float32 features (the reader's contract)."""
    extra = {"target_argmax": t["target_argmax"].to(torch.int64)} if "target_argmax" in t else {}
    if storage == "bf16":
        return {"aux_hidden": t["aux_hidden"].float(), "last_hidden": t["last_hidden"].float(), **extra}
    out = {"aux_hidden": dequantize_fp8(t["aux_hidden"], t["aux_scale"]), **extra}
    if storage == "fp8":
        out["last_hidden"] = dequantize_fp8(t["last_hidden"], t["last_scale"])
    else:
        # int16 ids of vocabularies above 32767 never occur (id_dtype), so widening is exact.
        out["topk_ids"] = t["topk_ids"].to(torch.int64)
        out["topk_logprobs"] = t["topk_logprobs"].float()
    return out


def feature_keys(storage: str) -> tuple[str, ...]:
    return {
        "bf16": ("aux_hidden", "last_hidden"),
        "fp8": ("aux_hidden", "aux_scale", "last_hidden", "last_scale"),
        "compact": ("aux_hidden", "aux_scale", "topk_ids", "topk_logprobs"),
    }[storage]


# Stored when present (caches from eagle3 0.2 on); older bf16/fp8 caches lack it and training
# recomputes the argmax from the last hidden state.
OPTIONAL_KEYS = {"bf16": ("target_argmax",), "fp8": ("target_argmax",), "compact": ()}


def bytes_per_token(storage: str, hidden: int, n_aux: int, vocab_size: int, topk: int) -> int:
    """Payload bytes per token (ids + mask + features), without the small per-shard headers."""
    ids = torch.empty(0, dtype=id_dtype(vocab_size)).element_size()
    base = ids + 1  # input id + loss-mask byte
    if storage == "bf16":
        return base + 2 * (n_aux + 1) * hidden + ids  # + the target's argmax id
    if storage == "fp8":
        return base + (n_aux + 1) * hidden + 2 * (n_aux + 1) + ids
    return base + n_aux * hidden + 2 * n_aux + topk * (ids + 2)


def bf16_layout_bytes(hidden: int, vocab_size: int) -> int:
    """The plain layout storage is measured against: 4H bf16 values + ids/mask (no stored argmax)."""
    return torch.empty(0, dtype=id_dtype(vocab_size)).element_size() + 1 + 8 * hidden
