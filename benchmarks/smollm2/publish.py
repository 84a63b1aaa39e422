"""Publish a head trained across working sessions (run folders each started from the last one's head,
`eagle3 train --init-head ... --skip-samples ...`, docs/train.md): run the page's evals of the last session's
head (run_bench.eval_plan less the equal-compute pair) into LAST/eval-NAME, write the page's published-head
keys (rows, sweeps, the learning curve from the head before the sessions on, the sessions, the evals' costs
and commands) and render the page; `--export` then exports the head into models/smollm2-135m-eagle3. Each step
is skipped when its output exists, so an interrupted publish resumes. Run folders do not outlive a machine:
`--continue` keeps the sessions an earlier publish wrote on the page, and the ones named must carry on there.
The run folders' readers (evals, learning curve, sweeps) are here: no other program writes those keys.

    .venv/bin/python benchmarks/smollm2/publish.py --sessions runs/long-s1 runs/long-s2 runs/long-s3
    .venv/bin/python benchmarks/smollm2/publish.py --continue --sessions runs/long-s4   # s1-s3 from the page
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repo root, for `benchmarks`
from benchmarks.common import E3, REPO, Recorder  # noqa: E402
from benchmarks.smollm2.report_page import PAGE, fail, read_json, rel, save  # noqa: E402
from benchmarks.smollm2.run_bench import PAIR_EVALS, eval_cmd, eval_plan  # noqa: E402

PUBLISHED_HEAD = REPO / "models" / "smollm2-135m-eagle3"
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


def published_evals(last: Path, args) -> dict:
    """The page's evals of the published head, all in LAST (the pair's runs are not needed)."""
    return {k: v for k, v in eval_plan(last, last, last, args).items() if k not in PAIR_EVALS}


class PublishError(ValueError):
    """What is missing for a publish report, said so that the caller can exit 2."""


def session_keys(sessions: list[Path], before: dict, carries_on: bool = False) -> tuple[list[dict], list[dict]]:
    """Per session its row (what it trained on, its held-out curve's ends) and its held-out points on one axis:
    tokens, seconds and CPU seconds counted on from BEFORE (the last point of the head the first session started
    from). A later session's step 0 re-measures the previous session's end and is left out (the first's too when
    it CARRIES_ON from a session the page keeps)."""
    rows, points = [], []
    base = {"tokens": before["tokens"], **{k: before.get(k) or 0.0 for k in ("seconds", "cpu_seconds")}}
    for i, run in enumerate(sessions):
        if not (curve := heldout_curve(run)):
            raise PublishError(f"{run}/train/metrics.jsonl has no held-out point")
        m = read_json(run / "train" / "manifest.json") or {}
        cfg, by_folder = m.get("config") or {}, m.get("trained_by_folder") or []
        skip, n = cfg.get("skip_samples") or 0, cfg.get("train_samples")
        if n is None:  # no --train-samples: all the rest, as many as the manifest says --data gave
            n = by_folder[0]["samples"] if by_folder else m.get("trained_samples")
        rows.append({"run": rel(run), "init_head": cfg.get("init_head"), "data": cfg.get("data"),
                     "samples": None if n is None else [skip, skip + n - 1],
                     # --extra-data: what each other source gave (train's manifest, trained_by_folder)
                     "extra": [{"folder": f["folder"], "samples": f["samples"]} for f in by_folder[1:]],
                     "steps": m.get("steps"), "tokens": m.get("tokens_seen"), "heldout_start": curve[0]["heldout_tau"],
                     "heldout_end": curve[-1]["heldout_tau"], "stopped": m.get("stopped")})  # fmt: skip
        points += [{"tokens": base["tokens"] + p["tokens"], "steps": p["steps"],
                    **{k: round(base[k] + (p[k] or 0.0), 2) for k in ("seconds", "cpu_seconds")},
                    "heldout_tau": p["heldout_tau"], "session": run.name, "heldout_set": cfg.get("data")}
                   for p in curve if not ((i or carries_on) and p["steps"] == 0)]  # fmt: skip
        base = {k: base[k] + (curve[-1][k] or 0) for k in base}
    return rows, points


def page_sessions(data: dict, sessions: list[Path]) -> tuple[list[dict], list[dict]]:
    """The sessions the page already publishes, kept by `--continue` when their run folders are gone (a new
    machine has no runs/): their rows and held-out points, less any of SESSIONS (so a publish run twice writes
    the same page). SESSIONS must carry on where they stop: the first one's samples start after the last kept
    session's, on the same corpus, else PublishError."""
    new = {run.name for run in sessions}
    rows = [r for r in (data.get("published") or {}).get("sessions") or [] if Path(r["run"]).name not in new]
    if not rows:
        raise PublishError("--continue keeps the sessions the page publishes, and it publishes none besides "
                           f"{', '.join(sorted(new))}; publish without --continue, naming every session's run "
                           "folder")  # fmt: skip
    curve = [p for p in data.get("learning_curve", []) if "session" in p and p["session"] not in new]
    cfg, last = ((read_json(sessions[0] / "train" / "manifest.json") or {}).get("config") or {}), rows[-1]
    if last["samples"] and cfg.get("data") == last["data"] and (cfg.get("skip_samples") or 0) != last["samples"][1] + 1:
        raise PublishError(
            f"{rel(sessions[0])} trained from sample {cfg.get('skip_samples') or 0} of {cfg['data']}, expected "
            f"{last['samples'][1] + 1}: the page's last session `{last['run']}` ended at sample {last['samples'][1]}, "
            "so the curve would skip or repeat data; name the session that carries on from it"
        )
    return rows, curve


def publish_report(md_path: Path, sessions: list[Path], evals: dict, steps: dict, keep: bool = False) -> dict:
    """The page's published-head keys for the head of SESSIONS[-1], written into MD_PATH's JSON, then
    the page rendered from it. KEEP (`--continue`): the sessions the page already publishes come first."""
    json_path, last = md_path.with_suffix(".json"), sessions[-1]
    if (data := read_json(json_path)) is None:
        raise PublishError(f"no {json_path} to update (publish.py adds a head to the committed page)")
    rows, reports = eval_rows(last, evals)
    if (mt := next((r for r in rows if (r["eval"], r["decoder"]) == ("mt_bench", "chain")), None)) is None:
        raise PublishError(f"no MT-bench eval in {last}/eval-mt_bench (run publish.py without --report-only)")
    # the head published before the sessions (its head, MT-bench tau and learning curve): a publish counts from it
    if not (before := (old := data.get("published_before_sessions") or {}).get("learning_curve")):
        raise PublishError(f"{json_path} has no published_before_sessions.learning_curve to count the sessions from")
    kept_rows, kept_curve = page_sessions(data, sessions) if keep else ([], [])
    new_rows, new_curve = session_keys(sessions, (kept_curve or before)[-1], carries_on=bool(kept_curve))
    curve = kept_curve + new_curve
    points = [{"run": old["head"], "tokens": before[-1]["tokens"], "tau": old["mt_bench_tau"]},
              {"run": last.name, "tokens": curve[-1]["tokens"], "tau": mt["tau"]}]  # fmt: skip
    data["rows"] = rows + [r for r in data.get("rows", []) if r["eval"] in PAIR_EVALS]
    data.update(curve_keys(before + curve, reports, points, fit=curve))
    rep = read_json(last / "eval-mt_bench" / "report.json") or {}
    dtype = ((read_json(last / "eval-mt_bench" / "manifest.json") or {}).get("config") or {}).get("dtype", "?")
    how = (f"{rep['num_prompts']} {rep.get('turns', 'first')} turns, {rep.get('mode', 'chain')} d{rep['depth']}, "
           f"{dtype}, T={rep['temperature']}, {rep.get('max_new_tokens')} new tokens")  # fmt: skip
    data["published"] = {"head": "models/smollm2-135m-eagle3", "run": rel(last), "mt_bench_eval": how,
                         "sessions": kept_rows + new_rows, "mt_bench_tau": mt["tau"],
                         "mt_bench_tau_before": old["mt_bench_tau"], "trained_tokens": curve[-1]["tokens"]}  # fmt: skip
    if (sc := sampling_check(reports)) is not None:
        data["sampling_check"] = sc
    costs = {c["stage"]: c for c in data.get("costs", [])}  # the evals' rows: this publish's time and memory
    for stage, st in ((name.replace("_", " ", 1), st) for name, st in steps.items()):
        costs[stage] = {"stage": stage, "tokens": "-", "minutes": round(st["seconds"] / 60, 1), "estimated": False,
                        "tok_s": "-", "bytes_per_token": None, "peak_rss_mib": round(st["peak_rss_mib"])}  # fmt: skip
    data["costs"] = list(costs.values())
    cmds = [f".venv/bin/python benchmarks/smollm2/publish.py{' --continue' if kept_rows else ''} --sessions "
            + " ".join(rel(s) for s in sessions)]  # fmt: skip
    # each eval as publish.py ran it (check_done_evals refuses an eval folder it did not run)
    cmds += [steps[f"eval_{name}"]["command"] for name in evals if f"eval_{name}" in steps]
    kept = [r["run"] for r in kept_rows]  # the page says they were kept, not run here
    data.setdefault("commands", {}).update({"published": cmds, "published_kept": kept})
    save(md_path, data)
    return data


def check_sessions(sessions: list[Path]) -> None:
    """Each session a finished training run with a head, or exit 2 saying which is not."""
    for run in sessions:
        if missing := [str(p) for p in (run / "head", run / "train" / "metrics.jsonl") if not p.exists()]:
            fail(f"{run} is not a finished training run (no {', '.join(missing)}); expected the run folders of the "
                 "long run's sessions, oldest first, e.g. --sessions runs/long-s1 runs/long-s2. Finish the session "
                 "with its `eagle3 train` command first")  # fmt: skip


def check_done_evals(last: Path, evals: dict, steps: dict, args, rec: Recorder) -> None:
    """An eval folder publish would skip must hold this plan's eval: one it did not run (no entry in
    publish-steps.json, e.g. a hand-run `eagle3 eval --out LAST/eval-gsm8k`) or ran with other settings would
    be published silently in its place, so exit 2 naming it."""
    for name, (run, bench, prompts, extra) in evals.items():
        dest, recorded = last / f"eval-{name}", steps.get(f"eval_{name}", {}).get("command")
        planned = rec.show(eval_cmd(run, dest, bench, prompts, args, *extra))
        if (dest / "report.json").exists() and recorded != planned:
            why = "was not written by publish.py" if recorded is None else f"was run as `{recorded}`"
            fail(f"{dest} {why}; expected `{planned}`. Move that folder aside (or delete it) and rerun publish.py: "
                 "it runs the page's eval there")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=Path, nargs="+", required=True, help="the sessions' run folders, oldest first")
    for flag, default in (("--mt-bench-prompts", 80), ("--eval-prompts", 40), ("--max-new-tokens", 64),
                          ("--sampling-prompts", 20), ("--sweep-prompts", 8)):  # fmt: skip
        ap.add_argument(flag, type=int, default=default)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per eval")
    ap.add_argument("--jobs", type=int, default=1, help="evals run this many at a time")
    ap.add_argument("--results-md", type=Path, default=PAGE)
    ap.add_argument("--report-only", action="store_true", help="no eval runs: write the page from the evals done")
    ap.add_argument("--continue", dest="keep", action="store_true",
                    help="keep the sessions the page already publishes (their run folders may be gone); "
                         "--sessions names only the ones trained since, oldest first")  # fmt: skip
    ap.add_argument("--export", action="store_true", help=f"then export the head into {PUBLISHED_HEAD.name}")
    args = ap.parse_args()
    sessions = [s.resolve() for s in args.sessions]
    check_sessions(sessions)
    last = sessions[-1]
    evals = published_evals(last, args)
    rec, lock, steps_file = Recorder(), threading.Lock(), last / "publish-steps.json"
    steps = read_json(steps_file) or {}

    def run_eval(name: str) -> None:
        run, bench, prompts, extra = evals[name]
        if (dest := last / f"eval-{name}").joinpath("report.json").exists():
            return
        cmd = eval_cmd(run, dest, bench, prompts, args, *extra)
        rec.sh(cmd, env={"OMP_NUM_THREADS": str(args.threads)})
        shown = rec.show(cmd)
        with lock:  # the page's Costs table reads eval times and peak memory from here
            steps[f"eval_{name}"] = {"command": shown, "seconds": rec.seconds[shown],
                                     "peak_rss_mib": rec.peak_rss_mib[shown]}  # fmt: skip
            steps_file.write_text(json.dumps(steps, indent=2) + "\n")

    check_done_evals(last, evals, steps, args, rec)
    try:
        if args.keep:  # refused before an hour of evals, not after them
            page_sessions(read_json(args.results_md.with_suffix(".json")) or {}, sessions)
        if not args.report_only:
            with ThreadPoolExecutor(max_workers=args.jobs) as pool:
                for f in [pool.submit(run_eval, name) for name in evals]:
                    f.result()
        data = publish_report(args.results_md, sessions, evals, steps, keep=args.keep)
    except PublishError as e:  # before any eval ran, or after them before the page was written
        fail(str(e))
    print(f"published {last.name}: MT-bench tau {data['published']['mt_bench_tau']:.3f} "
          f"(before {data['published']['mt_bench_tau_before']}) into {args.results_md}")  # fmt: skip
    if args.export:
        rec.sh([*E3, "export", "--head", last / "head", "--format", "sglang", "--dtype", "bf16",
                "--out", PUBLISHED_HEAD, "--overwrite"])  # fmt: skip


if __name__ == "__main__":
    main()
