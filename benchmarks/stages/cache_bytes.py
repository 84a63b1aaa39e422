"""Cache size and speed per storage option (bf16, fp8, compact) on the same conversations.

    .venv/bin/python benchmarks/stages/cache_bytes.py [--target models/tiny-target] [--num-samples 200] [--topk 4]

Prints one JSON object: for each option the bytes/token on disk (measured, shard files incl.
headers), the payload model, the ratio against the plain bf16 layout (4·H bf16 + ids/mask;
goal <= 0.4x for compact), cache tokens/s (target forward + encode + write), and fidelity
against the bf16 cache: relative error of the aux features and agreement of the teacher's
top-1 token. Acceptance (tau) with each option is measured by training on it (`make bench`).
The conversations are GSM8K questions with their original answers (regenerated: false).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def write_data(folder: Path, target: Path, source: str, n: int) -> Path:
    from eagle3cli.model.target import load_tokenizer, target_identity
    from eagle3cli.run_folder.manifest import shard_record, write_manifest

    folder.mkdir(parents=True)
    from eagle3cli.data.formats import parse_input_spec, read_input

    records = read_input(parse_input_spec(source)).records[:n]
    lines = [json.dumps({**r, "meta": {}}) for r in records]
    shard = folder / "shard-00000.jsonl"
    shard.write_text("\n".join(lines) + "\n")
    write_manifest(
        folder,
        "gen-data",
        target=target_identity(target, load_tokenizer(target)).as_dict(),
        config={"bench": "cache_bytes"},
        counts={"records": len(lines)},
        shards=[shard_record(shard, records=len(lines))],
        regenerated=False,
    )
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(REPO / "models" / "tiny-target"))
    ap.add_argument("--data", default="gsm8k", help="a named source or a file")
    ap.add_argument("--num-samples", type=int, default=200)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--out", default=None, help="keep the caches here (default: a temp folder)")
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM

    from eagle3cli.cache.config import CacheConfig
    from eagle3cli.cache.reader import CacheReader
    from eagle3cli.cache.run import run_cache
    from eagle3cli.config import build_config

    target = Path(a.target)
    if not list(target.glob("*.safetensors")):
        sys.exit(f"{target} has no weights yet: run `make tiny-target` first")
    root = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="cache-bench-"))
    data = write_data(root / "data", target, a.data, a.num_samples)
    results, readers = {}, {}
    for storage in ("bf16", "fp8", "compact"):
        cfg = build_config(
            CacheConfig,
            None,
            "cache",
            data=data,
            out=root / storage,
            target=str(target),
            storage=storage,
            topk=a.topk,
            max_length=a.max_length,
        )
        t0 = time.time()
        with contextlib.redirect_stdout(sys.stderr):  # stage tables to stderr: stdout is the JSON only
            out = run_cache(cfg)
        wall = time.time() - t0
        r = readers[storage] = CacheReader(out)
        b = r.manifest["bytes_per_token"]
        results[storage] = {
            "bytes_per_token": b["measured"],
            "payload_bytes_per_token": b["payload"],
            "ratio_vs_bf16_layout": b["ratio_vs_bf16_layout"],
            "tokens_per_s": r.manifest["throughput"]["tokens_per_s"],
            "end_to_end_tokens_per_s": round(r.manifest["counts"]["tokens"] / wall, 1),
        }
    lm_head = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).lm_head
    ref = readers["bf16"]
    with torch.no_grad():
        ref_top1 = [lm_head(ref[i]["last_hidden"]).argmax(-1) for i in range(len(ref))]
        for storage in ("fp8", "compact"):
            r = readers[storage]
            err = num = agree = total = 0.0
            for i in range(len(r)):
                s, s0 = r[i], ref[i]
                err += float((s["aux_hidden"] - s0["aux_hidden"]).norm() ** 2)
                num += float(s0["aux_hidden"].norm() ** 2)
                top1 = s["topk_ids"][:, 0] if storage == "compact" else lm_head(s["last_hidden"]).argmax(-1)
                m = s["loss_mask"]
                agree += float((top1[m] == ref_top1[i][m]).sum())
                total += float(m.sum())
            results[storage]["aux_rel_err_vs_bf16"] = round((err / num) ** 0.5, 5)
            results[storage]["teacher_top1_agreement_vs_bf16"] = round(agree / total, 5)
    m = ref.manifest
    print(
        json.dumps(
            {
                "target": str(target),
                "hidden_size": m["target"]["hidden_size"],
                "vocab_size": m["target"]["vocab_size"],
                "aux_layer_ids": m["aux_layer_ids"],
                "samples": m["counts"]["samples"],
                "tokens": m["counts"]["tokens"],
                "topk": a.topk,
                "bf16_layout_bytes_per_token": m["bytes_per_token"]["bf16_layout"],
                "torch_threads": torch.get_num_threads(),
                "storage": results,
            },
            indent=2,
        )
    )
    if not a.out:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
