"""`eagle3 eval`: real speculative decoding with one or more heads on a benchmark; acceptance by
depth, tau, wall-clock speedup over plain decoding, losslessness, a recommended serving config."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ..config import config_dict
from ..console import log, print_table, progress, warn
from ..errors import UsageError
from ..lock import locked_stage
from ..manifest import atomic_write_json, read_json, write_manifest
from .config import EvalConfig
from .decoder import DecodeResult, SpeculativeDecoder, eos_ids_of, hf_generate, plain_decode
from .metrics import acceptance_by_depth, fit_linear, recommend
from .prompts import load_prompts, render

TAU_NOTE = "tau = tokens emitted per target verification pass (accepted draft tokens + the bonus token)"


def _paths(cfg: EvalConfig) -> tuple[Path | None, Path]:
    head = cfg.head or (cfg.run / "head" if cfg.run else None)
    out = cfg.out or (cfg.run / "eval" if cfg.run else (head.parent / "eval" if head else Path("eval")))
    return head, out


def _head_config(head: Path) -> dict:
    p = Path(head) / "config.json"
    if not p.exists():
        raise UsageError(
            f"{p} does not exist",
            "an exported head folder (config.json + model.safetensors)",
            "eagle3 train --run runs/NAME   (exports runs/NAME/head)",
        )
    return read_json(p)


def _target_path(cfg: EvalConfig, head_cfg: dict | None) -> str:
    if cfg.target:
        return cfg.target
    recorded = ((head_cfg or {}).get("eagle3") or {}).get("target", {}).get("path")
    if not recorded:
        raise UsageError(
            "no --target given and the head records none",
            "--target MODEL_DIR",
            "eagle3 eval --target models/tiny-target --head runs/NAME/head",
        )
    return recorded


def check_head_fits(head: Path, head_cfg: dict, target_cfg) -> tuple[int, ...]:
    """The head's aux layer ids, after refusing a head made for another target."""
    problems = []
    if int(head_cfg.get("vocab_size", -1)) != target_cfg.vocab_size:
        problems.append(f"vocab_size: head {head_cfg.get('vocab_size')}, target {target_cfg.vocab_size}")
    th = head_cfg.get("target_hidden_size", head_cfg.get("hidden_size"))
    if int(th or -1) != target_cfg.hidden_size:
        problems.append(f"hidden size: head expects {th}, target has {target_cfg.hidden_size}")
    aux = (head_cfg.get("eagle3") or {}).get("aux_layer_ids") or head_cfg.get("eagle_aux_hidden_state_layer_ids") or []
    bad = [i for i in aux if not 0 <= int(i) < target_cfg.num_hidden_layers]
    if bad:
        problems.append(f"aux layer ids {bad} do not exist in a {target_cfg.num_hidden_layers}-layer target")
    recorded = (head_cfg.get("eagle3") or {}).get("target") or {}
    if recorded.get("num_hidden_layers") not in (None, target_cfg.num_hidden_layers):
        problems.append(
            f"layers: head trained on a {recorded['num_hidden_layers']}-layer target, "
            f"this one has {target_cfg.num_hidden_layers}"
        )
    if problems:
        raise UsageError(
            f"head {head} does not fit the target:\n  " + "\n  ".join(problems),
            "the target model the head was trained for",
            "pass --target with the model named in the head's config.json (eagle3.target.path)",
        )
    return tuple(int(i) for i in aux)


def _load_heads(cfg: EvalConfig, head: Path, target, ident) -> list[tuple[str, object, tuple[int, ...]]]:
    from ..model.export import load_head

    heads = []
    for h in [head, *cfg.compare]:
        h = Path(h)
        hc = _head_config(h)
        aux = check_head_fits(h, hc, target.config)
        rec = (hc.get("eagle3") or {}).get("target") or {}
        if rec.get("vocab_hash") and rec["vocab_hash"] != ident.vocab_hash:
            raise UsageError(
                f"head {h} was trained with another tokenizer (vocab hash differs)",
                "the target the head was trained for",
                "check --target",
            )
        if rec.get("chat_template_hash") and rec["chat_template_hash"] != ident.chat_template_hash:
            warn(
                f"head {h} was trained on conversations rendered with another chat template "
                f"({rec['chat_template_hash'][:12]}, this target's is {ident.chat_template_hash[:12]}): "
                "prompts here are rendered differently and acceptance may suffer"
            )
        if rec.get("fingerprint") and rec["fingerprint"] != ident.fingerprint:
            warn(
                f"head {h} records target weights {rec['fingerprint'][:12]}, this target is "
                f"{ident.fingerprint[:12]}: acceptance may suffer"
            )
        draft = load_head(h, target_model=target).to(target.device)
        label = str(h.parent.name + "/" + h.name) if h.parent.name else str(h)
        if any(label == lab for lab, _, _ in heads):
            label = str(h)
        heads.append((label, draft, aux))
    return heads


def _summ(results: list[DecodeResult]) -> dict:
    toks = sum(len(r.tokens) for r in results)
    secs = sum(r.seconds for r in results)
    return {
        "tokens": toks,
        "seconds": round(secs, 4),
        "tokens_per_s": toks / secs if secs else 0.0,
        "target_calls": sum(r.target_calls for r in results),
        "draft_calls": sum(r.draft_calls for r in results),
    }


@torch.inference_mode()
def measure_costs(target, draft, aux, prompt: list[int], depth: int, topk: int, repeats: int = 11) -> dict:
    """Seconds per target pass over n new tokens (after the prompt) and per draft call.

    Sizes are measured round-robin and the minimum kept (the intrinsic cost; other processes
    only ever add time), then made non-decreasing in n.
    """
    from transformers import DynamicCache

    from ..model.draft import DraftCache

    dev = target.device
    cache = DynamicCache(config=target.config)
    target.model(input_ids=torch.tensor([prompt], device=dev), cache=cache, use_cache=True)
    base = len(prompt)
    sizes = sorted({1, 2, 4, 8, depth + 1, 16, 32, 64})
    best = {n: float("inf") for n in sizes}
    for _ in range(repeats):
        for n in sizes:
            ids = torch.randint(0, target.config.vocab_size, (1, n), device=dev)
            t0 = time.perf_counter()
            out = target.model(input_ids=ids, cache=cache, use_cache=True).last_hidden_state
            target.lm_head(out)
            best[n] = min(best[n], time.perf_counter() - t0)
            cache.crop(-n)
    costs, running = {}, 0.0
    for n in sizes:
        running = max(running, best[n])
        costs[n] = running
    dc = DraftCache()
    hid = torch.zeros(1, base, len(aux) * target.config.hidden_size, device=dev, dtype=next(draft.parameters()).dtype)
    draft(torch.tensor([prompt], device=dev), hid, torch.arange(base, device=dev)[None], dc, from_target=True)
    dc.commit()
    h = torch.zeros(1, 1, draft.config.hidden_size, device=dev, dtype=hid.dtype)
    draft_best = float("inf")
    for i in range(repeats * 2):
        t0 = time.perf_counter()
        out = draft(torch.tensor([[5]], device=dev), h, torch.tensor([[base + i]], device=dev), dc, from_target=False)
        draft.logits(out).argmax(-1)
        draft_best = min(draft_best, time.perf_counter() - t0)
        dc.crop(dc.committed)
    intercept, slope = fit_linear(list(costs), list(costs.values()))
    return {"target": costs, "draft_step": draft_best, "target_fit": {"per_call_s": intercept, "per_token_s": slope}}


def _plot(path: Path, per_head: dict, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, modes in per_head.items():
        st = modes.get("chain")
        if not st:
            continue
        rows = st["acceptance"]["per_depth"]
        ks = [r["depth"] for r in rows]
        line = a1.plot(
            ks,
            [r["alpha"] if r["alpha"] is not None else float("nan") for r in rows],
            "o-",
            label=f"{label} alpha_k (conditional)",
        )
        a1.plot(
            ks,
            [r["unconditional"] for r in rows],
            "s--",
            color=line[0].get_color(),
            alpha=0.6,
            label=f"{label} P(first k accepted)",
        )
        taus = st["acceptance"]["tau_by_depth"]
        a1.set_xticks(ks)
        a2.set_xticks(range(len(taus)))
        a2.plot(range(len(taus)), taus, "o-", color=line[0].get_color(), label=f"{label} chain tau(d)")
        if modes.get("tree"):
            a2.axhline(modes["tree"]["acceptance"]["tau"], color=line[0].get_color(), ls=":", label=f"{label} tree tau")
    a1.set(xlabel="draft depth k", ylabel="acceptance", ylim=(0, 1.02), title="Acceptance by depth")
    a2.set(xlabel="draft depth d", ylabel="tau (tokens / target pass, bonus incl.)", title="tau by depth")
    for a in (a1, a2):
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


@locked_stage("eval", lambda cfg: _paths(cfg)[1])
def run_eval(cfg: EvalConfig) -> Path:
    if cfg.endpoint:
        from .endpoint import run_endpoint_eval

        return run_endpoint_eval(cfg)
    from ..model.target import load_target, target_identity

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    head, out = _paths(cfg)
    head_cfg = _head_config(head)
    target, tok, tpath = load_target(_target_path(cfg, head_cfg), device=cfg.device)
    ident = target_identity(tpath, tok, target.config)
    heads = _load_heads(cfg, head, target, ident)
    eos = eos_ids_of(target, tok)
    ctx = int(getattr(target.config, "max_position_embeddings", 0) or 0)
    prompts = []
    for pid, msgs in load_prompts(cfg.bench, cfg.num_prompts):
        ids = render(tok, msgs)
        need = len(ids) + cfg.max_new_tokens + max(cfg.depth, cfg.num_draft_tokens) + 1
        if ctx and need > ctx:
            raise UsageError(
                f"prompt {pid} has {len(ids)} tokens; with --max-new-tokens {cfg.max_new_tokens} and "
                f"the draft window it needs {need} positions, the target has {ctx}",
                "prompts + new tokens within the target's context",
                "lower --max-new-tokens or use shorter prompts",
            )
        prompts.append((pid, ids))
    modes = ["chain", "tree"] if cfg.mode == "both" else [cfg.mode]
    greedy = cfg.temperature <= 0

    def decoder(draft, aux, mode):
        return SpeculativeDecoder(
            target,
            draft,
            aux,
            mode=mode,
            depth=cfg.depth,
            topk=cfg.topk,
            num_draft_tokens=cfg.num_draft_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            eos=eos,
        )

    decoders = {(label, m): decoder(d, aux, m) for label, d, aux in heads for m in modes}
    # warm-up: first calls allocate and pick kernels; keep them out of the timings
    wp = prompts[0][1]
    plain_decode(target, wp, 8, set(), cfg.temperature)
    for dec in decoders.values():
        dec.generate(wp, 8, seed=cfg.seed)
    pad = tok.pad_token_id if tok.pad_token_id is not None else next(iter(eos), 0)
    plain, gen, spec = [], [], {k: [] for k in decoders}
    mismatches = {k: [] for k in decoders}
    total_runs = len(prompts)
    log(
        f"eval: {len(prompts)} prompts from {cfg.bench}, {len(heads)} head(s), mode {cfg.mode}, depth {cfg.depth}, "
        f"max {cfg.max_new_tokens} new tokens, temperature {cfg.temperature}"
    )
    with progress("eval", total=total_runs, unit="prompt") as bar:
        for i, (pid, ids) in enumerate(prompts):
            p = plain_decode(
                target,
                ids,
                cfg.max_new_tokens,
                eos,
                cfg.temperature,
                cfg.top_p,
                torch.Generator().manual_seed(cfg.seed + i),
            )
            plain.append(p)
            if cfg.generate_baseline:
                g = hf_generate(target, ids, cfg.max_new_tokens, eos, pad)
                gen.append(g)
                if greedy and g.tokens != p.tokens:
                    warn(f"{pid}: our plain loop and transformers generate differ (numerics of the two paths)")
            n_tok = len(p.tokens)
            for key, dec in decoders.items():
                r = dec.generate(ids, cfg.max_new_tokens, seed=cfg.seed + i)
                spec[key].append(r)
                n_tok += len(r.tokens)
                if greedy and r.tokens != p.tokens:
                    at = next(
                        (j for j, (a, b) in enumerate(zip(r.tokens, p.tokens)) if a != b),
                        min(len(r.tokens), len(p.tokens)),
                    )
                    mismatches[key].append(
                        {
                            "prompt": pid,
                            "first_diff_at": at,
                            "speculative": tok.decode(r.tokens[at : at + 12]),
                            "plain": tok.decode(p.tokens[at : at + 12]),
                        }
                    )
            bar.advance(1, tokens=n_tok)

    costs = measure_costs(target, heads[0][1], heads[0][2], prompts[0][1], cfg.depth, cfg.topk)
    plain_s = _summ(plain)
    gen_s = _summ(gen) if gen else None
    per_head: dict[str, dict] = {}
    for (label, mode), results in spec.items():
        acc = acceptance_by_depth([a for r in results for a in r.accept_lens], cfg.depth)
        s = _summ(results)
        per_head.setdefault(label, {})[mode] = {
            "acceptance": acc,
            "speed": s,
            "speedup_vs_plain": s["tokens_per_s"] / plain_s["tokens_per_s"],
            "speedup_vs_generate": s["tokens_per_s"] / gen_s["tokens_per_s"] if gen_s else None,
            "lossless": (
                {
                    "compared": len(results),
                    "mismatches": len(mismatches[(label, mode)]),
                    "examples": mismatches[(label, mode)][:5],
                }
                if greedy
                else {
                    "compared": 0,
                    "note": "sampling: outputs are compared in distribution (tests), not token for token",
                }
            ),
        }
    main_label = heads[0][0]
    main = per_head[main_label]
    tree_cfg = (
        {
            "tau": main["tree"]["acceptance"]["tau"],
            "steps": cfg.depth,
            "topk": cfg.topk,
            "num_draft_tokens": cfg.num_draft_tokens,
        }
        if "tree" in main
        else None
    )
    chain_taus = main["chain"]["acceptance"]["tau_by_depth"] if "chain" in main else [1.0]
    rec = recommend(chain_taus, costs, tree_cfg)
    report = {
        "bench": cfg.bench,
        "num_prompts": len(prompts),
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "depth": cfg.depth,
        "mode": cfg.mode,
        "tree": {"topk": cfg.topk, "num_draft_tokens": cfg.num_draft_tokens},
        "tau_definition": TAU_NOTE,
        "alpha_definition": "alpha_k = P(draft token k accepted | tokens 1..k-1 accepted), from chain rounds",
        "target": ident.as_dict(),
        "heads": per_head,
        "baselines": {"plain": plain_s, "generate": gen_s},
        "cost_model": {
            "target_pass_s": {str(k): v for k, v in costs["target"].items()},
            "draft_step_s": costs["draft_step"],
            "target_fit": costs["target_fit"],
        },
        "recommended": rec,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").unlink(missing_ok=True)
    _plot(out / "acceptance.png", per_head, f"{cfg.bench}, {len(prompts)} prompts, T={cfg.temperature}")
    atomic_write_json(out / "report.json", report)
    _print(report, cfg)
    write_manifest(
        out,
        "eval",
        config=config_dict(cfg),
        target=ident.as_dict(),
        heads=[str(h) for h in [head, *cfg.compare]],
        counts={"prompts": len(prompts), "plain_tokens": plain_s["tokens"]},
        files=["report.json", "acceptance.png"],
    )
    log(f"eval: wrote {out / 'report.json'} and {out / 'acceptance.png'}")
    return out


def _print(report: dict, cfg: EvalConfig) -> None:
    for label, modes in report["heads"].items():
        if "chain" in modes:
            rows = [
                [
                    r["depth"],
                    f"{r['accepted']}/{r['attempts']}",
                    "-" if r["alpha"] is None else f"{r['alpha']:.3f}",
                    f"{r['unconditional']:.3f}",
                    f"{r['tau_at_depth']:.3f}",
                ]
                for r in modes["chain"]["acceptance"]["per_depth"]
            ]
            print_table(
                f"{label}: acceptance by depth (chain, {cfg.bench}); {TAU_NOTE}",
                ["depth k", "accepted/attempts", "alpha_k (cond.)", "P(first k acc.)", "tau(k)"],
                rows,
            )
    base = report["baselines"]
    rows = [["plain loop", "1.000", f"{base['plain']['tokens_per_s']:.1f}", "1.00x", "-", "-"]]
    if base["generate"]:
        rows.append(
            [
                "transformers generate",
                "1.000",
                f"{base['generate']['tokens_per_s']:.1f}",
                f"{base['generate']['tokens_per_s'] / base['plain']['tokens_per_s']:.2f}x",
                "1.00x",
                "-",
            ]
        )
    for label, modes in report["heads"].items():
        for mode, st in modes.items():
            ll = st["lossless"]
            rows.append(
                [
                    f"{label} {mode}",
                    f"{st['acceptance']['tau']:.3f}",
                    f"{st['speed']['tokens_per_s']:.1f}",
                    f"{st['speedup_vs_plain']:.2f}x",
                    f"{st['speedup_vs_generate']:.2f}x" if st["speedup_vs_generate"] else "-",
                    f"{ll['mismatches']}/{ll['compared']}" if ll["compared"] else "n/a (sampling)",
                ]
            )
    print_table(
        "speed (wall clock, same run)",
        ["decoder", "tau", "tok/s", "vs plain", "vs generate", "greedy mismatches"],
        rows,
    )
    r = report["recommended"]
    log(
        f"recommended for serve: steps={r['steps']} topk={r['topk']} num_draft_tokens={r['num_draft_tokens']} "
        f"(predicted {r['predicted_speedup']}x, {r['from']})"
    )
