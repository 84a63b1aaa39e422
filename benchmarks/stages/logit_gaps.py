"""Is a greedy mismatch a rounding tie? The target's top-2 logit gap at each answer position of
one prompt, decoded greedily token by token (plain decoding's path) and again in one pass over the
whole answer (a verification pass's shape).

    .venv/bin/python benchmarks/stages/logit_gaps.py --target models/smollm2-135m --bench sharegpt \\
        --prompt-id sharegpt_test:S1Asa9c_24 --tokens 12 --dtype fp32

eval's report names the prompt and the first differing position of a greedy mismatch
(`lossless.examples`); where the gap there is ~1e-5 and the two shapes disagree on the argmax or
nearly so, the mismatch is the target's arithmetic (sums in another order), not the rejection rule.
Prints one JSON object: per position the token, its gap in each shape, and whether the argmaxes agree.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repo root
from eagle3cli.prompts import load_prompts, render  # noqa: E402


def _top2(logits: torch.Tensor) -> tuple[int, float]:
    top = torch.topk(logits.float(), 2)
    return int(top.indices[0]), float(top.values[0] - top.values[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--bench", required=True, help="eval's --bench")
    ap.add_argument("--prompt-id", required=True, help="the id eval's lossless.examples name")
    ap.add_argument("--num-prompts", type=int, default=1000, help="how many of the bench's prompts to search")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    a = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prompts = dict(load_prompts(a.bench, a.num_prompts))
    if a.prompt_id not in prompts:
        print(f"error: no prompt {a.prompt_id!r} in the first {a.num_prompts} of --bench {a.bench}", file=sys.stderr)
        raise SystemExit(2)
    dtype = torch.float32 if a.dtype == "fp32" else torch.bfloat16
    tok = AutoTokenizer.from_pretrained(a.target)
    model = AutoModelForCausalLM.from_pretrained(a.target, dtype=dtype).eval()
    ids = render(tok, prompts[a.prompt_id])
    rows = []
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        cache, logits, answer = out.past_key_values, out.logits[0, -1], []
        for _ in range(a.tokens):  # plain decoding: one token a step on the cache
            t, gap = _top2(logits)
            rows.append({"token": tok.decode([t]), "step_gap": gap})
            answer.append(t)
            out = model(torch.tensor([[t]]), past_key_values=cache, use_cache=True)
            cache, logits = out.past_key_values, out.logits[0, -1]
        full = model(torch.tensor([ids + answer])).logits[0]  # the same answer in one pass
    for i, row in enumerate(rows):
        t, gap = _top2(full[len(ids) - 1 + i])
        row |= {"position": i, "pass_gap": gap, "same_argmax": t == answer[i]}
    tightest = min(rows, key=lambda r: r["step_gap"])
    print(json.dumps({"prompt": a.prompt_id, "dtype": a.dtype, "tightest": tightest, "positions": rows}, indent=1))


if __name__ == "__main__":
    main()
