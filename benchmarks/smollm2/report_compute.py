"""The acceptance-per-compute keys of docs/results-smollm2.json: the learning curve of the published run
and its projections, and `eval --sweep` in fp32 and bf16. Pure reading of run folders (report.py, publish.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

GOAL_TAU = 2.5  # the MT-bench tau the projections say the tokens for
# a point of a learning curve; `session` and `heldout_set` name a published session's points
CURVE_KEYS = ("tokens", "steps", "seconds", "cpu_seconds", "heldout_tau", "session", "heldout_set")


def metrics(run: Path) -> list[dict]:
    path = run / "train" / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().split("\n") if x.strip()] if path.exists() else []


def heldout_curve(run: Path) -> list[dict]:
    """The held-out points of RUN/train/metrics.jsonl: chain tau at depth 8 on conversations the
    run never trains on, against tokens, steps and seconds of training (wall and CPU)."""
    return [{"tokens": m["tokens_seen"], "steps": m["step"], "seconds": m.get("train_seconds"),
             "cpu_seconds": m.get("train_cpu_seconds"), "heldout_tau": m["heldout_tau"],
             "heldout_alpha_k": m.get("heldout_alpha_k")} for m in metrics(run) if "heldout_tau" in m]  # fmt: skip


def log_line(points: list[dict], tau: str, goal: float = GOAL_TAU) -> dict | None:
    """A straight line of TAU against log2(tokens) through POINTS (None under 2 distinct token counts), and
    the tokens at which it reaches GOAL (and the CPU hours at the last point's rate). An extrapolation: real
    curves flatten, so read it as a lower bound on the data and compute a goal needs."""
    xs, ys = [math.log2(p["tokens"]) for p in points], [p[tau] for p in points]
    if len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    out = {"tau_per_doubling_of_tokens": round(slope, 4), "goal_tau": goal}
    if slope > 0:
        last, need = points[-1], 2 ** (mx + (goal - my) / slope)
        out["tokens_for_goal"] = round(need)
        if last.get("cpu_seconds"):  # at the last point's training rate
            out["cpu_hours_for_goal"] = round(need / last["tokens"] * last["cpu_seconds"] / 3600, 1)
    return out


def projection(curve: list[dict]) -> dict | None:
    """The line through the second half of a held-out curve (None under 3 points)."""
    pts = [p for p in curve if p["tokens"] > 0]
    pts = pts[len(pts) // 2 :]
    line = log_line(pts, "heldout_tau") if len(pts) >= 3 else None
    return line and {
        "tau_per_doubling_of_tokens": line.pop("tau_per_doubling_of_tokens"),
        "fit_points": len(pts),
        **line,
    }


def eval_projection(points: list[dict]) -> dict | None:
    """The same line through MT-bench eval tau of heads trained on different numbers of tokens (points:
    [{run, tokens, cpu_seconds, tau}]): what the bar is set on, where held-out tau runs ahead of it."""
    pts = sorted((p for p in points if p.get("tokens") and p.get("tau")), key=lambda p: p["tokens"])
    line = log_line(pts, "tau")
    return line and {"points": pts, **line}


def sweep_summary(report: dict | None) -> dict | None:
    """The fastest measured configuration of an eval's --sweep and what it recommended."""
    if not (sw := (report or {}).get("sweep")):
        return None
    best = max(sw["configurations"], key=lambda r: r["speedup"])
    return {"best": best["name"], "speedup_vs_plain": best["speedup"],
            **{k: best[k] for k in ("speedup_interval", "tau", "greedy_mismatches")}, "recommended": sw["recommended"],
            "prompts": len(sw["prompts"]), "max_new_tokens": sw["max_new_tokens"],
            "dtype": report.get("dtype") or (report.get("target") or {}).get("dtype"),
            "configurations": {r["name"]: {"tau": r["tau"], "speedup": r["speedup"]} for r in sw["configurations"]},
            "kernels": report.get("kernels", "torch (F.linear)"),  # reports before --cpu-kernels ran F.linear
            "plain_tokens_per_s": sw.get("plain_tokens_per_s")}  # fmt: skip


def curve_keys(curve: list[dict], points: list[dict], reports: dict, fit: list[dict] | None = None) -> dict:
    """The page's keys of a learning CURVE (projected through FIT, default all of it), MT-bench eval POINTS
    of heads along it, and REPORTS' sweeps."""
    return {"learning_curve": [{k: p[k] for k in CURVE_KEYS if k in p} for p in curve],
            "learning_curve_projection": projection(curve if fit is None else fit), "mt_bench_projection": eval_projection(points),
            "sweep": {"fp32": sweep_summary(reports.get("mt_bench")), "bf16": sweep_summary(reports.get("mt_bench_bf16"))}}  # fmt: skip


def compute_keys(out: Path, reports: dict, published: Path | None = None) -> dict:
    """curve_keys of PUBLISHED (the run whose head the evals measure; default OUT), with the MT-bench tau of
    OUT's and PUBLISHED's heads as the points."""
    published = published or out
    points = []
    for name, run in {"mt_bench": published, **({"ttt_k_mt_bench": out} if published != out else {})}.items():
        head = next(iter(((reports.get(name) or {}).get("heads") or {}).values()), {})
        if (curve := heldout_curve(run)) and "chain" in head:
            points.append({"run": run.name, **{k: curve[-1][k] for k in ("tokens", "cpu_seconds", "heldout_tau")},
                           "tau": round(head["chain"]["acceptance"]["tau"], 4)})  # fmt: skip
    return curve_keys(heldout_curve(published), points, reports)
