"""Where a cache's features come from (`--engine`): the target in this process (`ModelFeatures`, hf) or
an engine running it (`EngineFeatures`, vllm and sglang: `engine_route.py`). Both give a group of samples' rows in the same form,
so the writer, the storage codecs, the manifest and resume are one code path:

`rows(seqs) -> (aux [N, n_aux*H], last [N, H])`, the sequences' tokens stacked in order, `last`
after the final norm; `logits(h)` the target's own logits from such `last` rows (the top-k teacher).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from ..speculate.target import capture_features, target_logits


class Features(Protocol):
    def rows(self, seqs: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]: ...

    def logits(self, hidden: torch.Tensor) -> torch.Tensor: ...


class ModelFeatures:
    """The loaded target: a right-padded batch through `capture_features`, the valid rows kept."""

    def __init__(self, model, aux_layer_ids: tuple[int, ...], pad_id: int):
        self.model, self.aux_layer_ids, self.pad_id = model, aux_layer_ids, pad_id
        self.device = next(model.parameters()).device

    def rows(self, seqs: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        att = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, s in enumerate(seqs):
            ids[r, : len(s)] = torch.from_numpy(s.astype(np.int64))
            att[r, : len(s)] = 1
        aux, last = capture_features(self.model, ids.to(self.device), att.to(self.device), self.aux_layer_ids)
        valid = att.bool().to(self.device)
        return aux[valid], last[valid]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # the target's own logits (Gemma-2 softcaps them): the teacher is its real distribution
        return target_logits(self.model, hidden.to(self.device, self.model.dtype))


class EngineFeatures:
    """An engine's capture (`engine.capture(token_id_lists)` -> per sequence (aux [T, n_aux, H], final
    [T, H])): aux states as returned; the final state finished with the target's own final norm
    (`model/target_tail.py`) where the engine returns it before the norm (vLLM; `normed`: SGLang)."""

    def __init__(self, engine, tail, normed: bool = False):
        from ..model.target_tail import final_norm

        self.engine, self.tail, self.norm = engine, tail, final_norm(tail)
        self.normed = normed
        self.dtype = next(self.norm.parameters()).dtype
        # a meta lm_head computes nothing and raises nothing on every path (a stored argmax came out all 0)
        if tail.get_output_embeddings().weight.is_meta:
            raise ValueError("EngineFeatures needs the tail's lm_head: load_tail(..., lm_head=True)")

    @torch.no_grad()
    def rows(self, seqs: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        per = self.engine.capture([s.tolist() for s in seqs])
        aux = torch.cat([a.reshape(a.shape[0], -1) for a, _ in per])  # [T, n_aux, H] -> layer-major [T, n_aux*H]
        last = torch.cat([f for _, f in per]).to(self.dtype)
        last = last if self.normed else self.norm(last)
        return aux, last

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return target_logits(self.tail, hidden.to(self.dtype))
