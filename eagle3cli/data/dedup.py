"""The last pass over a finished gen-data folder, before its manifest: what repeats is counted once.

* **Identical answers** to one prompt (`--answers-per-prompt K`: a low temperature often repeats
  the greedy answer): later copies are dropped (`duplicate_answer`).
* **Near-duplicate written prompts** (`--synthetic`): a user turn the target wrote is dropped when
  its MinHash Jaccard similarity (word 5-grams; datasketch's MinHash LSH, the maintained library
  the Magpie and FineWeb pipelines use) with a prompt already in the corpus reaches
  `--near-dup-threshold`: the run's human prompts, the folders of `--dedup-against`, the eval
  benches (`eval_prompt`: a paraphrase close enough to share most 5-grams is an eval prompt) and
  every written prompt kept before it (`near_duplicate`).

Decided in plan order over all shards, so the result is the same however the shards were
generated, and idempotent: the dropped records' rejects are written to `progress/` first, then
each changed shard is rewritten atomically, so a kill in between repeats the same decisions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from ..readers.jsonl import dumps, read_records
from ..run_folder.manifest import atomic_write_text
from .formats import reject_row
from .journal import PROGRESS, shard_name
from .mixture import first_user

DEDUP_REJECTS = "rejects-dedup.jsonl"
NUM_PERM = 128
SHINGLE = 5
_WORD = re.compile(r"\w+", re.UNICODE)


def _shingles(text: str) -> set[bytes]:
    words = _WORD.findall(text.casefold())
    if len(words) < SHINGLE:  # a short prompt is its words
        return {" ".join(words).encode()} if words else set()
    return {" ".join(words[i : i + SHINGLE]).encode() for i in range(len(words) - SHINGLE + 1)}


class NearDuplicates:
    """MinHash LSH over prompts; `match(text)` -> the label of a prompt at least `threshold` similar."""

    def __init__(self, threshold: float):
        from datasketch import MinHash, MinHashLSH

        self._minhash = MinHash
        self.threshold = threshold
        self.lsh = MinHashLSH(threshold=threshold, num_perm=NUM_PERM)
        self.labels: dict[str, str] = {}
        self.hashes: dict[str, object] = {}

    def _hash(self, text: str):
        m = self._minhash(num_perm=NUM_PERM, seed=1)
        sh = _shingles(text)
        if not sh:
            return None
        m.update_batch(list(sh))
        return m

    def add(self, key: str, label: str, text: str, m=None) -> None:
        m = m if m is not None else self._hash(text)
        if m is None or key in self.labels:
            return
        self.lsh.insert(key, m)
        self.labels[key], self.hashes[key] = label, m

    def match(self, text: str) -> tuple[str | None, object]:
        """(label of the most similar prompt at or above the threshold, or None; this text's MinHash)."""
        m = self._hash(text)
        if m is None:
            return None, None
        best, label = 0.0, None
        for key in self.lsh.query(m):
            j = m.jaccard(self.hashes[key])
            if j >= self.threshold and j > best:
                best, label = j, self.labels[key]
        return label, m


def folder_prompts(folder: Path) -> Iterable[str]:
    """First user turns of a gen-data folder's shards (`--dedup-against`)."""
    for p in sorted(Path(folder).glob("shard-*.jsonl")):
        for r in read_records(p):
            yield first_user(r)


def dedup_folder(out: Path, shard_ids: list[int], reference: Iterable[tuple[str, str]], threshold: float) -> list[dict]:
    """Drop repeated answers and near-duplicate written prompts from the finished shards (module doc);
    returns the rejects for what was dropped (also kept in progress/ until the manifest is written)."""
    path = out / PROGRESS / DEDUP_REJECTS
    earlier = read_records(path) if path.is_file() else []
    shards = {k: read_records(out / shard_name(k)) for k in shard_ids}
    written = [r for k in shard_ids for r in shards[k] if r.get("meta", {}).get("write_user")]
    grouped = any(r.get("meta", {}).get("answer_group") for k in shard_ids for r in shards[k])
    if not written and not grouped:
        return earlier
    index = NearDuplicates(threshold) if written else None
    if index is not None:
        for i, (where, text) in enumerate(reference):
            index.add(f"ref:{i}", where, text)
    drops: dict[str, dict] = {r["id"]: r for r in earlier if r.get("id")}
    answers: set[tuple] = set()
    for k in shard_ids:
        for r in shards[k]:
            meta = r.get("meta", {})
            why: tuple[str, str] | None = None
            group = meta.get("answer_group")
            if group is not None:
                key = (group, tuple(m.get("content") for m in r["messages"] if m["role"] == "assistant"))
                if key in answers:
                    why = ("duplicate_answer", f"the same answer as an earlier answer to {group}")
                answers.add(key)
            if why is None and index is not None and meta.get("write_user"):
                label, m = index.match(first_user(r))
                if label is not None:
                    reason = "eval_prompt" if label.startswith("eval:") else "near_duplicate"
                    why = (
                        reason,
                        f"the written prompt is a near-duplicate (MinHash Jaccard >= {threshold}) of {label}",
                    )
                else:
                    index.add(r["id"], f"written prompt {r['id']}", "", m)
            if why is not None:
                drops[r["id"]] = reject_row(r["source"], meta.get("row", 0), why[0], why[1], r["id"])
    rejects = list(drops.values())
    if rejects != earlier:  # first: a kill after it repeats the same pass and finds the same drops
        atomic_write_text(path, "".join(dumps(d) + "\n" for d in rejects))
    for k in shard_ids:
        kept = [r for r in shards[k] if r["id"] not in drops]
        if len(kept) != len(shards[k]):
            atomic_write_text(out / shard_name(k), "".join(dumps(r) + "\n" for r in kept))
    return rejects
