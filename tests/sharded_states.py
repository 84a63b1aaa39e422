"""Run under 2 ranks (torch.distributed.run) by tests/unit/test_cache_sharded.py: the cache's features
(`cache.features.ModelFeatures`: aux rows, final rows, teacher logits) from the target split over the
ranks (`open_target(..., tensor_parallel=2)`), against the whole target on rank 0. Writes the largest
relative error of each to argv[2]. No tests here."""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
import torch.distributed as dist

from eagle3cli.cache.features import ModelFeatures
from eagle3cli.model.target import open_target


def features(target) -> tuple[torch.Tensor, ...]:
    rng = np.random.default_rng(0)  # the same rows on every rank, as the forward requires
    seqs = [rng.integers(0, 4000, size=n).astype(np.int32) for n in (37, 11, 64)]
    f = ModelFeatures(target.model, (2, 4, 5), 0)
    with torch.no_grad():
        aux, last = f.rows(seqs)
        return aux, last, f.logits(last)


def main(path: str, out: str) -> None:
    torch.set_num_threads(1)
    split = features(open_target(path, load=True, device="cpu", dtype="fp32", tensor_parallel=2))
    if dist.get_rank() == 0:
        whole = features(open_target(path, load=True, device="cpu", dtype="fp32"))
        errors = {
            name: ((a - b).abs().max() / b.abs().max()).item()
            for name, a, b in zip(("aux", "last", "logits"), split, whole, strict=True)
        }
        with open(out, "w", encoding="utf-8") as f:
            json.dump(errors, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
