"""What a speculative-decoding round costs, in target-token times (one plain decoding step = 1).

    .venv/bin/python benchmarks/stages/round_cost.py --target models/tiny-target [--head runs/demo/head]
        [--dtype fp32 --dtype bf16] [--depths 1,2,4,8] [--tree-depths 2,4,8] [--prompts 2]
        [--max-new-tokens 32] [--repeats 3] [--draft-vocab 2048] [--threads 1] [--cpu-kernels onednn|torch]
        [--bench gsm8k|mt_bench] [--profile chain1,chain3,tree8_16] [--no-random] [--out FILE.json]
        [--record docs/results-smollm2.json]
    .venv/bin/python benchmarks/stages/round_cost.py --target models/smollm2-135m --draft-step-vocabs 16384,32768,49152 \
        [--record-draft-steps docs/results-smollm2.json]   # a draft step of each draft vocab, nothing else

Prints one JSON object (also written to --out):
  parts[dtype]   ms per call, and in target-token times, of the pieces of a round: target passes
                 over 1, 2, 3, 4, 5, 9 and 16 new tokens (lm_head included), a draft step (forward + logits
                 + argmax) and its two halves, a 9-token commit; and the draft step's weight-bytes
                 share (bytes a chain step reads / bytes one target token reads).
  rounds[head][dtype][variant]  for chain depth d (`chain{d}`) and a tree verifying as many tokens
                 (`tree{d}`: num_draft_tokens d+1, depth d, --topk): round cost (seconds per round /
                 seconds per plain token, prefill excluded from both), tau, speedup over plain
                 decoding in the same dtype and over fp32 plain decoding; `tree8_16` is eval's
                 default tree (depth 8, 16 verified tokens).
  profile[head][dtype][--profile variants; chain8, tree8_16 by default]  target-token times per round of each phase of the
                 decoder's own rounds (draft forward, draft logits + pick,
                 verification forward, target logits, acceptance, tree selection, commit, glue).
  mismatches     greedy outputs that differ from plain decoding in the same dtype (expected 0).
--record RESULTS_JSON: the trained head's fp32 chains (--profile chain1,chain2,...) split as llama.cpp's
rounds are, printed beside the JSON's llama_cpp.round_cost and written as its
llama_cpp.round_cost.eagle3_decoder (then benchmarks/smollm2/report_page.py renders the page).
Heads: `random` (a random-init head over --draft-vocab: it accepts almost nothing, so tau ~ 1 and
a round's whole cost shows) and `trained` (--head). Not a timed test. For a shared machine: the
clock is this process's CPU time (wall-clock speedups beside it), every repeat runs every
variant on every prompt in turn, each variant is a ratio to plain decoding timed just before
and after its block, and medians over prompts x repeats are reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from eagle3cli.head.read import load_head
from eagle3cli.model.cpu_kernels import pack_linears
from eagle3cli.model.target import load_target
from eagle3cli.prompts import load_prompts, render
from eagle3cli.speculate.aux_layers import default_aux_layer_ids
from eagle3cli.speculate.decoder import SpeculativeDecoder, plain_decode, target_forward, target_logits
from eagle3cli.speculate.draft import Eagle3Draft, draft_config_from_target
from eagle3cli.speculate.target_kv import TargetKV

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repo root, for `benchmarks`
from benchmarks.common import record  # noqa: E402
from benchmarks.llama_cpp.round_cost import decoder_rounds, side_by_side  # noqa: E402


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
def measure_parts(target, head, repeats: int, share: float, context: int = 200) -> dict:
    """share: the draft step's weight bytes over a target token's (counted before any packing)."""
    dev = target.device
    kv = TargetKV(target, context + 32)
    cache = head.new_cache(context + 32)
    aux_width = len(head.config.aux_layer_ids) * target.config.hidden_size
    target_forward(target, kv, torch.randint(0, 1000, (1, context), device=dev), 0)
    feats = torch.randn(1, context, aux_width, device=dev).to(target.dtype)
    head(torch.randint(0, 1000, (1, context), device=dev), feats, cache, 0, True, last_only=True)
    h = torch.randn(1, 1, head.config.hidden_size, device=dev, dtype=head.fc.weight.dtype)
    tok = torch.tensor([[7]], device=dev)
    fns = {}
    for n in (1, 2, 3, 4, 5, 9, 16):  # k+1 for a chain of k = 1..4, and two trees
        ids = torch.randint(0, 1000, (1, n), device=dev)
        fns[f"target_pass_{n}"] = lambda ids=ids: target_logits(target, target_forward(target, kv, ids, context))
    fns["draft_step"] = lambda: head.logits(head(tok, h, cache, context, False)).argmax(-1)
    fns["draft_forward"] = lambda: head(tok, h, cache, context, False)
    fns["draft_logits_argmax"] = lambda: head.logits(h).argmax(-1)
    f9 = feats[:, :9]
    fns["commit_9"] = lambda: head(torch.randint(0, 1000, (1, 9), device=dev), f9, cache, context, True, last_only=True)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t = time.process_time()  # CPU time: descheduled time on a busy machine does not count
            for _ in range(3):
                f()
            times[k].append((time.process_time() - t) / 3)
    unit = statistics.median(times["target_pass_1"])
    out = {
        k: {"ms": round(statistics.median(v) * 1e3, 3), "target_tokens": round(statistics.median(v) / unit, 3)}
        for k, v in times.items()
    }
    out["draft_step_weight_share"] = round(share, 4)
    out["draft_step_cost_over_share"] = round(out["draft_step"]["target_tokens"] / share, 2)
    return out


def plain_cpu_ms_per_token(target, prompt: list[int], n: int) -> float:
    """CPU ms of one plain decoding step (prefill excluded: a 1-token run subtracted)."""
    t0 = time.process_time()
    plain_decode(target, prompt, n, set())
    t1 = time.process_time()
    plain_decode(target, prompt, 1, set())
    return ((t1 - t0) - (time.process_time() - t1)) / max(n - 1, 1) * 1e3


@torch.inference_mode()
def profile_rounds(dec: SpeculativeDecoder, prompt: list[int], max_new_tokens: int, unit_ms) -> dict:
    """CPU ms per round spent in each phase of the decoder's own rounds: draft steps (forward;
    logits + pick), the verification forward (the model with its masks and aux capture), target
    logits, acceptance, tree selection, the commit of accepted tokens into the draft cache, and
    the rest (glue). Measured by wrapping those calls on this decoder, so nothing of the round is
    re-implemented here; a 1-token run's phases (the prefill) are subtracted. `unit_ms()` times
    one plain decoding step; it runs just before and after, and each phase is divided by it."""
    import eagle3cli.speculate.decoder as decoder_module

    spent: dict[str, float] = {}

    def wrap(owner, name, phase):
        fn = getattr(owner, name)

        def timed(*args, **kwargs):
            if phase == "draft_forward" and (kwargs.get("from_target") or (len(args) > 4 and args[4])):
                return fn(*args, **kwargs)  # a commit's draft step: counted in `commit`
            t = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[phase] = spent.get(phase, 0.0) + time.process_time() - t

        setattr(owner, name, timed)
        return owner, name, fn

    patched = [
        wrap(dec, "commit", "commit"),
        wrap(dec.draft, "forward", "draft_forward"),  # nn.Module.__call__ looks up self.forward
        wrap(dec.draft, "logits", "draft_logits_pick"),
        wrap(dec, "pick", "draft_logits_pick"),
        wrap(decoder_module, "target_forward", "verify_forward"),
        wrap(decoder_module, "target_logits", "target_logits"),
        wrap(decoder_module, "verify_chain_greedy", "accept"),
        wrap(decoder_module, "verify_tree_greedy", "accept"),
        wrap(decoder_module, "select_nodes", "tree_select"),
    ]

    def run(n: int) -> tuple[dict[str, float], int]:
        spent.clear()
        t = time.process_time()
        r = dec.generate(prompt, n)
        return {**spent, "total": time.process_time() - t}, r.rounds

    try:
        before = unit_ms()
        full, rounds = run(max_new_tokens)
        pre, _ = run(1)
        unit = (before + unit_ms()) / 2
    finally:
        for owner, name, fn in reversed(patched):
            if owner is dec or owner is dec.draft:
                delattr(owner, name)
            else:
                setattr(owner, name, fn)
    out = {k: (full[k] - pre.get(k, 0.0)) / max(rounds, 1) * 1e3 / unit for k in full}
    out["glue"] = out["total"] - sum(v for k, v in out.items() if k != "total")
    return out


def variants(depths: list[int], tree_depths: list[int], topk: int) -> dict[str, dict]:
    v = {f"chain{d}": {"mode": "chain", "depth": d} for d in depths}
    v.update({f"tree{d}": {"mode": "tree", "depth": d, "topk": topk, "num_draft_tokens": d + 1} for d in tree_depths})
    if tree_depths:  # and eval's default tree: depth 8, 16 verified tokens
        v["tree8_16"] = {"mode": "tree", "depth": 8, "topk": topk, "num_draft_tokens": 16}
    return v


def draft_steps(a: argparse.Namespace) -> None:
    """What a draft step of each shape costs (--draft-step-vocabs): the recipe table's other draft vocabs draft
    slower, so their tau is read beside it. One fp32 target, one random 1-layer head per vocab, eval's kernels."""
    torch.set_num_threads(a.threads)
    target, _, _ = load_target(a.target, dtype="fp32")
    heads = {n: random_head(target, n)[0] for n in [int(x) for x in a.draft_step_vocabs.split(",") if x]}
    shares = {n: draft_step_bytes(h) / target_bytes_per_token(target) for n, h in heads.items()}  # before packing
    if a.cpu_kernels == "onednn":  # as eval and main() pack them
        for model in [target, *heads.values()]:
            pack_linears(model, keep_weight=isinstance(model, Eagle3Draft))
    by_vocab = {str(h.config.draft_vocab_size): measure_parts(target, h, a.parts_repeats, shares[n])["draft_step"]
                for n, h in heads.items()}  # fmt: skip
    value = {"by_draft_vocab": by_vocab, "unit": "target_pass_1 (one target token, fp32)", "target": a.target,
             "threads": a.threads, "cpu_kernels": a.cpu_kernels, "parts_repeats": a.parts_repeats,
             "command": " ".join([".venv/bin/python", *sys.argv])}  # fmt: skip
    print(text := json.dumps(value, indent=1))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
    if a.record_draft_steps:
        record(a.record_draft_steps, "draft_step_cost", value)


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
    ap.add_argument("--cpu-kernels", choices=["onednn", "torch"], default="onednn", help="as eagle3 eval --cpu-kernels")
    ap.add_argument("--bench", default="gsm8k", help="prompt set (eagle3's bundled benches: gsm8k, mt_bench, ...)")
    ap.add_argument(
        "--profile",
        default="chain8,tree8_16",
        help="variants whose rounds are taken apart phase by phase (chainD, treeD, tree8_16)",
    )
    ap.add_argument("--no-random", action="store_true", help="only the trained head (--head)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--record", type=Path, metavar="RESULTS_JSON", help="the decoder's rounds beside its llama.cpp's")
    ap.add_argument(
        "--draft-step-vocabs",
        default=None,
        metavar="N,N,...",
        help="only the draft step of a random head of each draft vocab (fp32), in target-token times",
    )
    ap.add_argument("--record-draft-steps", type=Path, metavar="RESULTS_JSON", help="write those as `draft_step_cost`")
    a = ap.parse_args()
    if a.draft_step_vocabs:
        if not all(x.strip().isdigit() and int(x) > 0 for x in a.draft_step_vocabs.split(",")):
            ap.error(f"--draft-step-vocabs {a.draft_step_vocabs!r}: expected draft vocab sizes, e.g. 16384,32768")
        draft_steps(a)
        return
    if a.no_random and not a.head:
        ap.error("--no-random needs --head")
    page = json.loads(a.record.read_text()) if a.record and a.record.exists() else {}
    rc = (page.get("llama_cpp") or {}).get("round_cost")
    chains = "chain" in a.profile and "fp32" in (a.dtype or ["fp32"])
    if a.record and not (a.head and chains and rc):  # refused before minutes of measuring
        ap.error(f"--record needs --head, --profile chain1,chain2,... in fp32 and {a.record}'s llama_cpp.round_cost")
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
    # the random head also sizes the draft step in `parts`; --no-random only drops its rounds
    timed_heads = {k: v for k, v in heads.items() if not (a.no_random and k == "random")}
    shares = {dt: draft_step_bytes(heads["random"][0]) / target_bytes_per_token(targets[dt]) for dt in dtypes}
    if a.cpu_kernels == "onednn":  # what eval does by default; the heads stay fp32 (shared by every dtype)
        for model in [*targets.values(), *(h for h, _ in heads.values())]:
            pack_linears(model, keep_weight=isinstance(model, Eagle3Draft))
    prompts = [render(tok, msgs) for _, msgs in load_prompts(a.bench, a.prompts)]
    vs = variants([int(x) for x in a.depths.split(",") if x], [int(x) for x in a.tree_depths.split(",") if x], a.topk)
    profiled = [v for v in a.profile.split(",") if v]
    known = {**variants(list(range(1, 17)), list(range(1, 17)), a.topk)}
    if unknown := [v for v in profiled if v not in known]:
        ap.error(f"--profile: unknown variant(s) {unknown}; expected chainD, treeD or tree8_16")
    parts = {dt: measure_parts(targets[dt], heads["random"][0], a.parts_repeats, shares[dt]) for dt in dtypes}
    profiles: dict = {}
    for dt in dtypes:
        for hname, (head, aux) in timed_heads.items():
            for vname in profiled:
                dec = SpeculativeDecoder(targets[dt], head, aux, **known[vname])
                dec.generate(prompts[0], 4)  # warm-up
                runs = [
                    profile_rounds(
                        dec, prompt, a.max_new_tokens, lambda t=targets[dt], p=prompt: plain_cpu_ms_per_token(t, p, 16)
                    )
                    for _ in range(a.repeats)
                    for prompt in prompts
                ]
                profiles.setdefault(hname, {}).setdefault(dt, {})[vname] = {
                    k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]
                }

    def decoders(dt):
        for hname, (head, aux) in timed_heads.items():
            for vname, kw in vs.items():
                yield (hname, dt, vname), SpeculativeDecoder(targets[dt], head, aux, **kw)

    # Clock: this process's CPU time (time.process_time), so time spent descheduled on a busy
    # machine does not count; wall-clock ratios are reported beside it. Each variant's cost is a
    # ratio to plain decoding measured just before and just after its block, per prompt and
    # repeat (load drifts cancel), prefill excluded (a 1-token run of the same call subtracted).
    def timed(fn, n):
        c, w = time.process_time(), time.perf_counter()
        full = fn(n)
        c1, w1 = time.process_time(), time.perf_counter()
        fn(1)
        c2, w2 = time.process_time(), time.perf_counter()
        return full, (c1 - c) - (c2 - c1), (w1 - w) - (w2 - w1)

    ratios: dict[tuple, dict[str, list[float]]] = {}
    taus: dict[tuple, list[tuple[int, int]]] = {}
    mismatches = []
    for rep in range(a.repeats + 1):  # repeat 0 warms up and is not kept
        for i, prompt in enumerate(prompts):
            for dt in dtypes:
                target = targets[dt]

                def plain(n, target=target, prompt=prompt):
                    return plain_decode(target, prompt, n, set())

                ref, c0, w0 = timed(plain, a.max_new_tokens)
                block = []
                for key, dec in decoders(dt):
                    r, c, w = timed(lambda n, dec=dec, prompt=prompt: dec.generate(prompt, n), a.max_new_tokens)
                    block.append((key, r, c, w))
                    if rep == 1 and r.tokens != ref.tokens:
                        mismatches.append({"variant": "/".join(key), "prompt": i})
                _, c1, w1 = timed(plain, a.max_new_tokens)
                steps = max(len(ref.tokens) - 1, 1)
                plain_cpu, plain_wall = (c0 + c1) / 2 / steps, (w0 + w1) / 2 / steps
                if not rep:
                    continue
                ratios.setdefault(("plain", dt, ""), {}).setdefault("cpu_ms", []).append(plain_cpu * 1e3)
                ratios[("plain", dt, "")].setdefault("wall_ms", []).append(plain_wall * 1e3)
                for key, r, c, w in block:
                    made = max(len(r.tokens) - 1, 1)
                    d = ratios.setdefault(key, {})
                    d.setdefault("round_cost", []).append(c / max(r.rounds, 1) / plain_cpu)
                    d.setdefault("speedup_vs_plain", []).append(plain_cpu * made / c)
                    d.setdefault("speedup_vs_plain_wall", []).append(plain_wall * made / w)
                    taus.setdefault(key, []).append((made, r.rounds))

    med = {k: {m: statistics.median(v) for m, v in d.items()} for k, d in ratios.items()}
    rounds: dict = {}
    for key, m in med.items():
        hname, dt, vname = key
        if hname == "plain":
            continue
        made, n_rounds = (sum(x) for x in zip(*taus[key]))
        row = {k: round(v, 3) for k, v in m.items()}
        row["tau"] = round(made / max(n_rounds, 1), 3)
        if dt != "fp32" and ("plain", "fp32", "") in med:  # the same work against fp32 plain decoding
            scale = med[("plain", "fp32", "")]["cpu_ms"] / med[("plain", dt, "")]["cpu_ms"]
            row["speedup_vs_fp32_plain"] = round(m["speedup_vs_plain"] * scale, 3)
        rounds.setdefault(hname, {}).setdefault(dt, {})[vname] = row
    report = {
        "target": a.target,
        "bench": a.bench,
        "head": str(a.head) if a.head else None,
        "threads": a.threads,
        "cpu_kernels": a.cpu_kernels,
        "prompts": len(prompts),
        "max_new_tokens": a.max_new_tokens,
        "repeats": a.repeats,
        "draft_vocab_random_head": heads["random"][0].config.draft_vocab_size,
        "plain_ms_per_token": {dt: {k: round(v, 2) for k, v in med[("plain", dt, "")].items()} for dt in dtypes},
        "parts": parts,
        "profile": profiles,
        "rounds": rounds,
        "mismatches": mismatches,
    }
    text = json.dumps(report, indent=1)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
    print(text)
    if a.record:  # eagle3's decoder's rounds in plain decoding steps, split as llama.cpp's are
        print(side_by_side(rc["rounds"], rows := decoder_rounds(report)))
        keys = ("target", "head", "bench", "prompts", "max_new_tokens", "repeats", "threads", "cpu_kernels")
        value = {"rows": rows, "dtype": "fp32", **{k: report[k] for k in keys}}
        record(a.record, "llama_cpp.round_cost.eagle3_decoder", value)


if __name__ == "__main__":
    main()
