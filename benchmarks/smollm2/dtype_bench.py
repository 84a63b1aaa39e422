"""fp32 vs bf16 for the SmolLM2 target on this CPU: speed of the forwards each stage runs, and
how far bf16 moves the output (greedy agreement, logit error). Ratios from interleaved repeats.

    .venv/bin/python benchmarks/smollm2/dtype_bench.py [--target models/smollm2-135m] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

REPO = Path(__file__).resolve().parents[2]
PROMPTS = [
    "What is the capital of France?",
    "Explain in two sentences why the sky is blue.",
    "Write a haiku about autumn.",
    "List three uses of a paperclip.",
    "How do I reverse a list in Python?",
    "What is 17 times 23?",
    "Name a famous painting by Leonardo da Vinci.",
    "Give one tip for learning a new language.",
]


def timed(fn, repeats: int) -> float:
    """Median seconds; a fn that returns a float reports its own timed part (setup excluded)."""
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        r = fn()
        out.append(r if isinstance(r, float) else time.perf_counter() - t)
    return statistics.median(out)


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default=str(REPO / "models" / "smollm2-135m"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.target)
    models = {
        d: AutoModelForCausalLM.from_pretrained(args.target, dtype=d).eval() for d in (torch.float32, torch.bfloat16)
    }
    ctx = torch.randint(100, 40000, (1, 512))
    batch = torch.randint(100, 40000, (16, 256))
    res: dict[str, dict] = {}
    for name, fn_of in {
        "decode_1tok_ctx512": lambda m: _decode(m, ctx, 1),
        "verify_9tok_ctx512": lambda m: _decode(m, ctx, 9),
        "prefill_512": lambda m: m.model(input_ids=ctx),
        "batch16x256_forward": lambda m: m.model(input_ids=batch),
    }.items():
        for _ in range(2):  # interleave dtypes so load drifts hit both alike
            for d, m in models.items():
                res.setdefault(name, {}).setdefault(str(d), []).append(timed(lambda m=m, f=fn_of: f(m), args.repeats))
    speed = {n: {d: min(v) for d, v in r.items()} for n, r in res.items()}
    agree, tokens, maxdiff = 0, 0, 0.0
    for p in PROMPTS:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        outs = [
            m.generate(**ids, max_new_tokens=64, do_sample=False, pad_token_id=tok.pad_token_id)[0]
            for m in models.values()
        ]
        n = min(len(outs[0]), len(outs[1]))
        same = int((outs[0][:n] == outs[1][:n]).long().cumprod(0).sum()) - ids["input_ids"].shape[1]
        agree += same
        tokens += len(outs[0]) - ids["input_ids"].shape[1]
        l32 = models[torch.float32](outs[0][None]).logits.float()
        l16 = models[torch.bfloat16](outs[0][None]).logits.float()
        maxdiff = max(maxdiff, float((l32 - l16).abs().max()))
    report = {
        "threads": args.threads,
        "seconds": speed,
        "bf16_speedup": {n: s["torch.float32"] / s["torch.bfloat16"] for n, s in speed.items()},
        "greedy_prefix_agreement": agree / tokens,
        "max_abs_logit_diff": maxdiff,
    }
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


def _decode(m, ctx, n, steps: int = 8) -> float:
    """Seconds per cached forward of n new tokens after a 512-token context (prefill excluded)."""
    cache = DynamicCache(config=m.config)
    m.model(input_ids=ctx, cache=cache, use_cache=True)
    t = time.perf_counter()
    for _ in range(steps):
        m.model(input_ids=ctx[:, -n:], cache=cache, use_cache=True)
        cache.crop(-n)
    return (time.perf_counter() - t) / steps


if __name__ == "__main__":
    main()
