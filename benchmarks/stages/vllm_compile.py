"""vLLM's CPU build eager (`--enforce-eager`, what gen-data and serve start) against compiled, for a target alone.

    VLLM_CPU_OMP_THREADS_BIND=1 OMP_NUM_THREADS=1 .venv/bin/python benchmarks/stages/vllm_compile.py \
        --target models/smollm2-135m --concurrency 32 --prompts 128 --max-new-tokens 64 --modes compiled,eager

For each mode in turn: vLLM on the target (bf16, prefix caching off), warmed with the concurrency's
shapes, then `--runs` timed runs of benchmarks/stages/gen_data_engine.py's plain concurrent client
on the same ShareGPT first turns. Prints one JSON line per run (mode, seconds to start, tok/s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.stages.gen_data_engine import NO_PREFIX_CACHE, first_turn_prompts, plain_client  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="models/smollm2-135m")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--modes", default="compiled,eager")
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args()
    import eagle3cli.engines.local_engine as engine

    prompts = first_turn_prompts("sharegpt", a.prompts)
    model, c = Path(a.target).name, a.concurrency
    eager_argv = engine.vllm_argv
    for mode in a.modes.split(","):
        # the one switch between the modes: gen-data's own command line, with or without --enforce-eager
        engine.vllm_argv = (
            eager_argv
            if mode == "eager"
            else lambda *x, **k: [v for v in eager_argv(*x, **k) if v != "--enforce-eager"]
        )
        log = Path(tempfile.mkdtemp(prefix=f"vllm-{mode}-")) / "engine.log"
        t0 = time.time()
        with engine.vllm_for_target(Path(a.target), "bf16", c, log, extra=NO_PREFIX_CACHE) as (url, _info):
            start = time.time() - t0
            for tokens in (8, a.max_new_tokens):  # warm the batch shapes of this concurrency
                asyncio.run(plain_client(url, model, prompts[:c], tokens, c))
            for i in range(a.runs):
                r = asyncio.run(plain_client(url, model, prompts, a.max_new_tokens, c))
                row = {
                    "mode": mode,
                    "start_s": round(start),
                    "run": i,
                    "tok_s": round(r["tok_s"], 1),
                    "tokens": r["tokens"],
                }
                print(json.dumps(row), flush=True)
    engine.vllm_argv = eager_argv


if __name__ == "__main__":
    main()
