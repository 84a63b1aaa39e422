"""The long run's sessions as the page states them: what each trained (`published.sessions`), and
their last head as the data-scaling curve's whole-corpus point (`data_scaling_whole_corpus`).

The curve's sizes stop at a fraction of the corpus: a from-scratch run over all of it costs more than
a working session. The long run's sessions (docs/train.md) did train every trainable sample of the
same corpus once, in its order, so once they reach its end their head's MT-bench tau, evaluated as
the sizes were, is the measurement the fit's whole-corpus prediction waits for. It is not the sizes'
recipe (it starts from the head before, spans sessions with their own schedules and adds
--extra-data), so it is stated apart, never fitted with the sizes, and the page says so.

Used by publish.py and report.py (`--whole-corpus EVAL_DIR --sessions RUN...`); pure reading.
"""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

from benchmarks.common import REPO
from benchmarks.smollm2.report_compute import heldout_curve
from eagle3cli.eval.config import EvalConfig

# the eval settings a point must share with the sizes' MT-bench evals (read from their commands)
SETTINGS = {"--bench": ("bench", str), "--num-prompts": ("num_prompts", int),
            "--max-new-tokens": ("max_new_tokens", int), "--depth": ("depth", int), "--mode": ("mode", str),
            "--dtype": ("dtype", str)}  # fmt: skip
GOALS = (2.2, 2.5, 3.0)


def rel(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


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
                "run": rel(run),
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


def sizes_eval(rows: list[dict]) -> dict:
    """The settings of the sizes' MT-bench evals, from the largest size's eval command (eval's
    defaults where the command leaves a flag out)."""
    d = EvalConfig()
    want = {key: getattr(d, key, None) for key, _ in SETTINGS.values()}
    cmd = next((c for c in (max(rows, key=lambda r: r["tokens"]).get("commands") or []) if " eval " in f" {c} "), "")
    words = shlex.split(cmd)
    for flag, (key, kind) in SETTINGS.items():
        if flag in words[:-1]:
            want[key] = kind(words[words.index(flag) + 1])
    return want


def sessions_through(kept: list[dict], new: list[dict], data: str, samples: int) -> list[dict]:
    """The sessions (the page's kept ones, then NEW), checked to train --data's samples 0..SAMPLES-1
    once each, in order; ValueError says where they do not."""
    names = {Path(r["run"]).name for r in new}
    rows = [r for r in kept if Path(r["run"]).name not in names] + new
    at = 0
    for r in rows:
        if r.get("data") != data:
            raise ValueError(f"{r['run']} trained on {r.get('data')}, not the curve's corpus {data}")
        if not r.get("samples") or r["samples"][0] != at:
            raise ValueError(f"{r['run']} trained samples {r.get('samples')}, expected from sample {at} of {data} "
                             "(--sessions: the sessions since the page's, oldest first)")  # fmt: skip
        at = r["samples"][1] + 1
    if at != samples:
        raise ValueError(f"the sessions end at sample {at - 1} of {data}'s {samples} trainable: not the whole corpus "
                         "(--sessions names every session since the page's, up to one that trains the rest)")  # fmt: skip
    return rows


def whole_corpus_json(data: dict, eval_dir: Path, new_sessions: list[dict]) -> dict:
    """`data_scaling_whole_corpus` from the eval of the long run's last head (EVAL_DIR) and its
    sessions; ValueError when they are not the whole corpus or the eval is not the sizes' eval."""
    s = data.get("data_scaling_settings") or {}
    corpus = s.get("corpus") or {}
    fit = data.get("data_scaling_fit") or {}
    rows = [r for r in data.get("data_scaling") or [] if r.get("mt_bench_tau") is not None]
    if not rows or fit.get("tau") != "mt_bench_tau" or not corpus.get("samples"):
        raise ValueError("the page has no data-scaling curve with MT-bench tau (report.py --data-scaling first)")
    sessions = sessions_through((data.get("published") or {}).get("sessions") or [], new_sessions, s["data"],
                                corpus["samples"])  # fmt: skip
    rep = json.loads((eval_dir / "report.json").read_text(encoding="utf-8"))
    if not isinstance(rep, dict) or not isinstance(rep.get("heads"), dict) or not rep["heads"]:
        raise ValueError(f"{eval_dir}/report.json is not an eagle3 eval report (no heads)")
    want = sizes_eval(rows)
    got = {k: rep.get(k) for k in want}
    got["dtype"] = (_json(eval_dir / "manifest.json").get("config") or {}).get("dtype")  # the report leaves it out
    if got != want or rep.get("temperature") not in (0, 0.0):
        raise ValueError(f"{eval_dir} evaluated {got} (T={rep.get('temperature')}); the sizes were evaluated "
                         f"with {want} at T=0: run that eval on the last session's head")  # fmt: skip
    head = next(iter(rep["heads"].values()))
    acc = head["chain"]["acceptance"]
    tokens = sum(r["tokens"] for r in sessions)  # each session's samples are its own: distinct
    largest = max(rows, key=lambda r: r["tokens"])
    if tokens <= largest["tokens"]:
        raise ValueError(
            f"the sessions trained {tokens:,} tokens, no more than the largest size's {largest['tokens']:,}"
        )
    tau = round(acc["tau"], 4)
    b = (tau - largest["mt_bench_tau"]) / math.log2(tokens / largest["tokens"])
    full = fit["fit_all"]
    path = Path((head.get("head") or {}).get("path") or eval_dir)
    return {
        "head": rel(path),
        "sessions": [sessions[0]["run"], sessions[-1]["run"]],
        "samples": corpus["samples"],
        "distinct_tokens": tokens,
        "corpus_tokens": corpus.get("tokens"),
        "extra_data": sorted({e["folder"] for r in sessions for e in r.get("extra") or []}),
        "mt_bench_tau": tau,
        "mt_bench_tau_interval": [round(x, 4) for x in acc.get("tau_interval") or []],
        # an answer's later tokens accept more (greedy SmolLM2 repeats itself): a bar measured on fewer
        # new tokens than this eval's sits lower on the same line
        "tau_by_position": [
            {k: (round(b[k], 4) if k == "tau" else b[k]) for k in ("from", "to", "tau")}
            for b in acc.get("tau_by_position") or []
        ],  # fmt: skip
        "eval": want,
        "predicted": round(full["a"] + full["b_per_doubling"] * math.log2(tokens), 4),
        "largest_size": {"tokens": largest["tokens"], "mt_bench_tau": largest["mt_bench_tau"]},
        "b_per_doubling": round(b, 4),
        "tokens_for_tau": {str(g): (tokens * 2 ** ((g - tau) / b) if b > 0 else None) for g in GOALS},
    }
