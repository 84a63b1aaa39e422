"""Turn a shard's samples into one safetensors shard (features from `features.py`), written atomically.

A shard stores its samples' tokens stacked along one axis (no padding on disk): `input_ids`,
`loss_mask`, `offsets` [n+1] (row ranges per sample) and the storage option's feature
tensors. Samples go to the target in groups of a padded-token budget, longest first (the hf
route pads them on the right: under a causal mask the real positions never attend to pads, so
features equal an unpadded forward up to float rounding).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..run_folder.manifest import atomic_write_tensors
from .storage import encode, id_dtype

if TYPE_CHECKING:
    from .features import Features


@dataclass
class Sample:
    index: int  # position in the cache (deterministic order)
    id: str
    input_ids: np.ndarray  # int32 [T]
    loss_mask: np.ndarray  # bool [T]


def batches_by_budget(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Indices grouped so that (batch size x longest length) <= budget; longest first."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        longest = lengths[cur[0]] if cur else lengths[i]
        if cur and (len(cur) + 1) * longest > token_budget:
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


@torch.no_grad()
def shard_tensors(
    samples: list[Sample],
    features: Features,
    n_aux: int,
    storage: str,
    *,
    token_budget: int,
    vocab_size: int,
    topk: int,
) -> dict[str, torch.Tensor]:
    lengths = [len(s.input_ids) for s in samples]
    feats: list[dict[str, torch.Tensor] | None] = [None] * len(samples)
    for group in batches_by_budget(lengths, token_budget):
        aux, last = features.rows([samples[i].input_ids for i in group])
        # Encode the valid rows of the whole batch at once (one quantisation / lm_head pass).
        enc = encode(storage, aux, last, n_aux, vocab_size=vocab_size, logits_fn=features.logits, topk=topk)
        start = 0
        for i in group:
            n = lengths[i]
            feats[i] = {k: v[start : start + n].cpu() for k, v in enc.items()}
            start += n
    done = [f for f in feats if f is not None]  # every sample is in exactly one group
    out = {k: torch.cat([f[k] for f in done]) for k in done[0]}
    out["input_ids"] = torch.from_numpy(np.concatenate([s.input_ids for s in samples])).to(id_dtype(vocab_size))
    out["loss_mask"] = torch.from_numpy(np.concatenate([s.loss_mask for s in samples])).to(torch.bool)
    out["offsets"] = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int64)
    return {k: v.contiguous() for k, v in out.items()}


def save_atomic(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """A safetensors file that exists whole or not at all."""
    atomic_write_tensors(path, tensors, metadata)


def shard_metadata(samples: list[Sample], storage: str) -> dict[str, str]:
    """One metadata key: safetensors writes metadata in hash-map order, and byte-identical shards
    make a resumed run checkably equal to an uninterrupted one."""
    return {"eagle3": json.dumps({"storage": storage, "first_index": samples[0].index, "ids": [s.id for s in samples]})}
