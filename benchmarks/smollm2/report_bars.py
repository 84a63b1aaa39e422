"""The data rounds' bars (issues 31 and 50) on docs/results-smollm2.md, and the `engine_speedup` key they read.

- `engine_speedup.vllm_cpu`: benchmarks/vllm_cpu/run_bench.py's results.json (SmolLM2 + a head in
  vLLM's CPU build against plain vLLM, greedy, two runs per k): the best k by its measured speed-up.
- `bar_issue31`: every bar of the round, read from the page's own keys (corpus, gen_data_throughput,
  data_scaling, the per-bench rows, sweep, engine_speedup). A missed bar says by how much and what
  it would take, from a measurement: the data-scaling fit for acceptance, the measured round cost
  (tau / speed-up, in plain decoding steps) for speed.
- `bar_issue50`: the levers round's bars, from data_levers, data_scaling_equal_compute and the same
  head keys; a missed head bar adds what the best lever's measured rate would need.

Every writer of those keys (report.py, report_levers.py, report_publish.py) rewrites both sections
with `rewrite_bars`, so the bars never lag the page.
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
CARRY = "humaneval"  # the levers' carry-over bench (report_levers.py reads it from here: one direction of import)
BARS50 = {"arms": 6, "arm_tokens": 1_000_000, "equal_sizes": 4, "mt_bench_tau": 2.2, "vllm_cpu": 1.5}
BARS50_HEADING = "## Issue 50's bars (data levers, the curve at equal compute, a head past 2.2)"


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


def _adder(rows: list[dict]):
    """A bar row appender: criterion, bar, measured (None: not measured), met (None: not measured), needs."""

    def add(criterion: str, bar: str, measured, met, needs: str = "") -> None:
        rows.append({"criterion": criterion, "bar": bar, "measured": measured, "met": met, "needs": needs})

    return add


def bars31(data: dict) -> list[dict]:
    """One row per bar: criterion, bar, measured (text), met (bool or None when not measured), and what
    a missed bar would take."""
    B = BARS31
    rows: list[dict] = []
    add = _adder(rows)

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
    _head_bars(data, add, B["mt_bench_tau"])
    for dtype in ("bf16", "fp32"):
        s = (data.get("sweep") or {}).get(dtype)
        goal = B[f"sweep_{dtype}"]
        x = s and s["speedup_vs_plain"]
        need = _speed_need(s["tau"], x, goal) if x is not None and x < goal else ""
        add(f"`eval --sweep` best configuration, {dtype}, vs plain decoding", f">= {goal}x",
            None if x is None else f"{x:.2f}x ({s['best']})", None if x is None else x >= goal, need)  # fmt: skip
    _vllm_bar(data, add, B["vllm_cpu"])
    return rows


def _tau_need(data: dict, tau: float, goal: float) -> str:
    """What the published head's MT-bench tau short of `goal` would take, by the page's data-scaling lines."""
    fit = data.get("data_scaling_fit") or {}
    t = _tokens_for(fit, goal) if fit.get("tau") == "mt_bench_tau" else None
    need = f"short by {goal - tau:.3f}" + (
        f"; the data-scaling fit over every size (+{fit['fit_all']['b_per_doubling']:.3f} per doubling) puts "
        f"{goal} at ~{t / 1e6:,.0f}M distinct tokens, {t / fit['corpus_tokens']:,.0f}x this corpus"
        if t
        else ""
    )
    whole = data.get("data_scaling_whole_corpus") or {}
    w = (whole.get("tokens_for_tau") or {}).get(str(goal))
    if w:  # the measured whole corpus: the line from the largest size to it
        need += (f"; the line from the largest size to the whole corpus as the long run measured it "
                 f"(+{whole['b_per_doubling']:.3f} per doubling, in the curve's eval of "
                 f"{whole['eval']['max_new_tokens']} new tokens, where that head measures {whole['mt_bench_tau']:.3f}) "
                 f"puts it at ~{w / 1e6:,.0f}M distinct tokens, {w / whole['corpus_tokens']:,.1f}x this corpus, "
                 "and more for a bar measured on fewer new tokens" + by_position(whole))  # fmt: skip
    elif t and fit.get("measured_full", 0) > fit.get("predicted_full", math.inf):
        need += (" (the largest size measured above the smaller sizes' fit: the curve still bends upward, "
                 "so a log law overstates what it takes)")  # fmt: skip
    return need


def _head_bars(data: dict, add, goal: float, extra_need: str = "") -> None:
    """The published head's MT-bench tau against `goal` and its greedy mismatches: two bars."""
    mt = _mt_bench(data)
    tau = mt and mt["tau"]
    need = _tau_need(data, tau, goal) + extra_need if tau is not None and tau < goal else ""
    add("MT-bench (80 first turns), chain d8, greedy, fp32: tau", f">= {goal}", tau,
        None if tau is None else tau >= goal, need)  # fmt: skip
    mm = mt and mt.get("greedy_mismatches")
    add(
        "the same: greedy mismatches",
        "0",
        None if mm is None else f"{mm}/{mt['prompts']}",
        None if mm is None else mm == 0,
    )


def _vllm_bar(data: dict, add, goal: float) -> None:
    v = ((data.get("engine_speedup") or {}).get("vllm_cpu")) or None
    x = v and v["speedup_vs_plain"]
    need = _speed_need(v["tau"], x, goal) if x is not None and x < goal else ""
    add("vLLM's CPU build, best k, vs plain vLLM tok/s (greedy, identical outputs)", f">= {goal}x",
        None if x is None else f"{x:.2f}x (k={v['k']}, tau {v['tau']:.2f}, identical: {v['identical']})",
        None if x is None else (x >= goal and v["identical"]), need)  # fmt: skip


def _cell(x) -> str:
    if x is None:
        return "not measured"
    if isinstance(x, float):
        return f"{x:.3f}" if x < 10 else f"{x:,.1f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def _bars_table(heading: str, rows: list[dict]) -> list[str]:
    lines = [heading, "", "| criterion | bar | measured | met |", "|---|---|---|---|"]
    for r in rows:
        met = "not measured" if r["met"] is None else ("yes" if r["met"] else "**no**")
        lines.append(f"| {r['criterion']} | {r['bar']} | {_cell(r['measured'])} | {met} |")
    missed = [r for r in rows if r["met"] is False and r["needs"]]
    if missed:
        lines += ["", "What the missed bars would take (from the measurements on this page):", ""]
        lines += [f"- {r['criterion']}: {r['needs']}." for r in missed]
    return lines


def bars31_section(data: dict) -> list[str]:
    """The section's markdown, from the rows of `bars31`."""
    lines = _bars_table(BARS31_HEADING, bars31(data))
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


def bars50(data: dict) -> list[dict]:
    """Issue 50's bars: the levers table, the curve at equal compute, the head and where its gain carries
    over; read from the page's keys (data_levers, data_scaling_equal_compute, rows, engine_speedup)."""
    B = BARS50
    rows: list[dict] = []
    add = _adder(rows)

    arms = data.get("data_levers") or []
    full = [a for a in arms if a["new_tokens"] >= B["arm_tokens"]]
    short = [f"{a['arm']} {a['new_tokens']:,}" for a in arms if a["new_tokens"] < B["arm_tokens"]]
    steps = sorted({a["steps"] for a in arms})
    add(f"data-lever arms from the published head, >= {B['arm_tokens'] / 1e6:g}M new tokens each, one budget and eval",
        f">= {B['arms']}",
        f"{len(full)} of {len(arms)} ({' / '.join(f'{x:,}' for x in steps)} steps each"
        + (f"; {', '.join(short)} tokens in those steps)" if short else ")") if arms else None,
        len(full) >= B["arms"] if arms else None)  # fmt: skip
    mix = next((a for a in arms if a["arm"] == "mixture"), None)
    add("the best mixture, measured as an arm", "measured",
        mix and f"{mix['mt_bench_tau']:.3f} ({mix['delta_vs_baseline']:+.3f} vs the baseline)",
        None if mix is None else True)  # fmt: skip
    eq = [r for r in data.get("data_scaling_equal_compute") or [] if r.get("mt_bench_tau") is not None]
    s = data.get("data_scaling_equal_compute_settings") or {}
    budget = (s.get("budget") or {}).get("steps_per_run")
    add("sizes of the curve at one budget (equal compute), each with MT-bench tau", f">= {B['equal_sizes']}",
        f"{len(eq)} ({budget:,} steps each)" if eq else None, len(eq) >= B["equal_sizes"] if eq else None)  # fmt: skip
    pts = s.get("points") or []
    add("the target-written data's point beside that curve", ">= 1",
        "; ".join(f"`{p['data']}` {p['mt_bench_tau']:.3f}" for p in pts) or None, True if pts else None)  # fmt: skip
    best = max(arms, key=lambda a: a["tau_gain_per_million_tokens"], default=None)
    lever = ""
    if best and best["tau_gain_per_million_tokens"] > 0:  # linear in new tokens: the most a lever could give
        mt = _mt_bench(data)
        gap = B["mt_bench_tau"] - (mt["tau"] if mt else 0.0)
        m = gap / best["tau_gain_per_million_tokens"]
        lever = (f"; the best lever ({best['arm']}, {best['tau_gain_per_million_tokens']:+.3f} tau per M new tokens "
                 f"over the published head) would need ~{m:,.0f}M new tokens at that rate, "
                 f"{m * 1e6 / best['new_tokens']:,.0f}x what it trained, and its rate falls as tokens grow")  # fmt: skip
    _head_bars(data, add, B["mt_bench_tau"], lever)
    _vllm_bar(data, add, B["vllm_cpu"])
    carried = [a for a in arms if a.get(f"{CARRY}_tau") is not None]
    top = max(arms, key=lambda a: a["delta_vs_baseline"], default=None)
    said = ""
    if top is not None and f"{CARRY}_delta" in top:
        lo, hi = top[f"{CARRY}_delta_interval"]
        said = f"; the best MT-bench arm ({top['arm']}) reads {top[f'{CARRY}_delta']:+.3f} [{lo:+.3f}, {hi:+.3f}] there"
    add("every arm also measured on a public bench no corpus here holds (HumanEval, 40)", "every arm",
        f"{len(carried)} of {len(arms)}{said}" if arms else None, len(carried) == len(arms) if arms else None)  # fmt: skip
    return rows


def bars50_section(data: dict) -> list[str]:
    return [*_bars_table(BARS50_HEADING, bars50(data)), ""]


def _bars_json(rows: list[dict]) -> dict:
    return {r["criterion"]: {"bar": r["bar"], "measured": r["measured"], "met": r["met"]} for r in rows}


def bars_json(data: dict) -> dict:
    """`bar_issue31` and `bar_issue50`, for the page's JSON: each bar's measured value and whether it is met
    (None: not measured yet)."""
    return {"bar_issue31": _bars_json(bars31(data)), "bar_issue50": _bars_json(bars50(data))}


def rewrite_bars(md: str, data: dict) -> str:
    """The page with every round's bars rewritten from `data` (the newest round first)."""
    from benchmarks.smollm2.report_data import replace_section

    md = replace_section(md, bars31_section(data), "## Issue 22's bars", BARS31_HEADING)
    return replace_section(md, bars50_section(data), BARS31_HEADING, BARS50_HEADING)
