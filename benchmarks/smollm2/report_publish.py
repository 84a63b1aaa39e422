"""The published-head keys of docs/results-smollm2.json for a head trained across working sessions
(benchmarks/smollm2/publish.py): per-bench rows, sweeps, the learning curve, the sessions, the evals'
costs and commands, read from the last session's eval folders; then the page is rendered from the
JSON. The other keys (recipe rows, the equal-compute pair, data sections) are measured by other
programs and kept as they are. Pure reading, no measuring.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.common import REPO
from benchmarks.smollm2.report import PAIR_EVALS, cost_row, eval_rows, sampling_check
from benchmarks.smollm2.report import _json as _read_json
from benchmarks.smollm2.report_compute import GOAL_TAU, eval_projection, heldout_curve, keys, projection, sweep_summary
from benchmarks.smollm2.report_page import write_page


class PublishError(ValueError):
    """What is missing for a publish report, said so that the caller can exit 2."""


def _json(path: Path) -> dict:
    return _read_json(path) or {}


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def session_rows(sessions: list[Path]) -> list[dict]:
    """One row per session: what it trained on and its held-out curve's ends."""
    rows = []
    for run in sessions:
        m, curve = _json(run / "train" / "manifest.json"), heldout_curve(run)
        cfg = m.get("config") or {}
        by_folder = m.get("trained_by_folder") or []
        skip, n = cfg.get("skip_samples") or 0, cfg.get("train_samples")
        if n is None:  # no --train-samples: all the rest, as many as the manifest says --data gave
            n = by_folder[0]["samples"] if by_folder else m.get("trained_samples")
        rows.append(
            {
                "run": _rel(run),
                "init_head": cfg.get("init_head"),
                "data": cfg.get("data"),
                "samples": None if n is None else [skip, skip + n - 1],
                # --extra-data: what each other source gave (train's manifest, trained_by_folder)
                "extra": [{"folder": f["folder"], "samples": f["samples"]} for f in by_folder[1:]],
                "steps": m.get("steps"),
                "tokens": m.get("tokens_seen"),
                "heldout_start": curve[0]["heldout_tau"] if curve else None,
                "heldout_end": curve[-1]["heldout_tau"] if curve else None,
                "stopped": m.get("stopped"),
            }
        )
    return rows


def session_curve(sessions: list[Path], before: dict, carries_on: bool = False) -> list[dict]:
    """The sessions' held-out points on one axis: tokens, seconds and CPU seconds counted on from
    BEFORE (the last point of the head the first session started from). A later session's step 0
    re-measures the previous session's end and is left out (the first's too when it CARRIES_ON from
    a session the page keeps)."""
    out: list[dict] = []
    tok0, sec0, cpu0 = before["tokens"], before.get("seconds") or 0.0, before.get("cpu_seconds") or 0.0
    for i, run in enumerate(sessions):
        curve = heldout_curve(run)
        if not curve:
            raise PublishError(f"{run}/train/metrics.jsonl has no held-out point")
        data = (_json(run / "train" / "manifest.json").get("config") or {}).get("data")
        for p in curve:
            if (i or carries_on) and p["steps"] == 0:
                continue
            out.append(
                {
                    "tokens": tok0 + p["tokens"],
                    "steps": p["steps"],
                    "seconds": round(sec0 + (p["seconds"] or 0.0), 2),
                    "cpu_seconds": round(cpu0 + (p["cpu_seconds"] or 0.0), 2),
                    "heldout_tau": p["heldout_tau"],
                    "session": run.name,
                    "heldout_set": data,
                }
            )
        last = curve[-1]
        tok0, sec0, cpu0 = tok0 + last["tokens"], sec0 + (last["seconds"] or 0.0), cpu0 + (last["cpu_seconds"] or 0.0)
    return out


def page_sessions(data: dict, sessions: list[Path]) -> tuple[list[dict], list[dict]]:
    """The sessions the page already publishes, kept by `publish.py --continue` when their run folders
    are gone (a new machine has no runs/): their rows and held-out points, less any of SESSIONS (so a
    publish run twice writes the same page). SESSIONS must carry on where they stop: the first one's
    samples start after the last kept session's, on the same corpus, else PublishError."""
    new = {run.name for run in sessions}
    rows = [r for r in (data.get("published") or {}).get("sessions") or [] if Path(r["run"]).name not in new]
    if not rows:
        raise PublishError("--continue keeps the sessions the page publishes, and it publishes none besides "
                           f"{', '.join(sorted(new))}; publish without --continue, naming every session's run folder")  # fmt: skip
    curve = [p for p in data.get("learning_curve", []) if "session" in p and p["session"] not in new]
    cfg = _json(sessions[0] / "train" / "manifest.json").get("config") or {}
    last = rows[-1]
    if last["samples"] and cfg.get("data") == last["data"] and (cfg.get("skip_samples") or 0) != last["samples"][1] + 1:
        raise PublishError(
            f"{_rel(sessions[0])} trained from sample {cfg.get('skip_samples') or 0} of {cfg['data']}, expected "
            f"{last['samples'][1] + 1}: the page's last session `{last['run']}` ended at sample {last['samples'][1]}, "
            "so the curve would skip or repeat data; name the session that carries on from it"
        )
    return rows, curve


def _mt_chain(rows: list[dict]) -> dict | None:
    return next((r for r in rows if r["eval"] == "mt_bench" and r["decoder"] == "chain"), None)


def publish_report(md_path: Path, sessions: list[Path], evals: dict, steps: dict, keep: bool = False) -> dict:
    """The page's published-head keys for the head of SESSIONS[-1], written into MD_PATH's JSON, then
    the page rendered from it. KEEP (`publish.py --continue`): the sessions the page already publishes
    come first (page_sessions)."""
    json_path = md_path.with_suffix(".json")
    if not json_path.exists():
        raise PublishError(f"no {json_path} to update (make bench-smollm2 writes it)")
    data = json.loads(json_path.read_text())
    last = sessions[-1]
    rows, reports = eval_rows(last, evals, last)
    mt = _mt_chain(rows)
    if mt is None:
        raise PublishError(f"no MT-bench eval in {last}/eval-mt_bench (run publish.py without --report-only)")

    # what the head published before the sessions was, kept once so a later publish counts from it
    old = data.get("published_before_sessions")
    if old is None:
        prev = _mt_chain(data.get("rows", [])) or {}
        old = {
            "head": prev.get("head"),
            "mt_bench_tau": prev.get("tau"),
            "learning_curve": [p for p in data.get("learning_curve", []) if "session" not in p],
        }
        data["published_before_sessions"] = old
    before = old["learning_curve"]
    if not before:
        raise PublishError(f"{json_path} has no learning_curve of the head the sessions started from")
    kept_rows, kept_curve = page_sessions(data, sessions) if keep else ([], [])
    curve = kept_curve + session_curve(sessions, (kept_curve or before)[-1], carries_on=bool(kept_curve))
    points = [
        {"run": old["head"], **{k: before[-1][k] for k in ("tokens", "cpu_seconds", "heldout_tau")},
         "tau": old["mt_bench_tau"]},
        {"run": last.name, **{k: curve[-1][k] for k in ("tokens", "cpu_seconds", "heldout_tau")}, "tau": mt["tau"]},
    ]  # fmt: skip
    sweep = {"fp32": sweep_summary(reports.get("mt_bench")), "bf16": sweep_summary(reports.get("mt_bench_bf16"))}
    pair = [r for r in data.get("rows", []) if r["eval"] in PAIR_EVALS]
    data["rows"] = rows + pair
    data.update(keys(before + curve, projection(curve, GOAL_TAU), eval_projection(points, GOAL_TAU),
                     data.get("one_core_hour"), sweep))  # fmt: skip
    data["published"] = {
        "head": "models/smollm2-135m-eagle3",
        "run": _rel(last),
        "sessions": kept_rows + session_rows(sessions),
        "mt_bench_tau": mt["tau"],
        "mt_bench_eval": _eval_settings(last / "eval-mt_bench"),
        "mt_bench_tau_before": old["mt_bench_tau"],
        "trained_tokens": curve[-1]["tokens"],
    }
    if (sc := sampling_check(reports)) is not None:
        data["sampling_check"] = sc
    costs = {c["stage"]: c for c in data.get("costs", [])}  # the evals' rows: this publish's time and memory
    for name, st in steps.items():
        stage = name.replace("_", " ", 1)
        costs[stage] = cost_row(stage, "-", st["seconds"], "-", peak=round(st["peak_rss_mib"]))
    data["costs"] = list(costs.values())
    cont = " --continue" if kept_rows else ""
    cmds = [f".venv/bin/python benchmarks/smollm2/publish.py{cont} --sessions " + " ".join(_rel(s) for s in sessions)]
    # each eval as publish.py ran it (check_done_evals refuses an eval folder it did not run)
    cmds += [steps[f"eval_{name}"]["command"] for name in evals if f"eval_{name}" in steps]
    note = "The sessions' train commands are in docs/train.md."
    if kept := [r["run"] for r in kept_rows]:
        note += (f" `--continue` kept {', '.join(f'`{r}`' for r in kept)} as an earlier publish wrote them on this "
                 "page (their run folders did not outlive their machine).")  # fmt: skip
    data.setdefault("commands", {}).update({"published": cmds, "published_note": note})
    json_path.write_text(json.dumps(data, indent=2) + "\n")
    write_page(md_path)
    return data


def _eval_settings(folder: Path) -> str:
    """How an eval was run, from its report and the config its manifest records."""
    rep, cfg = _json(folder / "report.json"), _json(folder / "manifest.json").get("config") or {}
    return (
        f"{rep['num_prompts']} {rep.get('turns', 'first')} turns, {rep.get('mode', 'chain')} d{rep['depth']}, "
        f"{cfg.get('dtype', '?')}, T={rep['temperature']}, {rep.get('max_new_tokens')} new tokens"
    )
