"""What `--cpu-kernels onednn` buys each inference stage, against plain F.linear, in one process.

    .venv/bin/python benchmarks/stages/cpu_kernels.py --target models/smollm2-135m [--dtype fp32]
        [--prompts 16] [--max-new-tokens 32] [--batch-size 16] [--cache-rows 4x512] [--repeats 3]
        [--threads 1] [--out FILE.json]

Two copies of the target, one packed (eagle3cli/model/cpu_kernels.py), timed alternately on the
same inputs (the order flips every repeat, medians kept), so a busy machine's drift cancels:
  decode    plain one-token decoding steps (eval's plain loop) and a 9-token pass (verification);
  gen_data  the hf backend's batched greedy regeneration (--prompts, --batch-size);
  cache     the cache stage's forward with aux capture over --cache-rows (batch x length).
Prints one JSON object: seconds of each side, the speedup (torch / onednn) and whether the
greedy outputs are identical. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(REPO / "models" / "tiny-target"))
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--cache-rows", default="4x512", help="BATCHxLENGTH of the cache-stage forward")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(a.threads)
    from eagle3cli.data.hf import HFBackend, encode_prompt
    from eagle3cli.data.regen import Sampling
    from eagle3cli.model.cpu_kernels import pack_for_inference
    from eagle3cli.model.target import load_target
    from eagle3cli.prompts import load_prompts
    from eagle3cli.speculate.aux_layers import default_aux_layer_ids
    from eagle3cli.speculate.decoder import plain_decode, target_forward, target_logits
    from eagle3cli.speculate.target import capture_features
    from eagle3cli.speculate.target_kv import TargetKV

    models, kernels = {}, {}
    for name in ("torch", "onednn"):
        models[name], tok, _ = load_target(a.target, device="cpu", dtype=a.dtype)
        kernels[name] = pack_for_inference(models[name], name)
    prompts = [
        encode_prompt(tok, [m for m in msgs if m["role"] == "user"][:1]) for _, msgs in load_prompts("gsm8k", a.prompts)
    ]
    sampling = Sampling(max_new_tokens=a.max_new_tokens, temperature=0)
    backends = {k: HFBackend(m, tok, sampling, batch_size=a.batch_size) for k, m in models.items()}
    aux = default_aux_layer_ids(models["torch"].config.num_hidden_layers)
    b, t = (int(x) for x in a.cache_rows.split("x"))
    cache_ids = torch.randint(0, models["torch"].config.vocab_size, (b, t))

    def decode(k):
        return plain_decode(models[k], prompts[0], a.max_new_tokens, set()).tokens

    def verify9(k):
        m = models[k]
        kv = TargetKV(m, 512)
        target_forward(m, kv, torch.tensor([prompts[0]]), 0)
        ids = torch.randint(0, 1000, (1, 9))
        for _ in range(8):
            target_logits(m, target_forward(m, kv, ids, len(prompts[0])))

    def gen(k):
        return [o.text for o in backends[k].generate_sorted(prompts, [0] * len(prompts))]

    def cache(k):
        with torch.inference_mode():
            capture_features(models[k], cache_ids, torch.ones_like(cache_ids), aux)

    parts = {"decode": decode, "verify_9_tokens_x8": verify9, "gen_data": gen, "cache": cache}
    times: dict[str, dict[str, list[float]]] = {p: {"torch": [], "onednn": []} for p in parts}
    outputs: dict[str, dict] = {p: {} for p in parts}
    with torch.inference_mode():
        for k in ("torch", "onednn"):  # warm-up: allocator, kernel selection
            decode(k)
        for rep in range(a.repeats):
            for p, fn in parts.items():
                for k in ("torch", "onednn") if rep % 2 == 0 else ("onednn", "torch"):
                    t0 = time.perf_counter()
                    outputs[p][k] = fn(k)
                    times[p][k].append(time.perf_counter() - t0)
    result: dict = {
        "target": a.target,
        "dtype": a.dtype,
        "threads": a.threads,
        "kernels": kernels,
        "prompts": len(prompts),
        "max_new_tokens": a.max_new_tokens,
        "batch_size": a.batch_size,
        "cache_rows": a.cache_rows,
        "repeats": a.repeats,
        "timing": "median wall seconds over repeats; the two sides alternate, order flipped each repeat",
    }
    for p in parts:
        med = {k: statistics.median(v) for k, v in times[p].items()}
        row = {"torch_s": round(med["torch"], 4), "onednn_s": round(med["onednn"], 4)}
        row["speedup"] = round(med["torch"] / med["onednn"], 3)
        if outputs[p]["torch"] is not None:
            same = outputs[p]["torch"] == outputs[p]["onednn"]
            if (
                isinstance(outputs[p]["torch"], list)
                and outputs[p]["torch"]
                and isinstance(outputs[p]["torch"][0], str)
            ):
                same = f"{sum(x == y for x, y in zip(outputs[p]['torch'], outputs[p]['onednn']))}/{len(prompts)}"
            row["identical_greedy_output"] = same
        result[p] = row
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
