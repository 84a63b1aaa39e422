"""Regeneration throughput: the batched hf backend vs per-sample `model.generate`, same prompts.

    .venv/bin/python benchmarks/stages/gen_data_throughput.py [--target models/tiny-target] [--num-prompts 64] [--threads 1]

Prints one JSON object: conversations/s and generated tok/s for both, their ratio (goal >= 3x),
and how many greedy texts agree (batching must not change text). Both sides generate greedily
with the same stop tokens and max_new_tokens; the clock covers generation only (model loaded).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(REPO / "models" / "tiny-target"))
    ap.add_argument("--data", default="gsm8k:test", help="a named source or a file")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads (default: torch's). On a busy machine 1 avoids OpenMP threads "
        "spinning on descheduled peers, which can make small forwards 100x slower.",
    )
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)

    from eagle3cli.data.formats import parse_input_spec, read_input
    from eagle3cli.data.hf import HFBackend, encode_prompt
    from eagle3cli.data.regen import Sampling
    from eagle3cli.model.target import load_target

    if not (Path(a.target) / "config.json").exists():
        sys.exit(f"{a.target} has no trained model yet: run `make tiny-target` first")
    model, tok, _ = load_target(a.target)
    records = read_input(parse_input_spec(a.data)).records[: a.num_prompts]
    prompts = [encode_prompt(tok, [m for m in r["messages"] if m["role"] == "user"][:1]) for r in records]
    backend = HFBackend(model, tok, Sampling(max_new_tokens=a.max_new_tokens, temperature=0), batch_size=a.batch_size)
    stop = sorted(backend.stop_ids)

    backend.generate(prompts[:2], [0, 0])  # warm-up (allocator, kernels) for both paths
    t0 = time.perf_counter()
    batched = backend.generate_sorted(prompts, [0] * len(prompts))
    t_batched = time.perf_counter() - t0

    t0 = time.perf_counter()
    single = []
    with torch.no_grad():
        for p in prompts:
            out = model.generate(
                torch.tensor([p]),
                max_new_tokens=a.max_new_tokens,
                do_sample=False,
                eos_token_id=stop,
                pad_token_id=backend.pad_id,
            )[0, len(p) :]
            single.append(out)
    t_single = time.perf_counter() - t0

    tok_batched = sum(o.completion_tokens for o in batched)
    tok_single = sum(int(o.numel()) for o in single)
    same = sum(o.text == tok.decode(s, skip_special_tokens=True) for o, s in zip(batched, single))
    result = {
        "target": a.target,
        "prompts": len(prompts),
        "max_new_tokens": a.max_new_tokens,
        "batch_size": a.batch_size,
        "torch_threads": torch.get_num_threads(),
        "batched_hf": {
            "seconds": round(t_batched, 3),
            "conversations_per_s": round(len(prompts) / t_batched, 3),
            "tokens": tok_batched,
            "tok_per_s": round(tok_batched / t_batched, 1),
        },
        "per_sample_generate": {
            "seconds": round(t_single, 3),
            "conversations_per_s": round(len(prompts) / t_single, 3),
            "tokens": tok_single,
            "tok_per_s": round(tok_single / t_single, 1),
        },
        "speedup_conversations_per_s": round(t_single / t_batched, 2),
        "speedup_tok_per_s": round((tok_batched / t_batched) / (tok_single / t_single), 2),
        "identical_greedy_texts": f"{same}/{len(prompts)}",
        "goal": ">= 3x",
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
