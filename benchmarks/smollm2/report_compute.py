"""The acceptance-per-compute keys of docs/results-smollm2.json: the learning curve of the published
run and its projections, the one-core-hour comparison with the recipe as it was, and `eval --sweep`
in fp32 and bf16. Pure reading of run folders, like report.py, which calls it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

GOAL_TAU = 2.5  # the MT-bench tau the projections say the tokens for
# a point of a learning curve; `session` and `heldout_set` name a published session's points
CURVE_KEYS = ("tokens", "steps", "seconds", "cpu_seconds", "heldout_tau", "session", "heldout_set")


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


def _log_line(points: list[tuple[float, float, dict]], goal: float) -> dict:
    """A straight line of tau against log2(tokens) through POINTS (tokens, tau, the point), and the tokens
    at which it reaches GOAL (and the CPU hours at the last point's rate). An extrapolation: real curves
    flatten, so read it as a lower bound on the data and compute a goal needs."""
    xs, ys = [math.log2(x) for x, _, _ in points], [y for _, y, _ in points]
    n = len(points)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    out = {"tau_per_doubling_of_tokens": round(slope, 4), "goal_tau": goal}
    if slope > 0:
        last = points[-1][2]
        need = 2 ** (mx + (goal - my) / slope)
        out["tokens_for_goal"] = round(need)
        if last.get("cpu_seconds"):  # at the last point's training rate
            out["cpu_hours_for_goal"] = round(need / last["tokens"] * last["cpu_seconds"] / 3600, 1)
    return out


def projection(curve: list[dict], goal: float) -> dict | None:
    """The line through the second half of a held-out curve (None under 3 points)."""
    pts = [(p["tokens"], p["heldout_tau"], p) for p in curve if p["tokens"] > 0]
    pts = pts[len(pts) // 2 :]
    if len(pts) < 3:
        return None
    line = _log_line(pts, goal)
    return {"tau_per_doubling_of_tokens": line.pop("tau_per_doubling_of_tokens"), "fit_points": len(pts), **line}


def eval_projection(points: list[dict], goal: float) -> dict | None:
    """The same line through MT-bench eval tau of heads trained on different numbers of tokens (points:
    [{run, tokens, cpu_seconds, tau}]): what the bar is set on, where held-out tau runs ahead of it."""
    pts = sorted((p for p in points if p.get("tokens") and p.get("tau")), key=lambda p: p["tokens"])
    if len(pts) < 2 or pts[0]["tokens"] == pts[-1]["tokens"]:
        return None
    return {"points": pts, **_log_line([(p["tokens"], p["tau"], p) for p in pts], goal)}


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


def compute_keys(out: Path, hour: Path, reports: dict, rows: list[dict], published: Path | None = None) -> dict:
    """The page's keys: the learning curve of PUBLISHED (the run whose head the evals measure; default
    OUT) and its projections, one core-hour (OUT against HOUR), the sweeps."""
    published = published or out
    curve = heldout_curve(published)
    runs = {"mt_bench": published} | ({"ttt_k_mt_bench": out} if published != out else {})
    return keys(
        curve,
        projection(curve, GOAL_TAU),
        eval_projection(_mt_bench_points(runs, reports), GOAL_TAU),
        one_core_hour(out, hour),
        {"fp32": sweep_summary(reports.get("mt_bench")), "bf16": sweep_summary(reports.get("mt_bench_bf16"))},
    )


def keys(curve: list[dict], proj: dict | None, eval_proj: dict | None, hour_row: dict | None, sweep: dict) -> dict:
    return {
        "learning_curve": [{k: p[k] for k in CURVE_KEYS if k in p} for p in curve],
        "learning_curve_projection": proj,
        "mt_bench_projection": eval_proj,
        "one_core_hour": hour_row,
        "sweep": sweep,
    }
