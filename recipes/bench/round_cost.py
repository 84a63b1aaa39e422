"""What a speculative-decoding round costs, in target-token times (one plain decoding step = 1).

    .venv/bin/python recipes/bench/round_cost.py --target models/tiny-target [--head runs/demo/head]
        [--dtype fp32 --dtype bf16] [--depths 1,2,4,8] [--tree-depths 2,4,8] [--prompts 2]
        [--max-new-tokens 32] [--repeats 3] [--draft-vocab 2048] [--threads 1] [--out FILE.json]

Prints one JSON object (also written to --out):
  parts[dtype]   ms per call, and in target-token times, of the pieces of a round: target passes
                 over 1, 2, 9 and 16 new tokens (lm_head included), a draft step (forward + logits
                 + argmax) and its two halves, a 9-token commit; and the draft step's weight-bytes
                 share (bytes a chain step reads / bytes one target token reads).
  rounds[head][dtype][variant]  for chain depth d (`chain{d}`) and a tree verifying as many tokens
                 (`tree{d}`: num_draft_tokens d+1, depth d, --topk): round cost (seconds per round /
                 seconds per plain token, prefill excluded from both), tau, speedup over plain
                 decoding in the same dtype and over fp32 plain decoding; `tree8_16` is eval's
                 default tree (depth 8, 16 verified tokens).
  mismatches     greedy outputs that differ from plain decoding in the same dtype (expected 0).
Heads: `random` (a random-init head over --draft-vocab: it accepts almost nothing, so tau ~ 1 and
a round's whole cost shows) and `trained` (--head). Not a timed test: the machine is shared, so
every repeat runs every variant on every prompt in turn and the medians are reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from eagle3cli.eval.decoder import SpeculativeDecoder, _target_forward, _target_logits, plain_decode
from eagle3cli.eval.prompts import load_prompts, render
from eagle3cli.eval.target_kv import TargetKV
from eagle3cli.model.draft import Eagle3Draft, draft_config_from_target
from eagle3cli.model.export import load_head
from eagle3cli.model.target import default_aux_layer_ids, load_target


def random_head(target, draft_vocab: int) -> tuple[Eagle3Draft, tuple[int, ...]]:
    aux = default_aux_layer_ids(target.config.num_hidden_layers)
    torch.manual_seed(0)
    vocab = min(draft_vocab, target.config.vocab_size)
    head = Eagle3Draft(draft_config_from_target(target.config, vocab, aux)).eval()
    with torch.no_grad():
        head.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
    return head, aux


def target_bytes_per_token(target) -> int:
    """Weights one decoding step reads: everything but the input embedding (one row of it),
    unless the lm_head is that same matrix."""
    tied = bool(getattr(target.config, "tie_word_embeddings", False))
    return sum(p.numel() * p.element_size() for n, p in target.named_parameters() if tied or "embed_tokens" not in n)


def draft_step_bytes(head) -> int:
    """A chain step reads the layer, the final norm and the lm_head (fc only runs in commits)."""
    return sum(
        p.numel() * p.element_size()
        for n, p in head.named_parameters()
        if n.startswith(("midlayer.", "norm.", "lm_head."))
    )


@torch.inference_mode()
def measure_parts(target, head, repeats: int, context: int = 200) -> dict:
    dev = target.device
    kv = TargetKV(target, context + 32)
    cache = head.new_cache(context + 32)
    aux_width = len(head.config.aux_layer_ids) * target.config.hidden_size
    _target_forward(target, kv, torch.randint(0, 1000, (1, context), device=dev), 0)
    feats = torch.randn(1, context, aux_width, device=dev).to(target.dtype)
    head(torch.randint(0, 1000, (1, context), device=dev), feats, cache, 0, True, last_only=True)
    h = torch.randn(1, 1, head.config.hidden_size, device=dev, dtype=head.fc.weight.dtype)
    tok = torch.tensor([[7]], device=dev)
    fns = {}
    for n in (1, 2, 9, 16):
        ids = torch.randint(0, 1000, (1, n), device=dev)
        fns[f"target_pass_{n}"] = lambda ids=ids: _target_logits(target, _target_forward(target, kv, ids, context))
    fns["draft_step"] = lambda: head.logits(head(tok, h, cache, context, False)).argmax(-1)
    fns["draft_forward"] = lambda: head(tok, h, cache, context, False)
    fns["draft_logits_argmax"] = lambda: head.logits(h).argmax(-1)
    f9 = feats[:, :9]
    fns["commit_9"] = lambda: head(torch.randint(0, 1000, (1, 9), device=dev), f9, cache, context, True, last_only=True)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t = time.perf_counter()
            for _ in range(3):
                f()
            times[k].append((time.perf_counter() - t) / 3)
    unit = statistics.median(times["target_pass_1"])
    share = draft_step_bytes(head) / target_bytes_per_token(target)
    out = {
        k: {"ms": round(statistics.median(v) * 1e3, 3), "target_tokens": round(statistics.median(v) / unit, 3)}
        for k, v in times.items()
    }
    out["draft_step_weight_share"] = round(share, 4)
    out["draft_step_cost_over_share"] = round(out["draft_step"]["target_tokens"] / share, 2)
    return out


def variants(depths: list[int], tree_depths: list[int], topk: int) -> dict[str, dict]:
    v = {f"chain{d}": {"mode": "chain", "depth": d} for d in depths}
    v.update({f"tree{d}": {"mode": "tree", "depth": d, "topk": topk, "num_draft_tokens": d + 1} for d in tree_depths})
    if tree_depths:  # and eval's default tree: depth 8, 16 verified tokens
        v["tree8_16"] = {"mode": "tree", "depth": 8, "topk": topk, "num_draft_tokens": 16}
    return v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="models/tiny-target")
    ap.add_argument("--head", type=Path, default=None, help="a trained head folder (adds the `trained` head)")
    ap.add_argument("--dtype", action="append", default=None, help="target dtype(s): fp32, bf16 (default fp32)")
    ap.add_argument("--depths", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--tree-depths", default="2,4,8")
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--draft-vocab", type=int, default=8192, help="draft vocab of the random head")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--parts-repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dtypes = a.dtype or ["fp32"]
    targets = {}
    for dt in dtypes:
        targets[dt], tok, _ = load_target(a.target, dtype=dt)
    first = targets[dtypes[0]]
    heads = {"random": random_head(first, a.draft_vocab)}
    if a.head:
        trained = load_head(a.head, target_model=first).float().eval()
        heads["trained"] = (trained, tuple(trained.config.aux_layer_ids))
    prompts = [render(tok, msgs) for _, msgs in load_prompts("gsm8k", a.prompts, None)]
    vs = variants([int(x) for x in a.depths.split(",") if x], [int(x) for x in a.tree_depths.split(",") if x], a.topk)
    parts = {dt: measure_parts(targets[dt], heads["random"][0], a.parts_repeats) for dt in dtypes}

    def decoders(dt):
        for hname, (head, aux) in heads.items():
            for vname, kw in vs.items():
                yield (hname, dt, vname), SpeculativeDecoder(targets[dt], head, aux, **kw)

    runs: dict[tuple, list] = {}
    plain_out: dict[tuple, list[int]] = {}
    mismatches = []
    for rep in range(a.repeats + 1):  # repeat 0 warms up and is not kept
        for i, prompt in enumerate(prompts):
            for dt in dtypes:
                p = plain_decode(targets[dt], prompt, a.max_new_tokens, set())
                plain_out[(dt, i)] = p.tokens
                if rep:
                    runs.setdefault(("plain", dt, ""), []).append(p)
                for key, dec in decoders(dt):
                    r = dec.generate(prompt, a.max_new_tokens)
                    if rep:
                        runs.setdefault(key, []).append(r)
                    if rep == 1 and r.tokens != p.tokens:
                        mismatches.append({"variant": "/".join(key), "prompt": i})

    def per_token(rs):  # seconds per emitted token after the first (prefill excluded)
        return statistics.median((r.seconds - r.prefill_seconds) / max(len(r.tokens) - 1, 1) for r in rs)

    plain_tok = {dt: per_token(runs[("plain", dt, "")]) for dt in dtypes}
    rounds: dict = {}
    for (hname, dt, vname), rs in runs.items():
        if hname == "plain":
            continue
        secs_round = statistics.median((r.seconds - r.prefill_seconds) / max(r.rounds, 1) for r in rs)
        tau = sum(len(r.tokens) - 1 for r in rs) / max(sum(r.rounds for r in rs), 1)
        rounds.setdefault(hname, {}).setdefault(dt, {})[vname] = {
            "round_cost": round(secs_round / plain_tok[dt], 3),
            "tau": round(tau, 3),
            "speedup_vs_plain": round(plain_tok[dt] / per_token(rs), 3),
            "speedup_vs_fp32_plain": round(plain_tok.get("fp32", plain_tok[dt]) / per_token(rs), 3),
        }
    report = {
        "target": a.target,
        "threads": a.threads,
        "prompts": len(prompts),
        "max_new_tokens": a.max_new_tokens,
        "repeats": a.repeats,
        "draft_vocab_random_head": heads["random"][0].config.draft_vocab_size,
        "plain_ms_per_token": {dt: round(v * 1e3, 2) for dt, v in plain_tok.items()},
        "parts": parts,
        "rounds": rounds,
        "mismatches": mismatches,
    }
    text = json.dumps(report, indent=1)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
