"""Helpers for the train tests: a run folder with a gen-data folder and a real cache (built by
`eagle3cli.cache.run.run_cache`) for a tiny random target. No tests here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from eagle3cli.readers.sources import bundled
from eagle3cli.run_folder.manifest import shard_record, write_manifest

REPO = Path(__file__).resolve().parents[1]
GSM8K = bundled("gsm8k_train.jsonl")


def write_data(run_dir: Path, target_dir: Path, n: int) -> Path:
    """RUN/data in gen-data's format with GSM8K's original answers (regenerated: false)."""
    from eagle3cli.model.target import load_tokenizer, target_identity

    data = run_dir / "data"
    data.mkdir(parents=True, exist_ok=True)
    lines = []
    with open(GSM8K) as f:
        for i, line in zip(range(n), f, strict=False):
            r = json.loads(line)
            lines.append(
                json.dumps(
                    {
                        "id": f"gsm8k-{i}",
                        "source": "gsm8k",
                        "meta": {},
                        "messages": [
                            {"role": "user", "content": r["question"]},
                            {"role": "assistant", "content": r["answer"]},
                        ],
                    }
                )
            )
    shard = data / "shard-00000.jsonl"
    shard.write_text("\n".join(lines) + "\n")
    (data / "rejects.jsonl").write_text("")
    ident = target_identity(target_dir, load_tokenizer(target_dir))
    write_manifest(
        data,
        "gen-data",
        target=ident.as_dict(),
        config={},
        counts={"records": len(lines)},
        inputs=[{"spec": "gsm8k", "format": "gsm8k", "rows": len(lines)}],  # as gen-data records its sources
        shards=[shard_record(shard, records=len(lines))],
        regenerated=False,
    )
    return data


def make_run(
    run_dir: Path, target_dir: Path, n: int = 24, draft_vocab_size: int = 512, max_length: int = 160, **cache_flags
) -> Path:
    from eagle3cli.cache.config import CacheConfig
    from eagle3cli.cache.run import run_cache
    from eagle3cli.config import build_config

    write_data(run_dir, target_dir, n)
    cfg = build_config(
        CacheConfig,
        None,
        "cache",
        run=run_dir,
        target=str(target_dir),
        draft_vocab_size=draft_vocab_size,
        max_length=max_length,
        **cache_flags,
    )
    run_cache(cfg)
    return run_dir


def eagle3(*args: str, timeout: int = 300, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "eagle3cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
        **kw,
    )


def metrics(run_dir: Path) -> list[dict]:
    p = Path(run_dir) / "train" / "metrics.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.exists() else []


def copy_run(base: Path, dest: Path) -> Path:
    """A fresh run folder at `dest` with `base`'s gen-data folder and cache (a module's base run is
    built once; each test trains in its own copy)."""
    dest.mkdir()
    for sub in ("data", "cache"):
        shutil.copytree(base / sub, dest / sub)
    return dest


def fast_train_config(run: Path, **fields):
    """The TrainConfig the tests train `run` with: batches of 640 tokens, samples cut at 160, and `fields`."""
    from eagle3cli.config import build_config
    from eagle3cli.train.config import TrainConfig

    return build_config(TrainConfig, None, "train", run=run, token_budget=640, max_length=160, **fields)
