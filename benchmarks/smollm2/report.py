"""The keys of docs/results-smollm2.json read from what a measurement program wrote: a run folder's evals and
learning curve (publish.py writes them for the published head) and, one flag per key, report_data.py's; the
other keys are kept, then the page is rendered from the JSON (report_page.py). Nothing here measures.

    .venv/bin/python benchmarks/smollm2/report.py --corpus corpora/smollm2-135m-sharegpt-vllm \
        corpora/smollm2-135m-gsm8k-vllm
    .venv/bin/python benchmarks/smollm2/report.py --data-scaling runs/data-scaling/data_scaling.json
    .venv/bin/python benchmarks/smollm2/report.py --vllm-cpu runs/vllm-cpu-smollm2/results.json  # engine_speedup
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repo root, for `benchmarks`
from benchmarks.common import record  # noqa: E402
from benchmarks.smollm2 import report_data as rd  # noqa: E402
from benchmarks.smollm2.report_page import PAGE, fail, read_json, write_page  # noqa: E402

GOAL_TAU = 2.5  # the MT-bench tau the projections say the tokens for
# a point of a learning curve; `session` and `heldout_set` name a published session's points
CURVE_KEYS = ("tokens", "steps", "seconds", "cpu_seconds", "heldout_tau", "session", "heldout_set")


def metrics(run: Path) -> list[dict]:
    path = run / "train" / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().split("\n") if x.strip()] if path.exists() else []


def heldout_curve(run: Path) -> list[dict]:
    """The held-out points of RUN's training: chain tau at depth 8 on conversations the run never trains on,
    against tokens, steps and seconds of training (wall and CPU)."""
    return [{"tokens": m["tokens_seen"], "steps": m["step"], "seconds": m.get("train_seconds"),
             "cpu_seconds": m.get("train_cpu_seconds"), "heldout_tau": m["heldout_tau"],
             "heldout_alpha_k": m.get("heldout_alpha_k")} for m in metrics(run) if "heldout_tau" in m]  # fmt: skip


def log_line(points: list[dict], tau: str) -> dict | None:
    """A straight line of TAU against log2(tokens) through POINTS (None under 2 token counts), and the tokens at
    which it reaches GOAL_TAU. An extrapolation: real curves flatten, so read it as a lower bound on the data a
    goal needs."""
    xs, ys = [math.log2(p["tokens"]) for p in points], [p[tau] for p in points]
    if len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    out = {"tau_per_doubling_of_tokens": round(slope, 4), "goal_tau": GOAL_TAU}
    if slope > 0:
        out["tokens_for_goal"] = round(2 ** (mx + (GOAL_TAU - my) / slope))
    return out


def projection(curve: list[dict]) -> dict | None:
    """The line through the second half of a held-out curve (None under 3 points)."""
    pts = [p for p in curve if p["tokens"] > 0]
    return log_line(pts[len(pts) // 2 :], "heldout_tau") if len(pts) >= 5 else None


def sweep_summary(report: dict | None) -> dict | None:
    """The fastest measured configuration of an eval's --sweep, beside every configuration's tau and speed-up."""
    if not (sw := (report or {}).get("sweep")):
        return None
    best = max(sw["configurations"], key=lambda r: r["speedup"])
    return {"best": best["name"], "speedup_vs_plain": best["speedup"],
            **{k: best[k] for k in ("speedup_interval", "tau", "greedy_mismatches")},
            "prompts": len(sw["prompts"]), "max_new_tokens": sw["max_new_tokens"],
            "configurations": {r["name"]: {"tau": r["tau"], "speedup": r["speedup"]} for r in sw["configurations"]},
            "kernels": report.get("kernels", "torch (F.linear)"),  # reports before --cpu-kernels ran F.linear
            "plain_tokens_per_s": sw.get("plain_tokens_per_s")}  # fmt: skip


def curve_keys(curve: list[dict], reports: dict, points: list[dict] = (), fit: list[dict] | None = None) -> dict:
    """The keys of a learning CURVE (projected through FIT, default all of it), of REPORTS' sweeps and of the
    MT-bench eval tau of heads trained on different numbers of tokens (POINTS: [{run, tokens, cpu_seconds, tau}],
    publish.py's head before the sessions and after them: what a goal is set on, where held-out tau runs ahead)."""
    pts = sorted((p for p in points if p.get("tokens") and p.get("tau")), key=lambda p: p["tokens"])
    line = log_line(pts, "tau")
    return {"learning_curve": [{k: p[k] for k in CURVE_KEYS if k in p} for p in curve],
            "learning_curve_projection": projection(curve if fit is None else fit),
            "mt_bench_projection": line and {"points": pts, **line},
            "sweep": {dt: sweep_summary(reports.get(name)) for dt, name in (("fp32", "mt_bench"), ("bf16", "mt_bench_bf16"))}}  # fmt: skip


def _r3(x):
    return None if x is None else round(x, 3)


def eval_rows(run: Path, evals) -> tuple[list[dict], dict]:
    """A row per head and decoder of each eval's RUN/eval-NAME/report.json (intervals and tau by depth too), and
    the reports by eval name."""
    rows, reports = [], {}
    for name in evals:
        if (rep := read_json(run / f"eval-{name}" / "report.json")) is None:
            continue
        reports[name] = rep
        for label, head in rep["heads"].items():
            for decoder, d in ((k, head[k]) for k in ("chain", "tree") if k in head):
                acc, depths = d["acceptance"], d["acceptance"]["per_depth"]
                rows.append({
                    "bench": rep["bench"], "decoder": decoder, "depth": rep["depth"], "tau": round(acc["tau"], 3),
                    "speedup_vs_generate": _r3(d.get("speedup_vs_generate")),
                    "greedy_mismatches": d["lossless"].get("mismatches") if rep["temperature"] == 0 else None,
                    "prompts": rep["num_prompts"], "eval": name, "turns": rep.get("turns", "first"),
                    "temperature": rep.get("temperature", 0.0), "head": label,
                    "speedup_vs_plain": _r3(d.get("speedup_vs_plain")),
                    "alpha_k": [round(x["alpha"], 4) if x["attempts"] else None for x in depths],
                    "unconditional_k": [round(x["unconditional"], 4) for x in depths],
                    "tau_interval": acc.get("tau_interval"), "speedup_interval": d.get("speedup_interval"),
                    "tau_by_depth_estimate": [round(x, 3) for x in acc.get("tau_by_depth_estimate", [])],
                })  # fmt: skip
    return rows, reports


def sampling_check(reports: dict) -> dict | None:
    """The T=1 eval's two-sample test of speculative against plain sampling (None without that eval)."""
    rep = reports.get("mt_bench_t1") or {}
    sc = rep.get("sampling_check")
    return sc and {"prompts": rep["num_prompts"], "positions": len(sc["positions"]),
                   **{k: sc[k] for k in ("test", "draws", "min_p_value", "passed")}}  # fmt: skip


FLAGS = {  # flag: (nargs, metavar, help, the keys it writes from the path(s) given)
    "--corpus": ("+", "GEN_DATA_DIR", "`corpus` from these gen-data folders (one per source: their sums and each one)",
                 lambda p: {"corpus": rd.corpus_sources_json(p)}),
    "--data-scaling": (None, "SCALING_JSON", "the `data_scaling` keys from benchmarks/stages/data_scaling.py's JSON",
                       lambda p: dict(zip(("data_scaling", "data_scaling_fit", "data_scaling_settings"),
                                          rd.data_scaling_json(p)))),
    "--data-scaling-equal-compute": ("+", "SCALING_JSON", "`data_scaling_equal_compute` from data_scaling.py's JSON "
                                     "of a --steps-per-run curve; more JSONs: other corpora at that budget",
                                     lambda p: rd.equal_compute_json(p[0], p[1:])),
    "--vllm-cpu": (None, "RESULTS_JSON", "`engine_speedup.vllm_cpu` from benchmarks/vllm_cpu/run_bench.py's results",
                   lambda p: {"engine_speedup.vllm_cpu": rd.vllm_engine_json(p)}),
}  # fmt: skip


def update_keys(a: argparse.Namespace) -> None:
    """Each key a flag names into the page's JSON, from the file or folders it names (refused with exit 2 before
    any is written)."""
    given = {f: v for f in FLAGS if (v := getattr(a, f[2:].replace("-", "_"))) is not None}
    for flag, v in given.items():
        for p in v if isinstance(v, list) else [v]:
            if not p.exists():
                fail(f"{p} does not exist (expected {flag}'s {FLAGS[flag][1]})")
    keys = {}
    for flag, v in given.items():
        try:
            keys |= FLAGS[flag][3](v)
        except (ValueError, KeyError, FileNotFoundError) as e:  # inputs that cannot stand on the page (not JSON...)
            fail(f"{flag}: {e} (expected {FLAGS[flag][2]})")
    for key, value in keys.items():
        record(a.results_md.with_suffix(".json"), key, value)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results-md", type=Path, default=PAGE)
    for flag, (nargs, metavar, text, _) in FLAGS.items():
        ap.add_argument(flag, type=Path, nargs=nargs, metavar=metavar, help=text)
    return ap


if __name__ == "__main__":
    a = parser().parse_args()
    if not any(getattr(a, f[2:].replace("-", "_")) is not None for f in FLAGS):
        parser().error(f"name a key to write: {', '.join(FLAGS)}")
    update_keys(a)
    write_page(a.results_md)
