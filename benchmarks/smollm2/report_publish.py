"""The published-head part of docs/results-smollm2.{md,json} for a head trained across working
sessions (benchmarks/smollm2/publish.py): per-bench rows, sweeps, the learning curve and the bars,
read from the last session's eval folders. The rest of the page (recipe rows, the equal-compute
pair, data sections) is measured by other programs and kept as it is. Pure reading, no measuring.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.common import REPO
from benchmarks.smollm2.report import PAIR_EVALS, WHY_MISSED, _minutes, bench_lines, eval_command, eval_rows, json_row
from benchmarks.smollm2.report import _json as _read_json
from benchmarks.smollm2.report_bars import bars_json, rewrite_bars
from benchmarks.smollm2.report_compute import (
    BARS,
    bars22_lines,
    curve_lines,
    eval_projection,
    heldout_curve,
    issue22_json,
    md_table,
    projection,
    sweep_lines,
    sweep_summary,
)
from benchmarks.smollm2.report_data import replace_section
from benchmarks.smollm2.report_long_run import rel as _rel
from benchmarks.smollm2.report_long_run import session_rows

BENCH_HEADING = "## Acceptance and speed by bench (depth 8)"
CURVE_KEYS = ("tokens", "steps", "seconds", "cpu_seconds", "heldout_tau")


class PublishError(ValueError):
    """What is missing for a publish report, said so that the caller can exit 2."""


def _json(path: Path) -> dict:
    return _read_json(path) or {}


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
    """Rewrite the page's published-head sections for the head of SESSIONS[-1]; the JSON written.
    KEEP (`publish.py --continue`): the sessions the page already publishes come first (page_sessions)."""
    json_path = md_path.with_suffix(".json")
    if not json_path.exists() or not md_path.exists():
        raise PublishError(f"no {json_path} and {md_path} to update (make bench-smollm2 writes them)")
    data, md = json.loads(json_path.read_text()), md_path.read_text()
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
    proj = projection(curve, BARS["mt_bench_tau"])
    points = [
        {"run": old["head"], **{k: before[-1][k] for k in ("tokens", "cpu_seconds", "heldout_tau")},
         "tau": old["mt_bench_tau"]},
        {"run": last.name, **{k: curve[-1][k] for k in ("tokens", "cpu_seconds", "heldout_tau")}, "tau": mt["tau"]},
    ]  # fmt: skip
    eval_proj = eval_projection(points, BARS["mt_bench_tau"])
    sweep = {"fp32": sweep_summary(reports.get("mt_bench")), "bf16": sweep_summary(reports.get("mt_bench_bf16"))}
    hour_row = data.get("one_core_hour")

    pair = [r for r in data.get("rows", []) if r["eval"] in PAIR_EVALS]
    data["rows"] = [json_row(r) for r in rows] + pair
    data.update(issue22_json(curve, proj, eval_proj, hour_row, sweep, mt))
    data["learning_curve"] = [{k: p[k] for k in CURVE_KEYS} for p in before] + curve
    data["published"] = {
        "head": "models/smollm2-135m-eagle3",
        "run": _rel(last),
        "sessions": kept_rows + session_rows(sessions),
        "mt_bench_tau": mt["tau"],
        "mt_bench_eval": _eval_settings(last / "eval-mt_bench"),
        "mt_bench_tau_before": old["mt_bench_tau"],
        "trained_tokens": curve[-1]["tokens"],
    }
    data.update(bars_json(data))
    json_path.write_text(json.dumps(data, indent=2) + "\n")

    md = replace_section(md, [*bars22_lines(mt, sweep, hour_row), ""], "## Learning curve", "## Issue 22's bars")
    md = replace_section(md, _curve_section(data, curve, proj, eval_proj), "## One core-hour",
                         "## Learning curve of the published head")  # fmt: skip
    if sweep_section := sweep_lines(sweep)[1:]:  # none without a sweep: no heading to replace it by next time
        md = replace_section(md, [*sweep_section, "", WHY_MISSED, ""], "## Recipe choices",
                             "## `eval --sweep` on MT-bench")  # fmt: skip
    kept = _subsections(md, BENCH_HEADING)  # e.g. "Why the target runs in fp32 here", from the pair's evals
    bench = [*bench_lines(rows + pair, reports, last.name), "", *kept]
    md = replace_section(md, bench, "## Training-time test", BENCH_HEADING)
    md = rewrite_bars(md, data)
    md = _header_note(md, last)
    md = _costs(md, steps)
    md = _commands(md, sessions, evals, [r["run"] for r in kept_rows])
    md_path.write_text(md)
    return data


def _curve_section(data: dict, curve: list[dict], proj: dict | None, eval_proj: dict | None) -> list[str]:
    pub, old = data["published"], data["published_before_sessions"]
    about = (
        f"Held-out chain tau at depth 8 of the published head's training: the head published before "
        f"(`{old['head']}`, {old['learning_curve'][-1]['tokens']:,} tokens, on the ~2.9k-conversation corpus's "
        f"held-out conversations), then the long run's sessions, each started from the last one's head on "
        f"conversations it never saw (`eagle3 train --init-head ... --skip-samples ...`, docs/train.md), "
        f"held out on `{curve[-1]['heldout_set']}`'s 32 held-out conversations: a different set, so the curve "
        f"steps where the sessions begin. Tokens and CPU seconds count on from the head before."
    )
    lines = curve_lines(data["learning_curve"], about, None, None)[1:]
    if proj:
        lines += [
            "",
            f"Over the second half of the sessions' points (one held-out set) held-out tau grows "
            f"{proj['tau_per_doubling_of_tokens']:.3f} per doubling of trained tokens.",
        ]
    lines += [
        "",
        "The sessions (each from the previous one's head, exported into the folder named when the session "
        "began; an export overwrites that folder, so a path here names the head it held then):",
        "",
    ]
    lines += md_table(
        ["session", "started from", "samples", "steps", "new tokens", "held-out tau (start -> end)"],
        [
            [
                f"`{s['run']}`",
                f"`{s['init_head']}`" + (f" (then: {old['head']})" if i == 0 else ""),
                ("-" if not s["samples"] else f"{s['samples'][0]:,}-{s['samples'][1]:,}")
                + "".join(f" + {e['samples']:,} of `{e['folder']}`" for e in s.get("extra") or ()),
                s["steps"],
                f"{s['tokens']:,}",
                f"{s['heldout_start']:.3f} -> {s['heldout_end']:.3f}",
            ]
            for i, s in enumerate(pub["sessions"])
        ],
    )
    if eval_proj:
        a, b = eval_proj["points"]
        lines += [
            "",
            f"MT-bench ({pub['mt_bench_eval']}): {b['tau']:.3f} after "
            f"{b['tokens']:,} trained tokens, against {a['tau']:.3f} for the head before ({a['tokens']:,}): "
            f"{eval_proj['tau_per_doubling_of_tokens']:.3f} per doubling of trained tokens between the two. A "
            f"straight line in log tokens through them reaches {BARS['mt_bench_tau']} after "
            f"~{eval_proj.get('tokens_for_goal', float('nan')):,.0f} tokens; the data-scaling section below "
            "answers the same question from heads trained from scratch on nested subsets.",
        ]
    return [*lines, ""]


def _eval_settings(folder: Path) -> str:
    """How an eval was run, from its report and the config its manifest records."""
    rep, cfg = _json(folder / "report.json"), _json(folder / "manifest.json").get("config") or {}
    return (
        f"{rep['num_prompts']} {rep.get('turns', 'first')} turns, {rep.get('mode', 'chain')} d{rep['depth']}, "
        f"{cfg.get('dtype', '?')}, T={rep['temperature']}, {rep.get('max_new_tokens')} new tokens"
    )


def _subsections(md: str, heading: str) -> list[str]:
    """The `### ` subsections of the section under HEADING, as they stand."""
    text = md.splitlines()
    start = next((i for i, x in enumerate(text) if x.startswith(heading)), None)
    if start is None:
        return []
    end = next((i for i in range(start + 1, len(text)) if text[i].startswith("## ")), len(text))
    sub = next((i for i in range(start + 1, end) if text[i].startswith("### ")), None)
    return [] if sub is None else text[sub:end]


HEADER_NOTE = "The published head's sections (the bars, its learning curve, the sweep, the per-bench table) are"


def _header_note(md: str, last: Path) -> str:
    """A line under the page's opening paragraph saying which program wrote the published head's sections."""
    note = f"{HEADER_NOTE} rewritten by `benchmarks/smollm2/publish.py` from `{_rel(last)}`'s eval folders."
    text = md.splitlines()
    at = next((i for i, x in enumerate(text) if x.startswith(HEADER_NOTE)), None)
    if at is not None:
        text[at] = note
    else:
        first = next((i for i, x in enumerate(text) if x.startswith("## ")), len(text))
        text[first:first] = [note, ""]
    return "\n".join(text) + ("\n" if md.endswith("\n") else "")


def _costs(md: str, steps: dict) -> str:
    """The Costs table's eval rows, from this publish's recorded wall time and peak memory."""
    text = md.splitlines()
    for name, st in steps.items():
        label = name.replace("_", " ", 1)
        row = f"| {label} | - | {_minutes(st['seconds'])} | - | - | {st['peak_rss_mib']:.0f} MiB |"
        at = next((i for i, x in enumerate(text) if x.startswith(f"| {label} |")), None)
        if at is not None:
            text[at] = row
    return "\n".join(text) + ("\n" if md.endswith("\n") else "")


PUBLISH_HEADING = "### The published head: its sessions and evals"


def _commands(md: str, sessions: list[Path], evals: dict, kept: list[str]) -> str:
    """The Commands section's block for the published head, replaced on every publish. KEPT: the
    runs of the sessions `--continue` took from the page."""
    last = sessions[-1]
    cont = " --continue" if kept else ""
    cmds = [f".venv/bin/python benchmarks/smollm2/publish.py{cont} --sessions " + " ".join(_rel(s) for s in sessions)]
    folders = [last / f"eval-{name}" for name in evals]
    # eval records the paths it was given (publish.py gives absolute ones): shown from the repo root
    cmds += [eval_command(m, f).replace(f"{REPO}/", "") for f in folders if (m := _json(f / "manifest.json"))]
    about = "The sessions' train commands are in docs/train.md."
    if kept:
        about += (f" `--continue` kept {', '.join(f'`{r}`' for r in kept)} as an earlier publish wrote them on this "
                  "page (their run folders did not outlive their machine).")  # fmt: skip
    block = ["", PUBLISH_HEADING, "", about, "", "```", *cmds, "```", ""]
    text = md.splitlines()
    at = next((i for i, x in enumerate(text) if x == PUBLISH_HEADING), None)
    if at is not None:
        end = next((i for i in range(at + 1, len(text)) if text[i].startswith("#")), len(text))
        at -= 1 if at and not text[at - 1] else 0  # the blank line the block starts with
        del text[at:end]
    else:
        start = next((i for i, x in enumerate(text) if x == "## Commands"), None)
        if start is None:
            text += ["", "## Commands", ""]
            at = len(text)
        else:
            at = next((i for i in range(start + 1, len(text)) if text[i].startswith("## ")), len(text))
    text[at:at] = block
    return "\n".join(text) + ("\n" if md.endswith("\n") else "")
