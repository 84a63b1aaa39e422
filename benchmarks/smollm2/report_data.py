"""The data round's keys of docs/results-smollm2.json, each read from what a stage or a benchmark wrote:

- `corpus`: the regenerated corpus folder (finished shards and journals, the sessions' clocks);
- `gen_data_throughput`: benchmarks/stages/gen_data_engine.py's JSON (gen-data vs the engine's
  own capacity vs the hf backend, by concurrency).

Used by report.py (`--corpus DIR --gen-data-engine FILE`); nothing here measures.
"""

from __future__ import annotations

import json
from pathlib import Path

from eagle3cli.data.journal import PROGRESS, STATE
from eagle3cli.data.run import throughput
from eagle3cli.jsonl import read_records


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
    rate = throughput(folder, 0.0, 0, len(records)) or {}
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
    repo = Path(__file__).resolve().parents[2]
    return str(Path(path).relative_to(repo)) if Path(path).is_relative_to(repo) else Path(path).name


def throughput_table(rows: list[dict]) -> str:
    """The markdown table docs/gen-data.md shows (the same numbers as the JSON key)."""
    head = "| concurrency | prompts | gen-data tok/s | plain client tok/s (engine) | gen-data / engine | hf tok/s | gen-data / hf |"
    lines = [head, "|---|---|---|---|---|---|---|"]
    for r in rows:
        hf = "-" if r["hf_tok_s"] is None else f"{r['hf_tok_s']:.1f}"
        vs = "-" if r["gen_data_vs_hf"] is None else f"{r['gen_data_vs_hf']:.1f}x"
        lines.append(
            f"| {r['concurrency']} | {r['prompts']} | {r['gen_data_tok_s']:.1f} | {r['engine_tok_s']:.1f} | "
            f"{r['gen_data_vs_engine']:.2f}x | {hf} | {vs} |"
        )
    return "\n".join(lines)


DATA_HEADING = "## Data at engine speed: the corpus and gen-data's throughput"


def data_section(data: dict) -> list[str]:
    """The page's section for the `corpus` and `gen_data_throughput` keys ([] when neither is there)."""
    corpus, rows = data.get("corpus"), data.get("gen_data_throughput")
    if not corpus and not rows:
        return []
    lines = [DATA_HEADING, ""]
    if corpus:
        state = "complete" if corpus["complete"] else "being regenerated (resumes across sessions)"
        lines += [
            f"`{corpus['folder']}`, {state}: **{corpus['conversations']:,} of {corpus['planned'] or '?':,} "
            f"conversations**, {corpus['assistant_turns']:,} assistant turns, {corpus['completion_tokens']:,} "
            f"completion tokens, through `{corpus['backend']}` ({(corpus.get('engine') or {}).get('dtype', '?')}); "
            f"{corpus['gen_tok_s']} completion tok/s and {corpus['conversations_per_s']} conversations/s over "
            f"{corpus['sessions']} sessions' generation time ({corpus['generation_seconds']:,.0f} s of clock, "
            f"{corpus.get('process_seconds') or corpus['generation_seconds']:,.0f} process-seconds: one core and "
            f"one engine per process).",
            "",
        ]
    if rows:
        s = data.get("gen_data_throughput_settings") or {}
        eng = s.get("engine") or {}
        lines += [
            f"gen-data against the engine's own capacity (a plain client sending the same requests to the same "
            f"server) and the hf backend: `benchmarks/stages/gen_data_engine.py`, {s.get('target')}, "
            f"{eng.get('version') or eng.get('endpoint')} {eng.get('dtype', '')}, {s.get('max_new_tokens')} new "
            f"tokens, greedy; ratios of ABBA runs (gen-data, client, client, gen-data) on one server. hf: the "
            f"embedded backend on the first {(s.get('hf') or {}).get('prompts', '?')} of the same prompts once the "
            f"engine was stopped (batches padded to their longest prompt).",
            "",
            throughput_table(rows),
            "",
        ]
    return lines


def replace_section(md: str, lines: list[str], before: str, heading: str = DATA_HEADING) -> str:
    """`md` with the section under `heading` replaced (or inserted before the heading that starts
    with `before`)."""
    text = md.splitlines()
    start = next((i for i, x in enumerate(text) if x.startswith(heading)), None)
    if start is not None:
        end = next((i for i in range(start + 1, len(text)) if text[i].startswith("## ")), len(text))
        del text[start:end]
        at = start
    else:
        at = next((i for i, x in enumerate(text) if x.startswith(before)), len(text))
    text[at:at] = lines
    return "\n".join(text) + ("\n" if md.endswith("\n") else "")
