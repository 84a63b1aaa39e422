"""The keys of docs/results-smollm2.json read from what a stage or a benchmark left, one flag per key: `corpus`
(gen-data folders, finished or still growing), `data_scaling*` (data_scaling.py), `engine_speedup.vllm_cpu`
(vllm_cpu/run_bench.py); the other keys are kept, then the page is rendered from the JSON (report_page.py).
Nothing here measures. A benchmark that writes its own key calls benchmarks/common.record; publish.py
writes the published head's keys.

    .venv/bin/python benchmarks/smollm2/report.py --corpus corpora/smollm2-135m-sharegpt-vllm \
        corpora/smollm2-135m-gsm8k-vllm
    .venv/bin/python benchmarks/smollm2/report.py --data-scaling runs/data-scaling/data_scaling.json
    .venv/bin/python benchmarks/smollm2/report.py --vllm-cpu runs/vllm-cpu-smollm2/results.json  # engine_speedup
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repo root, for `benchmarks`
from benchmarks.common import record  # noqa: E402
from benchmarks.smollm2.report_page import PAGE, fail, read_json, rel, write_page  # noqa: E402
from eagle3cli.data.finish import throughput  # noqa: E402
from eagle3cli.data.journal import PROGRESS, STATE  # noqa: E402
from eagle3cli.eval.paired import BLOCKS_ORDER  # noqa: E402
from eagle3cli.readers.jsonl import read_records  # noqa: E402

SUMMED = ("conversations", "assistant_turns", "completion_tokens", "planned", "generation_seconds",
          "process_seconds", "sessions")  # fmt: skip


def corpus_json(folder: Path) -> dict:
    """Conversations and completion tokens in a gen-data folder, finished or not (a corpus made over
    many sessions is reported while it grows: `complete` says which), with its backend and rate."""
    manifest = read_json(folder / "manifest.json")
    records = [r for shard in sorted(folder.glob("shard-*.jsonl")) for r in read_records(shard)]
    for journal in sorted((folder / PROGRESS).glob("shard-*.journal.jsonl")):
        if not (folder / journal.name.replace(".journal", "")).exists():  # a shard still being made
            records += [e["record"] for e in read_records(journal) if "record" in e]
    turns = [t for r in records for t in (r.get("meta") or {}).get("turns") or []]
    # a finished folder's sessions are gone (progress/ is cleared): its manifest keeps their rate
    rate = (manifest or {}).get("throughput") or throughput(folder, 0.0, 0, len(records)) or {}
    state = manifest or read_json(folder / PROGRESS / STATE) or {}
    engine = state.get("engine")
    planned = (state.get("counts") or {}).get("planned") if manifest else state.get("planned")
    backend = f" -> {engine.get('engine')} {engine.get('version') or ''}".rstrip() if engine else ""
    return {"folder": str(folder), "conversations": len(records), "assistant_turns": len(turns),
            "completion_tokens": sum(t.get("completion_tokens", 0) for t in turns), "planned": planned,
            "complete": manifest is not None, "backend": "openai" + backend, "engine": engine,
            "gen_tok_s": rate.get("completion_tok_s"), "conversations_per_s": rate.get("conversations_per_s"),
            "generation_seconds": rate.get("seconds"),  # clock time; side-by-side `--shard` processes count once
            "process_seconds": rate.get("process_seconds"), "sessions": rate.get("sessions")}  # fmt: skip


def corpus_sources_json(folders: list[Path]) -> dict:
    """The `corpus` key: one folder's corpus_json, or for a corpus kept one folder per source (ShareGPT,
    GSM8K...) their sums, each source's own numbers under `sources`, and the rate over all of them."""
    parts = [corpus_json(f) for f in folders]
    if len(parts) == 1:
        return parts[0]
    backends, total = sorted({p["backend"] for p in parts}), {k: sum(p[k] or 0 for p in parts) for k in SUMMED}
    seconds = total["generation_seconds"]
    return {"folder": " + ".join(p["folder"] for p in parts), **total, "complete": all(p["complete"] for p in parts),
            "backend": " / ".join(backends),  # one per source: a source never mixes backends within itself
            "engine": parts[0]["engine"] if len(backends) == 1 else None,
            "gen_tok_s": round(total["completion_tokens"] / seconds, 1) if seconds else None,
            "conversations_per_s": round(total["conversations"] / seconds, 3) if seconds else None,
            "sources": parts}  # fmt: skip


# commands: each row's train and eval command lines, so data_scaling.py --reuse docs/results-smollm2.json
# grows the committed curve on a fresh machine instead of retraining its sizes
ROW_KEYS = ("fraction", "conversations", "tokens", "trained_tokens", "heldout_tau", "mt_bench_tau", "commands")


def data_scaling_json(bench: Path) -> tuple[list[dict], dict, dict]:
    """`data_scaling` rows, `data_scaling_fit` (MT-bench's fit when the sizes were evaluated, else the
    held-out one; the held-out fit under `heldout`) and the settings, from data_scaling.py's JSON."""
    r = json.loads(bench.read_text(encoding="utf-8"))
    # same_run_as: a size an equal-compute curve shares with the one-epoch curve (data_scaling.py --reuse);
    # a curve run from another checkout names its runs by absolute path: made relative (no machine path)
    rows = [{**{k: row.get(k) for k in ROW_KEYS}, **{k: row[k] for k in ("same_run_as",) if k in row}}
            for row in r["rows"]]  # fmt: skip
    for row in rows:
        row["commands"] = [
            re.sub(r"(?<![^\s=])/[^\s'\"]+", lambda m: rel(m.group(0)), c) for c in row["commands"] or []
        ]
    fits = r.get("fits") or {}
    fit = {"tau": "mt_bench_tau" if fits.get("mt_bench_tau") else "heldout_tau",
           **(fits.get("mt_bench_tau") or fits.get("heldout_tau") or {})}  # fmt: skip
    if fits.get("mt_bench_tau") and fits.get("heldout_tau"):
        fit["heldout"] = fits["heldout_tau"]
    return rows, fit, {k: r[k] for k in ("data", "cache", "online", "budget", "corpus") if r.get(k) is not None}


def equal_compute_json(curve: Path, others: list[Path]) -> dict:
    """`data_scaling_equal_compute` and its settings: data_scaling.py's curve at one step budget (every size the
    same optimizer steps) and, from `others`, other corpora trained at that budget with the same recipe and eval
    (e.g. the target's own prompts), each a point beside the curve. ValueError: not one budget and recipe."""
    rows, fit, settings = data_scaling_json(curve)
    budget = settings.get("budget") or {}
    if "steps_per_run" not in budget:
        raise ValueError(f"{curve} was trained at {budget or 'no budget'}, not at equal compute (--steps-per-run)")

    def how(cmds) -> list[str]:  # how a size trains and is scored, not where or on what
        return [re.sub(r"--(run|data|cache|train-samples) \S+", r"--\1 X", c or "") for c in cmds]

    points = []
    for other in others:
        o_rows, _fit, o = data_scaling_json(other)
        for r in o_rows:
            if o.get("budget") != budget or how(r["commands"]) != how(rows[0]["commands"]) or r["mt_bench_tau"] is None:
                raise ValueError(f"{other}: {r['fraction']} is not trained at the curve's budget {budget} with its "
                                 "recipe and scored by its eval")  # fmt: skip
            points.append({"data": o.get("data") or o.get("cache"), **r})
    return {"data_scaling_equal_compute": rows,
            "data_scaling_equal_compute_settings": {**settings, "fit": fit, "points": points}}  # fmt: skip


def vllm_engine_json(results: Path) -> dict:
    """`engine_speedup.vllm_cpu` from run_bench.py's results.json: per k the speed-up of each run
    (speculative tok/s over plain tok/s, measured in the same eval), their geometric mean, engine tau,
    eval's own chain tau and greedy equality; the best k is the highest mean speed-up."""
    r = json.loads(results.read_text(encoding="utf-8", errors="replace"))
    if not (engine := (r.get("engine") if isinstance(r, dict) else None) or {}):
        raise ValueError(f"{results} has no `engine` rows: run benchmarks/vllm_cpu/run_bench.py with --head")
    rows = []
    for key, runs in engine.items():
        dtype, k = key.split("-k")
        speedups = [x["tok_s"] / x["plain_tok_s"] for x in runs]
        rows.append({"dtype": dtype, "k": int(k), "tau": runs[0]["tau"],
                     "eval_tau": (r.get("eval") or {}).get(key, {}).get("tau"),
                     "speedup_runs": [round(x, 4) for x in speedups],
                     "speedup_intervals": [x.get("speedup_interval") for x in runs],
                     "order": runs[0].get("order") or BLOCKS_ORDER,
                     "speedup_vs_plain": round(math.exp(sum(map(math.log, speedups)) / len(speedups)), 4),
                     **{f: [round(x[f], 2) for x in runs] for f in ("tok_s", "plain_tok_s")},
                     "identical": all(x["outputs_differ"] == 0 for x in runs),
                     "outputs_differ": [x["outputs_differ"] for x in runs]})  # fmt: skip
    best = max(rows, key=lambda x: x["speedup_vs_plain"])
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(results.stat().st_mtime))  # a result that records none
    return {**{k: best[k] for k in ("k", "dtype", "tau", "speedup_vs_plain", "identical")}, "rows": rows,
            "settings": {k: r.get(k) for k in ("target", "head", "bench", "num_prompts", "max_new_tokens")},
            "measured_at": r.get("measured_at") or when, "commands": r.get("commands")}  # fmt: skip


FLAGS = {  # flag: (nargs, metavar, help, the keys it writes from the path(s) given)
    "--corpus": ("+", "GEN_DATA_DIR", "`corpus` from these gen-data folders (one per source: their sums and each one)",
                 lambda p: {"corpus": corpus_sources_json(p)}),
    "--data-scaling": (None, "SCALING_JSON", "the `data_scaling` keys from benchmarks/stages/data_scaling.py's JSON",
                       lambda p: dict(zip(("data_scaling", "data_scaling_fit", "data_scaling_settings"),
                                          data_scaling_json(p)))),
    "--data-scaling-equal-compute": ("+", "SCALING_JSON", "`data_scaling_equal_compute` from data_scaling.py's JSON "
                                     "of a --steps-per-run curve; more JSONs: other corpora at that budget",
                                     lambda p: equal_compute_json(p[0], p[1:])),
    "--vllm-cpu": (None, "RESULTS_JSON", "`engine_speedup.vllm_cpu` from benchmarks/vllm_cpu/run_bench.py's results",
                   lambda p: {"engine_speedup.vllm_cpu": vllm_engine_json(p)}),
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
