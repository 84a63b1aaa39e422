"""The data round's keys of docs/results-smollm2.json, each read from what a stage or a benchmark wrote:

- `corpus`: the regenerated corpus folder (finished shards and journals, the sessions' clocks);
- `gen_data_throughput`: benchmarks/stages/gen_data_engine.py's JSON (gen-data vs the engine's
  own capacity vs the hf backend, by concurrency);
- `data_scaling`, `data_scaling_fit`, `data_scaling_settings`: benchmarks/stages/data_scaling.py's JSON.

Used by report.py (`--corpus DIR --gen-data-engine FILE --data-scaling FILE`); nothing here measures.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from benchmarks.smollm2.report_long_run import whole_corpus_lines
from eagle3cli.data.finish import throughput
from eagle3cli.data.journal import PROGRESS, STATE
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


def _corpus_line(corpus: dict) -> str:
    state = "complete" if corpus["complete"] else "being regenerated (resumes across sessions)"
    return (
        f"`{corpus['folder']}`, {state}: **{corpus['conversations']:,} of {corpus['planned'] or '?':,} "
        f"conversations**, {corpus['assistant_turns']:,} assistant turns, {corpus['completion_tokens']:,} "
        f"completion tokens, through `{corpus['backend']}` ({(corpus.get('engine') or {}).get('dtype', '?')}); "
        f"{corpus['gen_tok_s']} completion tok/s and {corpus['conversations_per_s']} conversations/s over "
        f"{corpus['sessions']} sessions' generation time ({corpus['generation_seconds']:,.0f} s of clock, "
        f"{corpus.get('process_seconds') or corpus['generation_seconds']:,.0f} process-seconds: one core and "
        f"one engine per process)."
    )


def data_section(data: dict) -> list[str]:
    """The page's section for the `corpus` and `gen_data_throughput` keys ([] when neither is there)."""
    corpus, rows = data.get("corpus"), data.get("gen_data_throughput")
    if not corpus and not rows:
        return []
    lines = [DATA_HEADING, ""]
    if corpus:
        sources = corpus.get("sources") or [corpus]
        if len(sources) > 1:
            lines += [
                f"{len(sources)} sources, one folder each: **{corpus['conversations']:,} of "
                f"{corpus['planned'] or '?':,} conversations**, {corpus['completion_tokens']:,} completion tokens "
                f"in all, {corpus['gen_tok_s']} completion tok/s over their generation time.",
                "",
            ]
        lines += [line for c in sources for line in (_corpus_line(c), "")]
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


SCALING_HEADING = "## Data scaling: acceptance against distinct training data"
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


def _tokens(n, per_sample: float | None) -> str:
    """Distinct tokens, and the samples of this corpus's mean length that hold them."""
    if n is None:
        return "never (tau does not grow with data)"
    text = f"{n / 1e6:,.1f}M distinct tokens" if n >= 1e5 else f"{n:,.0f} distinct tokens"
    return text + (f" (~{n / per_sample:,.0f} samples of this corpus's mean length)" if per_sample else "")


def scaling_section(data: dict) -> list[str]:
    """The page's data-scaling section from its three keys ([] when there is no curve)."""
    rows, fit, s = data.get("data_scaling"), data.get("data_scaling_fit") or {}, data.get("data_scaling_settings") or {}
    if not rows:
        return []
    corpus = s.get("corpus") or {}
    budget = s.get("budget") or {}
    how = (f"{budget['epochs']} epoch(s) over each subset (budget proportional to its size)" if "epochs" in budget
           else f"{budget.get('tokens_per_run'):,} trained tokens per size (equal compute)")  # fmt: skip
    lines = [
        SCALING_HEADING,
        "",
        f"The same recipe on nested subsets of `{s.get('data') or s.get('cache')}` ({'online' if s.get('online') else 'cache'}; "
        f"{corpus.get('samples', '?'):,} trainable samples, {corpus.get('tokens', 0):,} distinct tokens, "
        f"{corpus.get('heldout_samples', '?')} held out), {how}; held-out tau on the one held-out set every "
        "size shares, MT-bench tau from `eagle3 eval` (80 first turns, fp32, greedy, chain, depth 8). "
        "Command: `benchmarks/stages/data_scaling.py` (docs/train.md).",
        "",
        "| fraction | conversations | distinct tokens | trained tokens | held-out tau | MT-bench tau |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['fraction']} | {r['conversations']:,} | {r['tokens']:,} | {r.get('trained_tokens') or 0:,} | "
                     f"{_cell(r.get('heldout_tau'))} | {_cell(r.get('mt_bench_tau'))} |")  # fmt: skip
    if fit.get("a") is not None:
        name = "MT-bench tau" if fit["tau"] == "mt_bench_tau" else "held-out tau"
        err = fit["measured_full"] - fit["predicted_full"]
        lines += [
            "",
            f"**The fit, tested** ({name} = a + b log2(distinct tokens)): fitted on {fit['fit_on']}, it predicted "
            f"**{fit['predicted_full']:.3f}** for the largest size ({fit['largest_tokens']:,} tokens); measured "
            f"**{fit['measured_full']:.3f}** ({err:+.3f}). Fitted on every size: +{fit['fit_all']['b_per_doubling']:.3f} "
            f"tau per doubling of distinct tokens.",
        ]
        want = fit.get("tokens_for_tau") or {}
        per = corpus["tokens"] / corpus["samples"] if corpus.get("samples") else None  # tokens per sample here
        lines.append(
            f"By that fit, {name} 2.5 takes {_tokens(want.get('2.5'), per)} and 3.0 takes "
            f"{_tokens(want.get('3.0'), per)} (an extrapolation: a log law need not hold that far)."
        )
        whole = data.get("data_scaling_whole_corpus")
        if fit.get("predicted_corpus") is not None:
            lines.append(
                f"The largest size measured is {fit['largest_tokens'] / fit['corpus_tokens']:.1%} of the corpus; for "
                f"the whole corpus ({fit['corpus_tokens']:,} tokens, one epoch) the fit says {name} "
                f"**{fit['predicted_corpus']:.3f}**"
                + (" (measured: below)." if whole else " — a prediction until that run is measured.")
            )
        lines += whole_corpus_lines(whole)
        held = fit.get("heldout")
        if held:
            lines.append(
                f"Held-out tau: fitted on {held['fit_on']} it predicted {held['predicted_full']:.3f}, measured "
                f"{held['measured_full']:.3f}; +{held['fit_all']['b_per_doubling']:.3f} per doubling over every size."
            )
    lines += equal_compute_lines(data)
    lines.append("")
    return lines


def equal_compute_lines(data: dict) -> list[str]:
    """The section's equal-compute part (none without `data_scaling_equal_compute`)."""
    rows, s = data.get("data_scaling_equal_compute"), data.get("data_scaling_equal_compute_settings") or {}
    if not rows:
        return []
    budget, fit = s["budget"], s.get("fit") or {}
    one_epoch = {r["fraction"]: r.get("mt_bench_tau") for r in data.get("data_scaling") or []}
    lines = [
        "",
        "### At equal compute: what distinct data is worth apart from training",
        "",
        f"Every size trained {budget['steps_per_run']:,} optimizer steps of {budget['token_budget']:,} padded tokens "
        "(`data_scaling.py --steps-per-run`), so the smaller sizes repeat their data; a size whose one epoch is "
        "that many steps is the same run in both curves (epoch 0's batches, the same schedule). Same recipe, "
        "held-out set and MT-bench eval as above.",
        "",
        "| fraction | distinct tokens | trained tokens | passes | held-out tau | MT-bench tau | at one epoch |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: r["tokens"]):  # fewest tokens first, as the one-epoch table (data_scaling.py
        # writes them in the order its --fractions ran)
        passes = (r.get("trained_tokens") or 0) / r["tokens"]
        shared = " (the one-epoch run)" if r.get("same_run_as") else ""
        lines.append(f"| {r['fraction']}{shared} | {r['tokens']:,} | {r.get('trained_tokens') or 0:,} | {passes:.1f} | "
                     f"{_cell(r.get('heldout_tau'))} | {_cell(r.get('mt_bench_tau'))} | "
                     f"{_cell(one_epoch.get(r['fraction']))} |")  # fmt: skip
    whole = (data.get("data_scaling_fit") or {}).get("fit_all") or {}
    if fit.get("fit_all") and whole:
        b, b1 = fit["fit_all"]["b_per_doubling"], whole["b_per_doubling"]
        lines += ["", f"At equal compute, MT-bench tau grows **{b:+.3f} per doubling of distinct tokens**, against "
                      f"{b1:+.3f} at one epoch per size: {b / b1:.0%} of the one-epoch curve's slope is the data itself, "
                      "the rest is the smaller sizes' shorter training."]  # fmt: skip
    for p in s.get("points") or []:
        on_curve = fit.get("fit_all") and fit["fit_all"]["a"] + fit["fit_all"]["b_per_doubling"] * math.log2(
            p["tokens"]
        )
        lines += ["", f"Another corpus at the same budget: `{p['data']}` ({p['conversations']:,} samples, "
                      f"{p['tokens']:,} distinct tokens) reads MT-bench **{p['mt_bench_tau']:.3f}**"
                      + (f", where the curve's fit says {on_curve:.3f} ({p['mt_bench_tau'] - on_curve:+.3f})."
                         if on_curve else ".")]  # fmt: skip
        near = min(rows, key=lambda r: abs(math.log2(r["tokens"] / p["tokens"])))
        if near.get("mt_bench_tau") is not None:  # measured beside measured: no fit between them
            lines[-1] += (f" The curve's size nearest in distinct tokens ({near['fraction']}, {near['tokens']:,}) "
                          f"reads {near['mt_bench_tau']:.3f}: {p['mt_bench_tau'] - near['mt_bench_tau']:+.3f}.")  # fmt: skip
        b = on_curve and fit["fit_all"]["b_per_doubling"]
        if b and b > 0:  # the human tokens that buy its tau on the fit: what one of its tokens is worth
            worth = p["tokens"] * 2 ** ((p["mt_bench_tau"] - on_curve) / b)
            beyond = max(r["tokens"] for r in rows)
            lines[-1] += (f" On the fit, the curve's corpus buys that tau with {worth:,.0f} distinct tokens: one of "
                          f"this corpus's tokens is worth **{worth / p['tokens']:.2f}** of them at this budget"
                          + (f" (an extrapolation: {worth / beyond:,.0f}x the curve's largest size, on a slope of "
                             f"{b:+.3f} per doubling)." if worth > 2 * beyond else "."))  # fmt: skip
    return lines


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


def _cell(x) -> str:
    return "-" if x is None else f"{x:.3f}"
