"""The mixture gen-data regenerates: every input's records shuffled by seed, duplicates of an
earlier first prompt dropped across inputs, `--num-samples` split by the inputs' weights, and
the plan shuffled once more. Deterministic for the same inputs and seed, so a rerun resumes the
same plan."""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from .formats import ReadResult, reject_row


def first_user(record: dict) -> str:
    """A record's first user turn ("" when it has none)."""
    return next((m["content"] for m in record["messages"] if m["role"] == "user"), "")


def prompt_key(text: str) -> str:
    """Dedup key of a prompt: case-folded, whitespace collapsed."""
    return re.sub(r"\s+", " ", text).strip().casefold()


def first_prompt_key(record: dict) -> str:
    """Dedup key of a record: its first user prompt's."""
    return prompt_key(first_user(record))


def quotas(sizes: list[int], weights: list[float], total: int | None) -> list[int]:
    """How many records each source contributes: all of them, or `total` split by weight
    (largest remainder), never more than a source holds."""
    if total is None:
        return list(sizes)
    wsum = sum(weights)
    raw = [total * w / wsum for w in weights]
    q = [int(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - q[i], reverse=True)[: total - sum(q)]:
        q[i] += 1
    return [min(a, b) for a, b in zip(q, sizes)]


def build_plan(
    results: list[ReadResult], num_samples: int | None, seed: int, reject: Callable[[dict], dict | None] | None = None
) -> tuple[list[dict], list[dict]]:
    """Seeded shuffle per source, `reject` (eval prompts), global dedup by first prompt, mixture quotas,
    final shuffle. Returns (plan, rejects). Deterministic for the same inputs and seed; `reject` runs
    after the shuffle, so a record it drops leaves every other record where it was."""
    seen: set[str] = set()
    dup_rejects: list[dict] = []
    unique: list[list[dict]] = []
    for si, res in enumerate(results):
        recs = list(res.records)
        random.Random(f"{seed}:{si}:{res.spec.name}").shuffle(recs)
        keep = []
        for r in recs:
            why = reject(r) if reject is not None else None
            if why is not None:
                dup_rejects.append(why)
                continue
            k = first_prompt_key(r)
            if k in seen:
                dup_rejects.append(
                    reject_row(
                        r["source"], r["meta"]["row"], "duplicate", "same first prompt as an earlier record", r["id"]
                    )
                )
                continue
            seen.add(k)
            keep.append(r)
        unique.append(keep)
    q = quotas([len(u) for u in unique], [r.spec.weight for r in results], num_samples)
    plan = [r for u, n in zip(unique, q) for r in u[:n]]
    random.Random(f"{seed}:mix").shuffle(plan)
    return plan, dup_rejects
