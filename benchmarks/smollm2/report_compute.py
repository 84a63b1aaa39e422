"""The acceptance-per-compute part of docs/results-smollm2.{md,json} (issue 22): the bars, the
learning curve of the published run, the one-core-hour comparison with the recipe as it was, and
`eval --sweep` in fp32 and bf16. Pure reading of run folders, like report.py, which calls it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from benchmarks.smollm2.report_figures import LEARNING_CURVE, SWEEP, figure_line

BARS = {"mt_bench_tau": 2.5, "sweep_fp32": 1.1, "sweep_bf16": 1.5, "one_core_hour_ratio": 1.3}


def _lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().split("\n") if x.strip()]


def heldout_curve(run: Path) -> list[dict]:
    """The held-out points of RUN/train/metrics.jsonl: chain tau at depth 8 on conversations the
    run never trains on, against tokens, steps and seconds of training (wall and CPU)."""
    return [
        {
            "tokens": m["tokens_seen"],
            "steps": m["step"],
            "seconds": m.get("train_seconds"),
            "cpu_seconds": m.get("train_cpu_seconds"),
            "heldout_tau": m["heldout_tau"],
            "heldout_alpha_k": m.get("heldout_alpha_k"),
        }
        for m in _lines(run / "train" / "metrics.jsonl")
        if "heldout_tau" in m
    ]


def projection(curve: list[dict], goal: float) -> dict | None:
    """A straight line of tau against log2(tokens) through the second half of the curve, and the
    tokens at which it would reach `goal`. An extrapolation: real curves flatten, so read it as
    a lower bound on the data and compute a goal needs."""
    pts = [(math.log2(p["tokens"]), p["heldout_tau"]) for p in curve if p["tokens"] > 0]
    pts = pts[len(pts) // 2 :]
    if len(pts) < 3:
        return None
    n = len(pts)
    mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else 0.0
    out = {"tau_per_doubling_of_tokens": round(slope, 4), "fit_points": n, "goal_tau": goal}
    if slope > 0:
        last = curve[-1]
        need = 2 ** (mx + (goal - my) / slope)
        out["tokens_for_goal"] = round(need)
        if last.get("cpu_seconds"):  # at this run's training rate
            out["cpu_hours_for_goal"] = round(need / last["tokens"] * last["cpu_seconds"] / 3600, 1)
    return out


def eval_projection(points: list[dict], goal: float) -> dict | None:
    """The same straight line in log2(tokens), through MT-bench eval tau of heads trained on
    different numbers of tokens (points: [{run, tokens, cpu_seconds, tau}]): what the bar is set
    on, where the held-out tau runs ahead of it by a factor that grows with training."""
    pts = sorted((p for p in points if p.get("tokens") and p.get("tau")), key=lambda p: p["tokens"])
    if len(pts) < 2 or pts[0]["tokens"] == pts[-1]["tokens"]:
        return None
    xs, ys = [math.log2(p["tokens"]) for p in pts], [p["tau"] for p in pts]
    n = len(pts)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    out = {"points": pts, "tau_per_doubling_of_tokens": round(slope, 4), "goal_tau": goal}
    if slope > 0:
        last = pts[-1]
        need = 2 ** (mx + (goal - my) / slope)
        out["tokens_for_goal"] = round(need)
        if last.get("cpu_seconds"):
            out["cpu_hours_for_goal"] = round(need / last["tokens"] * last["cpu_seconds"] / 3600, 1)
    return out


def _mt_bench_points(runs: dict[str, Path], reports: dict) -> list[dict]:
    """[{run, tokens, cpu_seconds, tau}] of each run's head on MT-bench (chain, depth 8, fp32)."""
    out = []
    for name, run in runs.items():
        heads, curve = (reports.get(name) or {}).get("heads") or {}, heldout_curve(run)
        head = next(iter(heads.values()), {})
        if curve and "chain" in head:
            last = curve[-1]
            out.append(
                {
                    "run": run.name,
                    "tokens": last["tokens"],
                    "cpu_seconds": last["cpu_seconds"],
                    "heldout_tau": last["heldout_tau"],
                    "tau": round(head["chain"]["acceptance"]["tau"], 4),
                }
            )
    return out


def one_core_hour(out: Path, hour: Path) -> dict | None:
    """The chosen recipe (the published run, OUT/train) against the recipe before issue 22
    (benchmarks/smollm2/recipes.py's baseline row in HOUR), the same CPU budget and cache."""
    rows = (json.loads((hour / "recipes.json").read_text()) if (hour / "recipes.json").exists() else {}).get("rows", {})
    before, chosen = rows.get("baseline"), heldout_curve(out)
    manifest = out / "train" / "manifest.json"
    if not before or not chosen or not manifest.exists():
        return None
    cfg = json.loads(manifest.read_text()).get("config", {})
    last = chosen[-1]
    return {
        "budget_cpu_s": cfg.get("time_budget_s"),
        "chosen": {"heldout_tau": last["heldout_tau"], "steps": last["steps"], "tokens": last["tokens"]},
        "before": {k: before[k] for k in ("heldout_tau", "steps", "tokens", "what")},
        "ratio": round(last["heldout_tau"] / before["heldout_tau"], 3),
    }


def sweep_summary(report: dict | None) -> dict | None:
    """The fastest measured configuration of an eval's --sweep and what it recommended."""
    sw = (report or {}).get("sweep")
    if not sw:
        return None
    best = max(sw["configurations"], key=lambda r: r["speedup"])
    return {
        "best": best["name"],
        "speedup_vs_plain": best["speedup"],
        "speedup_interval": best["speedup_interval"],
        "tau": best["tau"],
        "greedy_mismatches": best["greedy_mismatches"],
        "recommended": sw["recommended"],
        "prompts": len(sw["prompts"]),
        "max_new_tokens": sw["max_new_tokens"],
        "dtype": report.get("dtype") or (report.get("target") or {}).get("dtype"),
        "configurations": {r["name"]: {"tau": r["tau"], "speedup": r["speedup"]} for r in sw["configurations"]},
        "kernels": report.get("kernels", "torch (F.linear)"),  # reports before --cpu-kernels ran F.linear
        "plain_tokens_per_s": sw.get("plain_tokens_per_s"),
    }


def needs(summary: dict, goal: float) -> str:
    """Why a sweep misses `goal`: speedup = tau / round cost (the round in plain decoding steps),
    so at each configuration's measured round cost the goal needs tau >= goal x round."""
    parts = []
    for name, c in summary["configurations"].items():
        if c["speedup"] > 0 and name.startswith("chain d=") and int(name.split("=")[1]) <= 3:
            round_cost = c["tau"] / c["speedup"]
            parts.append(
                f"{name} tau {c['tau']:.2f} at a round of {round_cost:.2f} plain steps needs tau {goal * round_cost:.2f}"
            )
    return "; ".join(parts) + (
        ". A configuration's speedup is its tau divided by its round's cost in plain decoding steps, so the "
        "bar is an acceptance bar: no cheaper kernel brings a round below one plain step."
    )


def _fx(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def sections(
    out: Path, hour: Path, reports: dict, rows: list[dict], published: Path | None = None
) -> tuple[list[str], dict]:
    """Markdown lines and JSON keys: bars, learning curve (of PUBLISHED, the run whose head the
    evals measure; default OUT), one core-hour (OUT against HOUR), sweep."""
    published = published or out
    curve = heldout_curve(published)
    proj = projection(curve, BARS["mt_bench_tau"])
    runs = {"mt_bench": published} | ({"ttt_k_mt_bench": out} if published != out else {})
    eval_proj = eval_projection(_mt_bench_points(runs, reports), BARS["mt_bench_tau"])
    hour_row = one_core_hour(out, hour)
    sweep = {"fp32": sweep_summary(reports.get("mt_bench")), "bf16": sweep_summary(reports.get("mt_bench_bf16"))}
    mt = next((r for r in rows if r["eval"] == "mt_bench" and r["decoder"] == "chain"), None)
    lines = bars22_lines(mt, sweep, hour_row)
    if curve:
        about = (
            f"Held-out chain tau at depth 8 (the TTT unroll walked like a chain decoder, on {published.name}'s "
            f"held-out\nconversations), every {_every(published)} steps; the figure plots it against tokens and "
            f"CPU time. Budget: {_budget(published)}."
        )
        lines += curve_lines(curve, about, proj, eval_proj)
    lines += hour_lines(hour_row) + sweep_lines(sweep)
    return lines, issue22_json(curve, proj, eval_proj, hour_row, sweep, mt)


def bars22_lines(mt: dict | None, sweep: dict, hour_row: dict | None) -> list[str]:
    """Issue 22's bar table: MT-bench tau of the published head (MT, its chain row), the sweeps, one core-hour."""

    def met(ok) -> str:
        return "yes" if ok else "**no**"

    tau = mt and mt["tau"]
    bar = [
        [
            f"MT-bench ({mt['prompts'] if mt else 80} first turns), chain d8, greedy, fp32: tau",
            f">= {BARS['mt_bench_tau']}",
            "-" if tau is None else f"{tau:.3f}",
            met(tau and tau >= BARS["mt_bench_tau"]),
        ],
        [
            "the same: greedy mismatches",
            "0",
            "-" if not mt else f"{mt['greedy_mismatches']}/{mt['prompts']}",
            met(mt and mt["greedy_mismatches"] == 0),
        ],
    ]
    for dt in ("fp32", "bf16"):
        s, goal = sweep[dt], BARS[f"sweep_{dt}"]
        bar.append(
            [
                f"`eval --sweep` best configuration, {dt}, vs plain decoding",
                f">= {goal}x",
                "-" if not s else f"{_fx(s['speedup_vs_plain'])} ({s['best']})",
                met(s and s["speedup_vs_plain"] >= goal),
            ]
        )
    bar.append(
        [
            "held-out tau at one core-hour, chosen recipe / recipe before",
            f">= {BARS['one_core_hour_ratio']}x",
            "-" if not hour_row else _fx(hour_row["ratio"]),
            met(hour_row and hour_row["ratio"] >= BARS["one_core_hour_ratio"]),
        ]
    )
    lines = ["## Issue 22's bars (acceptance per unit of compute)", ""]
    lines += md_table(["criterion", "bar", "measured", "met"], bar)

    return lines


def curve_lines(curve: list[dict], about: str, proj: dict | None, eval_proj: dict | None) -> list[str]:
    """The learning-curve section: ABOUT (what the points are), a table of them, the projections."""
    lines: list[str] = []
    if curve:
        last = curve[-1]
        lines += [
            "",
            "## Learning curve of the published head",
            "",
            figure_line(LEARNING_CURVE),
            "",
            about,
            "",
        ]
        step = max(1, len(curve) // 12)
        shown = curve[::step] + ([last] if curve[::step][-1] is not last else [])
        # a head trained across sessions: each session counts its own steps
        sessions = any(p.get("session") for p in curve)
        lines += md_table(
            [*(["session"] if sessions else []), "steps", "tokens", "CPU s", "held-out tau"],
            [
                [*([p.get("session") or "before"] if sessions else []), p["steps"], f"{p['tokens']:,}"]
                + [f"{p['cpu_seconds']:.0f}", f"{p['heldout_tau']:.3f}"]
                for p in shown
            ],
        )
        if proj:
            lines += [
                "",
                f"Over the second half of the curve held-out tau grows {proj['tau_per_doubling_of_tokens']:.3f} per "
                "doubling of training tokens.",
            ]
        if eval_proj:
            pts = eval_proj["points"]
            lines += [
                "",
                "The bar is set on MT-bench, and held-out tau runs ahead of it by a factor that grows with "
                "training: "
                + "; ".join(
                    f"{p['run']}: {p['tokens']:,} tokens, held-out {p['heldout_tau']:.3f}, MT-bench {p['tau']:.3f} "
                    f"({p['heldout_tau'] / p['tau']:.2f}x)"
                    for p in pts
                )
                + " (docs/train.md takes the gap apart). So the projection is made on MT-bench itself: "
                f"its tau grows {eval_proj['tau_per_doubling_of_tokens']:.3f} per doubling of tokens between these "
                f"heads, and a straight line in log tokens reaches {BARS['mt_bench_tau']} after "
                f"~{eval_proj.get('tokens_for_goal', float('nan')):,.0f} tokens"
                + (
                    f" (~{eval_proj['cpu_hours_for_goal']:,.0f} core-hours at the last run's rate)"
                    if "cpu_hours_for_goal" in eval_proj
                    else ""
                )
                + ". Curves flatten, so this is the least it would take, and far more distinct data than one "
                "corpus of ~3k conversations (1.05M trained tokens) would be needed well before then.",
            ]
    return lines


def hour_lines(hour_row: dict | None) -> list[str]:
    lines: list[str] = []
    if hour_row:
        c, b = hour_row["chosen"], hour_row["before"]
        lines += [
            "",
            f"## One core-hour each ({hour_row['budget_cpu_s']:.0f} CPU s, one thread, the same cache)",
            "",
        ]
        lines += md_table(
            ["recipe", "steps", "tokens", "held-out tau", "ratio"],
            [
                [f"before issue 22: {b['what']}", b["steps"], f"{b['tokens']:,}", f"{b['heldout_tau']:.3f}", "1.00x"],
                [
                    "chosen: recipes/smollm2-135m/train.yaml",
                    c["steps"],
                    f"{c['tokens']:,}",
                    f"{c['heldout_tau']:.3f}",
                    _fx(hour_row["ratio"]),
                ],
            ],
        )
    return lines


def sweep_lines(sweep: dict) -> list[str]:
    """The sweep section: every configuration's tau and measured speedup per dtype, and what a missed bar needs."""
    lines: list[str] = []
    if any(sweep.values()):
        lines += ["", "## `eval --sweep` on MT-bench: measured speed of each configuration", "", figure_line(SWEEP), ""]
        names = next(s for s in sweep.values() if s)["configurations"]
        lines += md_table(
            ["configuration", *[f"{dt} tau / speedup" for dt in sweep]],
            [
                [
                    name,
                    *[
                        "-"
                        if not s or name not in s["configurations"]
                        else f"{s['configurations'][name]['tau']:.2f} / {s['configurations'][name]['speedup']:.2f}x"
                        for s in sweep.values()
                    ],
                ]
                for name in names
            ],
        )
        for dt, s in sweep.items():
            if s:
                lines.append(
                    f"- {dt}: best {s['best']} {_fx(s['speedup_vs_plain'])} [90%: {s['speedup_interval'][0]:.2f}, "
                    f"{s['speedup_interval'][1]:.2f}] over {s['prompts']} prompts x {s['max_new_tokens']} tokens; "
                    f"greedy mismatches {s['greedy_mismatches']}/{s['prompts']}; matmuls: {s['kernels']}"
                    + (f"; plain decoding {s['plain_tokens_per_s']:.1f} tok/s" if s.get("plain_tokens_per_s") else "")
                )
        for dt, s in sweep.items():
            if s and s["speedup_vs_plain"] < BARS[f"sweep_{dt}"]:
                lines.append(f"- {dt}, what the {BARS[f'sweep_{dt}']}x bar needs: " + needs(s, BARS[f"sweep_{dt}"]))
    return lines


def issue22_json(
    curve: list[dict], proj: dict | None, eval_proj: dict | None, hour_row: dict | None, sweep: dict, mt: dict | None
) -> dict:
    tau = mt and mt["tau"]
    return {
        "learning_curve": [
            {k: p[k] for k in ("tokens", "steps", "seconds", "cpu_seconds", "heldout_tau")} for p in curve
        ],
        "learning_curve_projection": proj,
        "mt_bench_projection": eval_proj,
        "one_core_hour": hour_row,
        "sweep": sweep,
        "bar_issue22": {
            "mt_bench_tau_ge_2.5": {"measured": tau, "met": bool(tau and tau >= BARS["mt_bench_tau"])},
            "sweep_fp32_ge_1.1x": _bar(sweep["fp32"], BARS["sweep_fp32"]),
            "sweep_bf16_ge_1.5x": _bar(sweep["bf16"], BARS["sweep_bf16"]),
            "one_core_hour_ge_1.3x": {
                "measured": hour_row and hour_row["ratio"],
                "met": bool(hour_row and hour_row["ratio"] >= BARS["one_core_hour_ratio"]),
            },
        },
    }


def kept_sections(earlier: dict) -> list[str]:
    """The recipe rows (benchmarks/smollm2/recipes.py at a short budget) and the held-out vs eval
    agreement (benchmarks/stages/heldout_vs_eval.py) kept in the JSON from earlier runs."""
    lines = []
    rows = earlier.get("recipes") or {}
    rows = rows.get("rows", rows)
    if rows:
        base = (rows.get("baseline") or {}).get("heldout_tau")
        budget = {round(r.get("cpu_seconds") or 0, -2) for r in rows.values()}
        lines += [
            "",
            f"## Recipe choices at one short budget (~{max(budget):.0f} CPU s each, one thread, one cache)",
            "",
            "From benchmarks/smollm2/recipes.py; what each row says is in [train.md](train.md).",
            "",
        ]
        lines += md_table(
            ["row", "change", "first loss", "steps", "tokens", "held-out tau", "vs baseline", "MT-bench eval tau"],
            [
                [
                    name,
                    r["what"],
                    f"{r['first_loss']:.2f}",
                    r["steps"],
                    f"{r['tokens']:,}",
                    f"{r['heldout_tau']:.3f}",
                    _fx(r["heldout_tau"] / base) if base else "-",
                    f"{r['eval_mt_bench']['tau']:.3f}" if r.get("eval_mt_bench") else "-",
                ]
                for name, r in rows.items()
            ],
        )
    agree = earlier.get("heldout_vs_eval") or {}
    if agree:
        lines += ["", "## The learning curve's estimate against `eagle3 eval` on the same head", ""]
        lines += md_table(
            ["head", "held-out tau (training)", "eval tau", "eval", "ratio"],
            [
                [k, f"{v['heldout_tau']:.3f}", f"{v['eval_tau']:.3f}", v["eval"], f"{v['ratio']:.3f}"]
                for k, v in agree.items()
            ],
        )
    return lines


def _budget(run: Path) -> str:
    cfg = (json.loads(m.read_text()) if (m := run / "train" / "manifest.json").exists() else {}).get("config", {})
    b = cfg.get("time_budget_s")
    return "-" if b is None else f"{b:,.0f} CPU s ({b / 3600:.1f} core-hours)"


def _every(run: Path):
    m = run / "train" / "manifest.json"
    return (json.loads(m.read_text()).get("config") or {}).get("heldout_every", "?") if m.exists() else "?"


def _bar(s: dict | None, goal: float) -> dict:
    return {"measured": s and s["speedup_vs_plain"], "met": bool(s and s["speedup_vs_plain"] >= goal)}


def md_table(head: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return out + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
