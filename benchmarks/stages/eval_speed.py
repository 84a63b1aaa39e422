"""Speculative decoding speed on CPU: chain and tree vs plain decoding with a trained head.

    .venv/bin/python benchmarks/stages/eval_speed.py --head runs/demo/head [--target models/tiny-target]
        [--bench gsm8k] [--num-prompts 8] [--max-new-tokens 128] [--depth 8] [--topk 4]
        [--num-draft-tokens 16] [--threads 1]

Runs `eagle3 eval --mode both` (plain loop, transformers generate, chain, tree; greedy, so the
outputs are also checked token for token) and prints one JSON object: tau and tokens/s of each
decoder, speedups over our plain loop and over `generate`, greedy mismatches, and whether the
goal (>= 2x with a depth-8 chain) is met. Exit 1 if any greedy output differs from plain decoding.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from eagle3cli import console
from eagle3cli.errors import UsageError
from eagle3cli.eval.config import EvalConfig
from eagle3cli.eval.run import run_eval


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head", type=Path, default=Path("runs/demo/head"))
    ap.add_argument("--target", default="models/tiny-target")
    ap.add_argument("--bench", default="gsm8k")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--num-draft-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="keep the eval report here (default: a temp dir)")
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="eval-speed-"))
    cfg = EvalConfig(
        target=a.target,
        head=a.head,
        out=out,
        bench=a.bench,
        num_prompts=a.num_prompts,
        max_new_tokens=a.max_new_tokens,
        depth=a.depth,
        mode="both",
        topk=a.topk,
        num_draft_tokens=a.num_draft_tokens,
        threads=a.threads,
    )
    errors = cfg.validate()
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 2
    console.out = console.console  # tables to stderr: stdout is the JSON only
    try:
        run_eval(cfg)
    except UsageError as e:
        print(f"error: {e.render()}", file=sys.stderr)
        return 2
    rep = json.loads((out / "report.json").read_text())
    head = next(iter(rep["heads"].values()))
    res = {
        "bench": a.bench,
        "prompts": rep["num_prompts"],
        "max_new_tokens": a.max_new_tokens,
        "depth": a.depth,
        "tree": {"topk": a.topk, "num_draft_tokens": a.num_draft_tokens},
        "threads": a.threads,
        "plain_tokens_per_s": round(rep["baselines"]["plain"]["tokens_per_s"], 2),
        "generate_tokens_per_s": round(rep["baselines"]["generate"]["tokens_per_s"], 2),
    }
    mismatches = 0
    for mode in ("chain", "tree"):
        st = head[mode]
        res[mode] = {
            "tau": round(st["acceptance"]["tau"], 3),
            "tokens_per_s": round(st["speed"]["tokens_per_s"], 2),
            "speedup_vs_plain": round(st["speedup_vs_plain"], 3),
            "speedup_vs_generate": round(st["speedup_vs_generate"], 3),
            "greedy_mismatches": st["lossless"]["mismatches"],
        }
        mismatches += st["lossless"]["mismatches"]
    # d < depth: truncation of the depth-D rounds, an estimate (eval --sweep measures each depth)
    res["chain"]["tau_by_depth_estimate"] = [round(t, 3) for t in head["chain"]["acceptance"]["tau_by_depth_estimate"]]
    res["goal_chain_2x_met"] = res["chain"]["speedup_vs_plain"] >= 2.0
    res["recommended"] = rep["recommended"]
    res["report"] = str(out / "report.json")
    print(json.dumps(res, indent=2))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
