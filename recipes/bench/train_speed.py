"""Training speed of the draft head at a fixed shape: tokens/s and peak memory.

    .venv/bin/python recipes/bench/train_speed.py [--hidden 128] [--batch 4] [--seq 512] [--ttt-steps 7]

The shape defaults to the tiny target's (H=128, vocab 4096, draft vocab 2048, 3 aux layers).
Each timed step is a full optimizer step of `eagle3 train`: teacher from last hidden states,
TTT unroll K steps, soft cross-entropy, backward, clip, AdamW. Synthetic features (the cost
does not depend on their values). Prints one JSON object: tokens/s, ms/step, peak RSS (MiB)
and, on CUDA, peak allocated GPU memory.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import time

import torch
from transformers import LlamaConfig

from eagle3cli.model.draft import Eagle3Draft, draft_config_from_target
from eagle3cli.train.ttt import draft_ttt_loss, teacher_from_hidden


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--draft-vocab", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--ttt-steps", type=int, default=7)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()

    dev = torch.device(a.device)
    torch.manual_seed(0)
    h = a.hidden
    tcfg = LlamaConfig(
        vocab_size=a.vocab,
        hidden_size=h,
        intermediate_size=3 * h,
        num_hidden_layers=12,
        num_attention_heads=a.heads,
        num_key_value_heads=max(1, a.heads // 2),
        max_position_embeddings=max(2048, a.seq),
    )
    draft = Eagle3Draft(draft_config_from_target(tcfg, a.draft_vocab, (2, 6, 9))).to(dev)
    draft.set_vocab_maps(
        torch.arange(a.draft_vocab) * 0 + (a.vocab - a.draft_vocab) // 2, torch.zeros(a.vocab, dtype=torch.bool)
    )
    lm_head = torch.randn(a.vocab, h, device=dev) / h**0.5
    batch = {
        "input_ids": torch.randint(0, a.vocab, (a.batch, a.seq), device=dev),
        "aux_hidden": torch.randn(a.batch, a.seq, 3 * h, device=dev),
        "loss_mask": torch.ones(a.batch, a.seq, dtype=torch.bool, device=dev),
    }
    last_hidden = torch.randn(a.batch, a.seq, h, device=dev)
    bf16 = dev.type == "cuda"
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=1e-4)

    def step() -> None:
        teacher = teacher_from_hidden(last_hidden, lm_head, draft.d2t)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            out = draft_ttt_loss(draft, batch, teacher, a.ttt_steps)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 0.5)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(a.warmup):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    tokens = a.batch * a.seq * a.steps
    result = {
        "bench": "train_speed",
        "shape": {
            "hidden": h,
            "vocab": a.vocab,
            "draft_vocab": a.draft_vocab,
            "batch": a.batch,
            "seq": a.seq,
            "ttt_steps": a.ttt_steps,
        },
        "device": str(dev),
        "dtype": "bf16-autocast" if bf16 else "fp32",
        "threads": torch.get_num_threads(),
        "tokens_per_s": round(tokens / dt, 1),
        "ms_per_step": round(1000 * dt / a.steps, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "peak_gpu_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1) if dev.type == "cuda" else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
