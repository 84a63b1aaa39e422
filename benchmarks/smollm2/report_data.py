"""The data round's keys of docs/results-smollm2.json, each read from what a stage or a benchmark wrote:

- `corpus`: the regenerated corpus folder (finished shards and journals, the sessions' clocks);
- `gen_data_throughput`: benchmarks/stages/gen_data_engine.py's JSON (gen-data vs the engine's
  own capacity vs the hf backend, by concurrency);
- `data_scaling`, `data_scaling_fit`, `data_scaling_settings`: benchmarks/stages/data_scaling.py's JSON;
- `engine_speedup.vllm_cpu`: benchmarks/vllm_cpu/run_bench.py's results.json (SmolLM2 + a head in
  vLLM's CPU build against plain vLLM, greedy, two runs per k): the best k by its measured speed-up.

Used by report.py (`--corpus DIR --gen-data-engine FILE --data-scaling FILE --vllm-cpu FILE`); nothing
here measures and nothing here writes Markdown (report_page.py renders the keys).
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

from eagle3cli.data.finish import throughput
from eagle3cli.data.journal import PROGRESS, STATE
from eagle3cli.eval.paired import BLOCKS_ORDER
from eagle3cli.readers.jsonl import read_records

REPO = Path(__file__).resolve().parents[2]


def corpus_json(folder: Path) -> dict:
    """Conversations and completion tokens in a gen-data folder, finished or not (a corpus made over
    many sessions is reported while it grows: `complete` says which), with its backend and rate."""
    manifest_path = folder / "manifest.json"
    manifest = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.exists() else None
    records = [r for shard in sorted(folder.glob("shard-*.jsonl")) for r in read_records(shard)]
    for journal in sorted((folder / PROGRESS).glob("shard-*.journal.jsonl")):
        if not (folder / journal.name.replace(".journal", "")).exists():  # a shard still being made
            records += [e["record"] for e in read_records(journal) if "record" in e]
    tokens = sum(t.get("completion_tokens", 0) for r in records for t in (r.get("meta") or {}).get("turns") or [])
    # a finished folder's sessions are gone (progress/ is cleared): its manifest keeps their rate
    rate = (manifest or {}).get("throughput") or throughput(folder, 0.0, 0, len(records)) or {}
    engine = _engine(folder, manifest)
    planned = _planned(folder, manifest)
    return {
        "folder": str(folder),
        "conversations": len(records),
        "assistant_turns": sum(len((r.get("meta") or {}).get("turns") or []) for r in records),
        "completion_tokens": tokens,
        "planned": planned,
        "complete": manifest is not None,
        "backend": "openai" + (f" -> {engine.get('engine')} {engine.get('version') or ''}".rstrip() if engine else ""),
        "engine": engine,
        "gen_tok_s": rate.get("completion_tok_s"),
        "conversations_per_s": rate.get("conversations_per_s"),
        "generation_seconds": rate.get("seconds"),  # clock time; side-by-side `--shard` processes count once
        "process_seconds": rate.get("process_seconds"),
        "sessions": rate.get("sessions"),
    }


def corpus_sources_json(folders: list[Path]) -> dict:
    """The `corpus` key: one folder's corpus_json, or for a corpus kept one folder per source (ShareGPT,
    GSM8K...) their sums, each source's own numbers under `sources`, and the rate over all of them."""
    parts = [corpus_json(f) for f in folders]
    if len(parts) == 1:
        return parts[0]
    backends = sorted({p["backend"] for p in parts})
    total = {
        k: sum(p[k] or 0 for p in parts)
        for k in (
            "conversations",
            "assistant_turns",
            "completion_tokens",
            "planned",
            "generation_seconds",
            "process_seconds",
            "sessions",
        )
    }
    seconds = total["generation_seconds"]
    return {
        "folder": " + ".join(p["folder"] for p in parts),
        **total,
        "complete": all(p["complete"] for p in parts),
        "backend": " / ".join(backends),  # one per source: a source never mixes backends within itself
        "engine": parts[0]["engine"] if len(backends) == 1 else None,
        "gen_tok_s": round(total["completion_tokens"] / seconds, 1) if seconds else None,
        "conversations_per_s": round(total["conversations"] / seconds, 3) if seconds else None,
        "sources": parts,
    }


def _state(folder: Path) -> dict:
    p = folder / PROGRESS / STATE
    return json.loads(p.read_text(encoding="utf-8")) if p.exists() else {}


def _engine(folder: Path, manifest: dict | None) -> dict | None:
    return (manifest or {}).get("engine") or _state(folder).get("engine")


def _planned(folder: Path, manifest: dict | None) -> int | None:
    if manifest is not None:
        return (manifest.get("counts") or {}).get("planned")
    return _state(folder).get("planned")


def gen_data_throughput_json(bench: Path) -> tuple[list[dict], dict]:
    """`gen_data_throughput` rows, and the settings they were measured under (`gen_data_throughput_settings`)."""
    r = json.loads(bench.read_text(encoding="utf-8"))
    hf = r.get("hf") or {}
    rows = [
        {
            "concurrency": row["concurrency"],
            "prompts": row["prompts"],
            "gen_data_tok_s": row["gen_data_tok_s"],
            "engine_tok_s": row["engine_tok_s"],
            "hf_tok_s": row.get("hf_tok_s", hf.get("tok_s")),
            "gen_data_vs_engine": row["ratio"],
            "gen_data_vs_hf": row.get("vs_hf"),
            "runs": row.get("runs"),
            "same_texts": row.get("same_texts"),
        }
        for row in r["rows"]
    ]
    settings = {k: r.get(k) for k in ("target", "input", "max_new_tokens", "engine", "threads", "hf")}
    settings["target"] = _repo_relative(settings["target"])  # no machine path on a committed page
    if isinstance(settings.get("engine"), dict) and settings["engine"].get("python"):
        settings["engine"] = {**settings["engine"], "python": _repo_relative(settings["engine"]["python"])}
    return rows, settings


def _repo_relative(path: str | None) -> str | None:
    if path is None or not Path(path).is_absolute():
        return path
    return str(Path(path).relative_to(REPO)) if Path(path).is_relative_to(REPO) else Path(path).name


# commands: each row's train and eval command lines, so data_scaling.py --reuse docs/results-smollm2.json
# grows the committed curve on a fresh machine instead of retraining its sizes
ROW_KEYS = ("fraction", "conversations", "tokens", "trained_tokens", "heldout_tau", "mt_bench_tau", "commands")


def data_scaling_json(bench: Path) -> tuple[list[dict], dict, dict]:
    """`data_scaling` rows, `data_scaling_fit` (MT-bench's fit when the sizes were evaluated, else the
    held-out one; the held-out fit under `heldout`) and the settings, from data_scaling.py's JSON."""
    r = json.loads(bench.read_text(encoding="utf-8"))
    # same_run_as: a size an equal-compute curve shares with the one-epoch curve (data_scaling.py --reuse)
    rows = [{**{k: row.get(k) for k in ROW_KEYS}, **{k: row[k] for k in ("same_run_as",) if k in row}}
            for row in r["rows"]]  # fmt: skip
    for row in rows:  # a curve run from another checkout with --out into this one names its runs by absolute path
        row["commands"] = [_command_repo_relative(c) for c in row["commands"] or []]
    fits = r.get("fits") or {}
    main = fits.get("mt_bench_tau") or fits.get("heldout_tau") or {}
    fit = {"tau": "mt_bench_tau" if fits.get("mt_bench_tau") else "heldout_tau", **main}
    if fits.get("mt_bench_tau") and fits.get("heldout_tau"):
        fit["heldout"] = fits["heldout_tau"]
    settings = {k: r.get(k) for k in ("data", "cache", "online", "budget", "corpus") if r.get(k) is not None}
    return rows, fit, settings


def _command_repo_relative(command: str) -> str:
    """A command with every absolute path inside this repository made relative to it (the page's JSON names no
    folder of the machine that ran it: tests/unit/test_portable_repo.py)."""

    def rel(m: re.Match) -> str:
        path = Path(m.group(0))
        return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else m.group(0)

    return re.sub(r"(?<![^\s=])/[^\s'\"]+", rel, command)


def equal_compute_json(curve: Path, others: list[Path]) -> dict:
    """`data_scaling_equal_compute` and its settings: data_scaling.py's curve at one step budget (every size the
    same optimizer steps) and, from `others`, other corpora trained at that budget with the same recipe and eval
    (e.g. the target's own prompts), each a point beside the curve. ValueError: not one budget and recipe."""
    rows, fit, settings = data_scaling_json(curve)
    budget = settings.get("budget") or {}
    if "steps_per_run" not in budget:
        raise ValueError(f"{curve} was trained at {budget or 'no budget'}, not at equal compute (--steps-per-run)")
    how = [_how(c) for c in rows[0]["commands"]]
    points = []
    for other in others:
        o_rows, _fit, o = data_scaling_json(other)
        for r in o_rows:
            if o.get("budget") != budget or [_how(c) for c in r["commands"]] != how or r["mt_bench_tau"] is None:
                raise ValueError(f"{other}: {r['fraction']} is not trained at the curve's budget {budget} with its "
                                 "recipe and scored by its eval")  # fmt: skip
            points.append({"data": o.get("data") or o.get("cache"), **r})
    return {"rows": rows, "fit": fit, "settings": settings, "points": points}


def _how(command: str | None) -> str:
    """A command without its run folder, corpus and size: how it trains or scores, not where or on what."""
    return re.sub(r"--(run|data|cache|train-samples) \S+", r"--\1 X", command or "")


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
