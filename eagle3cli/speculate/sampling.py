"""Turning logits into probabilities and tokens; every sampler returns the probabilities too,
because the acceptance rules need the exact distribution a token was drawn from."""

from __future__ import annotations

import torch


def logits_to_probs(logits: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0) -> torch.Tensor:
    """Softmax over the last dim at `temperature`, restricted to the top-p nucleus (renormalised).

    temperature 0 means greedy: a one-hot distribution on the argmax (so the same
    acceptance rules stay exact for greedy decoding).
    """
    logits = logits.float()
    if temperature <= 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop = (sorted_p.cumsum(-1) - sorted_p) >= top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def generator_for(device: torch.device | str, seed: int) -> torch.Generator:
    """A seeded generator on `device`: torch draws a tensor's random numbers with a generator of the
    tensor's own device (CUDA refuses a CPU one: "Expected a 'cuda' device type for generator"), so
    every sampler takes its generator from here, for the device of what it samples."""
    return torch.Generator(device=torch.device(device)).manual_seed(int(seed))


def sample_from(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One draw per row of `probs` [..., V] -> LongTensor[...]."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def sample(
    logits: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [...], probs [..., V]) for logits [..., V]; greedy (argmax) at temperature 0."""
    probs = logits_to_probs(logits, temperature, top_p)
    if temperature <= 0:
        return logits.argmax(-1), probs
    return sample_from(probs, generator), probs


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalize(max(0, p - q)): what to sample from after a draft token was rejected.

    If p <= q everywhere (only possible when p == q up to rounding), p itself is returned.
    """
    r = (p - q).clamp_min(0)
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 0, r / total.clamp_min(1e-30), p)
