"""The data round's bars (issue 31) on docs/results-smollm2.md, and the `engine_speedup` key they read.

- `engine_speedup.vllm_cpu`: benchmarks/vllm_cpu/run_bench.py's results.json (SmolLM2 + a head in
  vLLM's CPU build against plain vLLM, greedy, two runs per k): the best k by its measured speed-up.
- `bar_issue31`: every bar of the round, read from the page's own keys (corpus, gen_data_throughput,
  data_scaling, the per-bench rows, sweep, engine_speedup). A missed bar says by how much and what
  it would take, from a measurement: the data-scaling fit for acceptance, the measured round cost
  (tau / speed-up, in plain decoding steps) for speed.

Used by report.py (`--vllm-cpu FILE`; the bars are rewritten with every partial update).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from benchmarks.smollm2.report_long_run import by_position
from eagle3cli.eval.paired import BLOCKS_ORDER

BARS31 = {
    "conversations": 12000,
    "gen_data_vs_engine_c32": 0.9,
    "gen_data_vs_hf_c32": 4.0,
    "scaling_sizes": 4,
    "mt_bench_tau": 2.2,
    "sweep_bf16": 1.3,
    "sweep_fp32": 1.2,
    "vllm_cpu": 1.3,
}
BARS31_HEADING = "## Issue 31's bars (data at engine speed, the data-scaling curve, a head that pays)"


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def vllm_engine_json(results: Path) -> dict:
    """`engine_speedup.vllm_cpu` from run_bench.py's results.json: per k the speed-up of each run
    (speculative tok/s over plain tok/s, measured in the same eval), their geometric mean, engine tau,
    eval's own chain tau and greedy equality; the best k is the highest mean speed-up."""
    try:
        r = json.loads(results.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{results} is not JSON ({e}): expected benchmarks/vllm_cpu/run_bench.py's results.json"
        ) from e
    engine = (r.get("engine") if isinstance(r, dict) else None) or {}
    if not engine:
        raise ValueError(f"{results} has no `engine` rows: run benchmarks/vllm_cpu/run_bench.py with --head")
    rows = []
    for key, runs in engine.items():
        dtype, k = key.split("-k")
        rows.append(
            {
                "dtype": dtype,
                "k": int(k),
                "tau": runs[0]["tau"],
                "eval_tau": (r.get("eval") or {}).get(key, {}).get("tau"),
                "speedup_runs": [round(x["tok_s"] / x["plain_tok_s"], 4) for x in runs],
                "speedup_intervals": [x.get("speedup_interval") for x in runs],
                "order": runs[0].get("order") or BLOCKS_ORDER,
                "speedup_vs_plain": round(_geomean([x["tok_s"] / x["plain_tok_s"] for x in runs]), 4),
                "tok_s": [round(x["tok_s"], 2) for x in runs],
                "plain_tok_s": [round(x["plain_tok_s"], 2) for x in runs],
                "identical": all(x["outputs_differ"] == 0 for x in runs),
                "outputs_differ": [x["outputs_differ"] for x in runs],
            }
        )
    best = max(rows, key=lambda x: x["speedup_vs_plain"])
    when = r.get("measured_at") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(results.stat().st_mtime))
    return {
        **{k: best[k] for k in ("k", "dtype", "tau", "speedup_vs_plain", "identical")},
        "rows": rows,
        "settings": {k: r.get(k) for k in ("target", "head", "bench", "num_prompts", "max_new_tokens")},
        "measured_at": when,
        "commands": r.get("commands"),
    }


def _mt_bench(data: dict) -> dict | None:
    return next((r for r in data.get("rows") or [] if r.get("eval") == "mt_bench"), None)


def _tokens_for(fit: dict, tau: float) -> float | None:
    """Distinct tokens at which the all-size fit tau = a + b log2(tokens) reaches `tau`."""
    f = fit.get("fit_all") or {}
    if not f.get("b_per_doubling") or f["b_per_doubling"] <= 0:
        return None
    return 2 ** ((tau - f["a"]) / f["b_per_doubling"])


def _speed_need(tau: float, speedup: float, goal: float) -> str:
    """speed-up = tau / round cost (plain steps), so at the measured round cost the goal needs this tau."""
    round_cost = tau / speedup
    return f"at its measured round cost ({round_cost:.2f} plain steps) {goal}x needs tau {goal * round_cost:.2f}"


def bars31(data: dict) -> list[dict]:
    """One row per bar: criterion, bar, measured (text), met (bool or None when not measured), and what
    a missed bar would take."""
    B = BARS31
    rows: list[dict] = []

    def add(criterion: str, bar: str, measured, met, needs: str = "") -> None:
        rows.append({"criterion": criterion, "bar": bar, "measured": measured, "met": met, "needs": needs})

    corpus = data.get("corpus") or {}
    n = corpus.get("conversations")
    add(
        "regenerated conversations in the corpus",
        f">= {B['conversations']:,}",
        n,
        None if n is None else n >= B["conversations"],
    )
    c32 = next((r for r in data.get("gen_data_throughput") or [] if r["concurrency"] == 32), None)
    for key, field, what in (("gen_data_vs_engine_c32", "gen_data_vs_engine", "the engine's own tok/s"),
                             ("gen_data_vs_hf_c32", "gen_data_vs_hf", "the hf backend")):  # fmt: skip
        x = c32 and c32.get(field)
        add(f"gen-data at concurrency 32 / {what}", f">= {B[key]}x", x, None if x is None else x >= B[key])
    sizes = data.get("data_scaling") or []
    fit = data.get("data_scaling_fit") or {}
    evaluated = [r for r in sizes if r.get("mt_bench_tau") is not None]
    add("data-scaling sizes with MT-bench tau, fit tested", f">= {B['scaling_sizes']}", len(evaluated),
        len(evaluated) >= B["scaling_sizes"] and fit.get("measured_full") is not None)  # fmt: skip
    mt = _mt_bench(data)
    tau = mt and mt["tau"]
    need = ""
    if tau is not None and tau < B["mt_bench_tau"]:
        t = _tokens_for(fit, B["mt_bench_tau"]) if fit.get("tau") == "mt_bench_tau" else None
        need = f"short by {B['mt_bench_tau'] - tau:.3f}" + (
            f"; the data-scaling fit over every size (+{fit['fit_all']['b_per_doubling']:.3f} per doubling) puts "
            f"{B['mt_bench_tau']} at ~{t / 1e6:,.0f}M distinct tokens, {t / fit['corpus_tokens']:,.0f}x this corpus"
            if t
            else ""
        )
        whole = data.get("data_scaling_whole_corpus") or {}
        w = (whole.get("tokens_for_tau") or {}).get(str(B["mt_bench_tau"]))
        if w:  # the measured whole corpus: the line from the largest size to it
            need += (f"; the line from the largest size to the whole corpus as the long run measured it "
                     f"(+{whole['b_per_doubling']:.3f} per doubling, in the curve's eval of "
                     f"{whole['eval']['max_new_tokens']} new tokens, where that head measures {whole['mt_bench_tau']:.3f}) "
                     f"puts it at ~{w / 1e6:,.0f}M distinct tokens, {w / whole['corpus_tokens']:,.1f}x this corpus, "
                     "and more for a bar measured on fewer new tokens" + by_position(whole))  # fmt: skip
        elif t and fit.get("measured_full", 0) > fit.get("predicted_full", math.inf):
            need += (" (the largest size measured above the smaller sizes' fit: the curve still bends upward, "
                     "so a log law overstates what it takes)")  # fmt: skip
    add("MT-bench (80 first turns), chain d8, greedy, fp32: tau", f">= {B['mt_bench_tau']}", tau,
        None if tau is None else tau >= B["mt_bench_tau"], need)  # fmt: skip
    mm = mt and mt.get("greedy_mismatches")
    add(
        "the same: greedy mismatches",
        "0",
        None if mm is None else f"{mm}/{mt['prompts']}",
        None if mm is None else mm == 0,
    )
    for dtype in ("bf16", "fp32"):
        s = (data.get("sweep") or {}).get(dtype)
        goal = B[f"sweep_{dtype}"]
        x = s and s["speedup_vs_plain"]
        need = _speed_need(s["tau"], x, goal) if x is not None and x < goal else ""
        add(f"`eval --sweep` best configuration, {dtype}, vs plain decoding", f">= {goal}x",
            None if x is None else f"{x:.2f}x ({s['best']})", None if x is None else x >= goal, need)  # fmt: skip
    v = ((data.get("engine_speedup") or {}).get("vllm_cpu")) or None
    x = v and v["speedup_vs_plain"]
    need = _speed_need(v["tau"], x, B["vllm_cpu"]) if x is not None and x < B["vllm_cpu"] else ""
    add("vLLM's CPU build, best k, vs plain vLLM tok/s (greedy, identical outputs)", f">= {B['vllm_cpu']}x",
        None if x is None else f"{x:.2f}x (k={v['k']}, tau {v['tau']:.2f}, identical: {v['identical']})",
        None if x is None else (x >= B["vllm_cpu"] and v["identical"]), need)  # fmt: skip
    return rows


def _cell(x) -> str:
    if x is None:
        return "not measured"
    if isinstance(x, float):
        return f"{x:.3f}" if x < 10 else f"{x:,.1f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def bars31_section(data: dict) -> list[str]:
    """The section's markdown, from the rows of `bars31`."""
    rows = bars31(data)
    lines = [BARS31_HEADING, "", "| criterion | bar | measured | met |", "|---|---|---|---|"]
    for r in rows:
        met = "not measured" if r["met"] is None else ("yes" if r["met"] else "**no**")
        lines.append(f"| {r['criterion']} | {r['bar']} | {_cell(r['measured'])} | {met} |")
    missed = [r for r in rows if r["met"] is False and r["needs"]]
    if missed:
        lines += ["", "What the missed bars would take (from the measurements on this page):", ""]
        lines += [f"- {r['criterion']}: {r['needs']}." for r in missed]
    v = (data.get("engine_speedup") or {}).get("vllm_cpu")
    if v:
        s = v["settings"]
        lines += [
            "",
            f"vLLM's CPU build (`benchmarks/vllm_cpu/run_bench.py`, head `{s.get('head')}`, {s.get('num_prompts')} "
            f"{s.get('bench')} prompts, {s.get('max_new_tokens')} tokens, greedy, two runs per k against a plain "
            f"vLLM server on the same prompts, {v['rows'][0].get('order') or 'in blocks'}; speed-up is the "
            f"geometric mean of the two runs, [90% interval over prompts] per run where measured; measured "
            f"{v.get('measured_at')}):",
            "",
            "| k | dtype | engine tau | eval tau | speed-up (runs) | identical outputs |",
            "|---|---|---|---|---|---|",
        ]
        for r in v["rows"]:
            et = "-" if r["eval_tau"] is None else f"{r['eval_tau']:.3f}"
            runs = " / ".join(
                f"{x:.2f}" + (f" [{iv[0]:.2f}, {iv[1]:.2f}]" if iv else "")
                for x, iv in zip(r["speedup_runs"], r.get("speedup_intervals") or [None] * len(r["speedup_runs"]))
            )
            lines.append(f"| {r['k']} | {r['dtype']} | {r['tau']:.3f} | {et} | {r['speedup_vs_plain']:.2f}x ({runs}) | "
                         f"{r['identical']} |")  # fmt: skip
    lines.append("")
    return lines


def bars31_json(data: dict) -> dict:
    """`bar_issue31`: each bar's measured value and whether it is met (None: not measured yet)."""
    return {r["criterion"]: {"bar": r["bar"], "measured": r["measured"], "met": r["met"]} for r in bars31(data)}
