"""Data folders in the gen-data contract, written directly (the cache tests do not run gen-data)."""

from __future__ import annotations

import json
from pathlib import Path

from eagle3cli.model.target import load_tokenizer, target_identity
from eagle3cli.readers.sources import bundled
from eagle3cli.run_folder.manifest import shard_record, write_manifest


def conversations(n: int, multi_turn_every: int = 3) -> list[dict]:
    """GSM8K questions/answers as records; every few a two-turn conversation with a system prompt."""
    recs = []
    with open(bundled("gsm8k_train.jsonl")) as f:
        rows = [json.loads(next(f)) for _ in range(2 * n)]
    for i in range(n):
        q, a = rows[i]["question"], rows[i]["answer"]
        msgs = [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        if multi_turn_every and i % multi_turn_every == 1:
            q2, a2 = rows[n + i]["question"], rows[n + i]["answer"]
            msgs = [
                {"role": "system", "content": "You solve math problems step by step."},
                *msgs,
                {"role": "user", "content": q2},
                {"role": "assistant", "content": a2},
            ]
        recs.append({"id": f"gsm8k-{i}", "source": "gsm8k", "messages": msgs, "meta": {}})
    return recs


def write_data_folder(
    folder: Path,
    target_dir: Path,
    records: list[dict],
    per_shard: int = 8,
    regenerated: bool = True,
    identity: dict | None = None,
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shards = []
    for k in range(0, len(records), per_shard):
        p = folder / f"shard-{k // per_shard:05d}.jsonl"
        chunk = records[k : k + per_shard]
        p.write_text("".join(json.dumps(r) + "\n" for r in chunk))
        shards.append(shard_record(p, records=len(chunk)))
    (folder / "rejects.jsonl").write_text("")
    if identity is None:
        identity = target_identity(target_dir, load_tokenizer(target_dir)).as_dict()
    write_manifest(
        folder,
        "gen-data",
        target=identity,
        config={},
        counts={"records": len(records)},
        shards=shards,
        regenerated=regenerated,
    )
    return folder
