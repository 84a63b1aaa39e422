"""Training speed of the draft head at a fixed shape: tokens/s and peak memory.

    .venv/bin/python benchmarks/stages/train_speed.py [--hidden 128] [--batch 4] [--seq 512] [--ttt-steps 7]

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

from eagle3cli.speculate.draft import Eagle3Draft, draft_config_from_target
from eagle3cli.speculate.ttt import draft_ttt_loss, teacher_from_hidden


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=("tiny", "smollm2"), default="tiny", help="the shape of a target")
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--intermediate", type=int, default=None)
    ap.add_argument("--vocab", type=int, default=None)
    ap.add_argument("--draft-vocab", type=int, default=None)
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default=None, help="default: bf16 on CUDA, fp32 on CPU")
    ap.add_argument("--profile", action="store_true", help="print the torch profiler's top ops")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the TTT loss (as `eagle3 train --compile`)")
    ap.add_argument("--no-stored-argmax", action="store_true", help="recompute the target argmax (caches before 0.2)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--ttt-steps", type=int, default=7)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()

    presets = {
        # the tiny target: H=128, vocab 4096, draft vocab 2048
        "tiny": dict(hidden=128, heads=4, kv_heads=2, intermediate=384, vocab=4096, draft_vocab=2048),
        # SmolLM2-135M-Instruct: H=576, 9/3 heads, vocab 49,152; draft vocab as its recipe picks
        "smollm2": dict(hidden=576, heads=9, kv_heads=3, intermediate=1536, vocab=49152, draft_vocab=16384),
    }
    for k, v in presets[a.preset].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    dev = torch.device(a.device)
    torch.manual_seed(0)
    h = a.hidden
    tcfg = LlamaConfig(
        vocab_size=a.vocab,
        hidden_size=h,
        intermediate_size=a.intermediate,
        num_hidden_layers=12,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        max_position_embeddings=max(2048, a.seq),
    )
    draft = Eagle3Draft(draft_config_from_target(tcfg, a.draft_vocab, (2, 6, 9))).to(dev)
    lm_head = torch.randn(a.vocab, h, device=dev) / h**0.5
    last_hidden = torch.randn(a.batch, a.seq, h, device=dev)
    # The draft vocab holds the teacher's argmax at every position (as the most frequent tokens of
    # real data do for ~95% of them), so every assistant position is counted, as in training.
    top = (last_hidden.flatten(0, 1) @ lm_head.t()).argmax(-1).unique()
    rest = torch.tensor(sorted(set(range(a.vocab)) - set(top.tolist())), dtype=torch.long)
    ids = torch.cat([top.cpu(), rest])[: a.draft_vocab].sort().values
    t2d = torch.zeros(a.vocab, dtype=torch.bool)
    t2d[ids] = True
    draft.set_vocab_maps((ids - torch.arange(a.draft_vocab)).to(dev), t2d.to(dev))
    loss_mask = torch.ones(a.batch, a.seq, dtype=torch.bool, device=dev)
    loss_mask[:, : int(0.4 * a.seq)] = False  # the prompt (system + user turns) trains nothing
    batch = {
        "input_ids": torch.randint(0, a.vocab, (a.batch, a.seq), device=dev),
        "aux_hidden": torch.randn(a.batch, a.seq, 3 * h, device=dev),
        "loss_mask": loss_mask,
    }
    bf16 = (a.dtype or ("bf16" if dev.type == "cuda" else "fp32")) == "bf16"
    target_argmax = (last_hidden.flatten(0, 1) @ lm_head.t()).argmax(-1).view(a.batch, a.seq)
    if a.threads:
        torch.set_num_threads(a.threads)
    loss_fn = torch.compile(draft_ttt_loss, dynamic=True) if a.compile else draft_ttt_loss
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=1e-4)

    def step() -> None:
        teacher = teacher_from_hidden(
            last_hidden,
            lm_head,
            draft.d2t,
            loss_mask=batch["loss_mask"],
            target_argmax=None if a.no_stored_argmax else target_argmax,
            compute_dtype=torch.bfloat16 if bf16 else None,
        )
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            out = loss_fn(draft, batch, teacher, a.ttt_steps)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 0.5)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(a.warmup):
        step()
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))
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
            "preset": a.preset,
            "assistant_share": 0.6,
        },
        "device": str(dev),
        "dtype": "bf16-autocast" if bf16 else "fp32",
        "stored_argmax": not a.no_stored_argmax,
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
