"""Stub drafts for decoder tests: they implement the draft interface the decoder uses
(`new_cache`, `forward`, `logits`, `draft_to_target`, `config.draft_vocab_size`, `d2t`), so
tests inject them without any hook in product code."""

from __future__ import annotations

import torch
from torch import nn


class OracleDraft(nn.Module):
    """Entry at position t (token x[t+1]) proposes for x[t+2]. Its hidden state carries t.

    `rank(t)` says where the true token sits among the draft's choices at t: 0 = top choice,
    r > 0 = after r wrong tokens, None = nowhere in the top ones (never agrees).
    """

    def __init__(self, sequence: list[int], vocab_size: int, rank=lambda t: 0):
        super().__init__()
        self.seq = sequence
        self.vocab = vocab_size
        self.rank = rank
        self.config = type("Cfg", (), {"draft_vocab_size": vocab_size})()
        self.register_buffer("d2t", torch.zeros(vocab_size, dtype=torch.long))
        self.dummy = nn.Parameter(torch.zeros(1))

    def draft_to_target(self, ids):
        return ids + self.d2t[ids]

    def new_cache(self, max_len: int):
        return None  # an oracle keeps no keys

    def forward(self, input_ids, hidden, cache, start, from_target, position=None, mask=None, last_only=False):
        """An entry's output is its position."""
        n = input_ids.shape[1]
        pos = torch.full((n,), float(position)) if position is not None else torch.arange(start, start + n).float()
        out = pos.view(1, n, 1)
        return out[:, -1:] if last_only else out

    def logits(self, h):
        pos = h[..., 0].long()
        out = torch.zeros(*pos.shape, self.vocab)
        for idx in torch.cartesian_prod(*[torch.arange(s) for s in pos.shape]).view(-1, pos.dim()):
            t = int(pos[tuple(idx)])
            want = self.seq[t + 2] if t + 2 < len(self.seq) else 0
            r = self.rank(t)
            row = out[tuple(idx)]
            # wrong tokens first (distinct from `want`), each a bit less likely than the last
            wrong = [w for w in range(self.vocab) if w != want][:8]
            for j, w in enumerate(wrong):
                row[w] = 20.0 - j
            row[want] = -1e4 if r is None else (40.0 if r == 0 else 20.0 - r + 0.5)
        return out
