"""What a verification costs in llama.cpp on this CPU, by the target's weight type: one target pass
over n = 1..5 tokens (`llama-bench -p n -d 256`, one thread unless `--threads`), in units of a decoded token (`-n`:
what plain decoding pays per token; llama-bench's 1-token `-p` pass is slower than that on this CPU).

A round of EAGLE-3 at chain length k verifies k+1 tokens, so this ratio at n = k+1 is the least a
round can cost in plain steps (the draft and the server's bookkeeping come on top), and a head pays
only above it. The weight type decides how much a pass over more tokens re-uses what a 1-token pass
already paid for (the weights' memory traffic) and how much is new arithmetic:

    .llama-cpp/build/bin/...   (make llama-cpp)
    eagle3 export --format gguf --target models/smollm2-135m --dtype bf16 --out runs/gguf-target-bf16
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/llama_cpp/verify_cost.py \\
        f32=runs/llama-cpp-bench/gguf/target.gguf bf16=runs/gguf-target-bf16/target.gguf --out runs/verify-cost.json

Prints a markdown table; writes the JSON (pass ms and ratios per type, the commands) with --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repo root, for `benchmarks`
from benchmarks.llama_cpp.round_cost import llama_bench  # noqa: E402
from eagle3cli.engines.local_engine import which_llama_server  # noqa: E402


def measure(label: str, gguf: Path, binary: Path, reps: int, threads: int = 1) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    b = llama_bench(binary, gguf, [1, 2, 3, 4, 5], threads, env, reps=reps)
    one = b["tg_ms_per_token"]  # a plain decoding step
    return {
        "type": label,
        "gguf_bytes": gguf.stat().st_size,
        "pass_ms": {n: round(ms, 3) for n, ms in sorted(b["pass_ms"].items())},
        "pass_vs_tg": {n: round(ms / one, 3) for n, ms in sorted(b["pass_ms"].items())},
        "tg_ms_per_token": round(b["tg_ms_per_token"], 3),
        "command": b["command"],
    }


def table(rows: list[dict]) -> str:
    lines = ["| weights | GGUF MB | decode ms/token | pass over 1 | 2 | 3 | 4 | 5 tokens (x a decoded token) |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        v = r["pass_vs_tg"]
        lines.append(f"| {r['type']} | {r['gguf_bytes'] / 1e6:.0f} | {r['tg_ms_per_token']:.1f} | {v[1]:.2f} | "
                     f"{v[2]:.2f} | {v[3]:.2f} | {v[4]:.2f} | {v[5]:.2f} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ggufs", nargs="+", metavar="LABEL=PATH", help="target GGUFs to measure, each with its label")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=1,
                    help="llama.cpp threads (the serving benches use 1; 2 asks whether more cores make a pass over "
                         "several tokens cheaper relative to a decoded one)")  # fmt: skip
    a = ap.parse_args()
    server = which_llama_server()
    if a.threads < 1:
        print(f"error: --threads {a.threads}: expected 1 or more", file=sys.stderr)
        raise SystemExit(2)
    if server is None:
        print("error: llama.cpp is not built here (expected .llama-cpp/build/bin/llama-bench): run `make llama-cpp`",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    pairs = []
    for spec in a.ggufs:
        label, sep, path = spec.partition("=")
        if not sep or not Path(path).is_file():
            print(f"error: {spec!r} is not LABEL=PATH to a GGUF file (e.g. f32=runs/llama-cpp-bench/gguf/target.gguf)",
                  file=sys.stderr)  # fmt: skip
            raise SystemExit(2)
        pairs.append((label, Path(path)))
    rows = []
    for label, path in pairs:
        rows.append(measure(label, path, Path(server).with_name("llama-bench"), a.reps, a.threads))
        print(json.dumps(rows[-1]), flush=True)
    print(table(rows))
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"rows": rows, "threads": a.threads, "depth": 256}, indent=2) + "\n")


if __name__ == "__main__":
    main()
