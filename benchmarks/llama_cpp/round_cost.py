"""Where a llama-server speculative round's time goes, in plain decoding steps (one plain step = 1).

A round's cost is measured, not modelled: the speculative server's decode time (`timings.predicted_ms`,
summed over the eval's prompts) over its verification steps (llama-server's counters). It is split in
three parts, each from its own measurement:

- draft: llama.cpp's own clock around the EAGLE-3 draft call (`common_speculative` times every
  implementation's `draft()`; the server prints the totals, `dur(b,g,a)`, at log verbosity 4).
  One call per round: it runs the head over the tokens accepted in the last round (their target
  features) and then drafts k tokens;
- verification: one target pass over k+1 tokens, from `llama-bench -p k+1` on the same target.gguf,
  thread count and machine (a batch pass, as the server's verification is);
- overhead: the rest (sampling, acceptance, KV and draft-context bookkeeping, the HTTP slot loop).

The plain step is the plain server's decode time per token in the same eval (interleaved prompts).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

STATS = re.compile(
    r"statistics\s+(?P<name>\S+): #calls\(b,g,a\) = +(?P<b>\d+) +(?P<g>\d+) +(?P<a>\d+).*?"
    r"dur\(b,g,a\) = (?P<tb>[\d.]+), (?P<tg>[\d.]+), (?P<ta>[\d.]+) ms"
)


def spec_stats(log: Path) -> dict | None:
    """The last speculative statistics line of a llama-server log (cumulative over the server's life),
    or None when the server printed none (log verbosity below 4, or no speculation)."""
    last = None
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        m = STATS.search(line)
        if m:
            last = m
    if last is None:
        return None
    return {
        "implementation": last["name"],
        "calls_begin": int(last["b"]),
        "calls_draft": int(last["g"]),
        "calls_accept": int(last["a"]),
        "begin_ms": float(last["tb"]),
        "draft_ms": float(last["tg"]),
        "accept_ms": float(last["ta"]),
    }


def llama_bench(
    binary: Path, gguf: Path, batch_sizes: list[int], threads: int, env: dict, reps: int = 5, depth: int = 256
) -> dict:
    """ms of one target pass over n tokens for each n (`pp n`), and of one decoded token (`tg`), with
    `depth` tokens already in the KV cache (a verification happens after the prompt and some output)."""
    argv = [str(binary), "-m", str(gguf), "-t", str(threads), "-p", ",".join(map(str, batch_sizes)),
            "-n", "32", "-d", str(depth), "-r", str(reps), "-o", "json"]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, env=env, check=True).stdout
    rows = json.loads(out)
    passes = {int(r["n_prompt"]): r["avg_ns"] / 1e6 for r in rows if r["n_gen"] == 0}
    tg = next(r["avg_ns"] / 1e6 / r["n_gen"] for r in rows if r["n_prompt"] == 0 and r["n_gen"] > 0)
    shown = [os.path.relpath(a) if Path(a).is_absolute() and Path(a).is_relative_to(Path.cwd()) else a for a in argv]
    return {"pass_ms": passes, "tg_ms_per_token": tg, "command": " ".join(shown)}  # no machine path in a report


def breakdown(row: dict, stats: dict | None, bench: dict) -> dict | None:
    """One eagle3 row's round, in ms and in plain steps (None without the server's statistics)."""
    k, steps = row["k"], row.get("verify_steps")
    if stats is None or not steps or not row.get("decode_tok_s") or not row.get("plain_decode_tok_s"):
        return None
    plain_ms = 1000.0 / row["plain_decode_tok_s"]
    round_ms = 1000.0 * row["tokens"] / row["decode_tok_s"] / steps
    draft_ms = stats["draft_ms"] / max(stats["calls_draft"], 1)
    verify_ms = bench["pass_ms"].get(k + 1)
    if verify_ms is None:
        return None
    over_ms = round_ms - draft_ms - verify_ms
    ms = {"round": round_ms, "draft": draft_ms, "verify": verify_ms, "overhead": over_ms, "plain_step": plain_ms}
    return {
        "k": k,
        "ms": {key: round(v, 2) for key, v in ms.items()},
        "plain_steps": {key: round(v / plain_ms, 2) for key, v in ms.items() if key != "plain_step"},
        "draft_per_token_plain_steps": round(draft_ms / k / plain_ms, 2),
        "tau": row["tau"],
        "break_even_tau": round(round_ms / plain_ms, 2),  # a round pays when it yields more tokens than this
        "llama_bench_tg_ms": round(bench["tg_ms_per_token"], 2),
        "draft_calls_per_round": round(stats["calls_draft"] / steps, 3),
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| k | tau | round | draft | verification (k+1 tokens) | overhead | draft per drafted token | break-even tau |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r["plain_steps"]
        lines.append(
            f"| {r['k']} | {r['tau']:.3f} | {p['round']:.2f} | {p['draft']:.2f} | {p['verify']:.2f} | "
            f"{p['overhead']:.2f} | {r['draft_per_token_plain_steps']:.2f} | {r['break_even_tau']:.2f} |"
        )
    return "\n".join(lines)


def decoder_rounds(report: dict, head: str = "trained", dtype: str = "fp32") -> list[dict]:
    """eagle3's own decoder, split like llama.cpp's rounds above, from benchmarks/stages/round_cost.py's
    JSON (its `--profile chainK` phases, already in plain steps of the same target and dtype):
    draft = the head's forward + logits + pick; verification = the target's forward over k+1 tokens
    + its logits; overhead = the rest (acceptance, the commit of accepted tokens into the head's
    cache, glue). tau is from the same report's timed chain runs."""
    prof = ((report.get("profile") or {}).get(head) or {}).get(dtype) or {}
    timed = ((report.get("rounds") or {}).get(head) or {}).get(dtype) or {}
    rows = []
    for name, p in sorted(prof.items(), key=lambda kv: int(kv[0][5:]) if kv[0].startswith("chain") else 99):
        if not name.startswith("chain"):
            continue
        k = int(name[5:])
        draft = p.get("draft_forward", 0.0) + p.get("draft_logits_pick", 0.0)
        verify = p.get("verify_forward", 0.0) + p.get("target_logits", 0.0)
        rnd = p["total"]
        rows.append(
            {
                "k": k,
                "tau": (timed.get(name) or {}).get("tau"),
                "plain_steps": {
                    "round": round(rnd, 2),
                    "draft": round(draft, 2),
                    "verify": round(verify, 2),
                    "overhead": round(rnd - draft - verify, 2),
                },
                "draft_per_token_plain_steps": round(draft / k, 2),
                "break_even_tau": round(rnd, 2),
                "speedup_vs_plain": (timed.get(name) or {}).get("speedup_vs_plain"),
            }
        )
    return rows


def side_by_side(llama: list[dict], decoder: list[dict]) -> str:
    """One row per k: each engine's round and its parts, in its own plain steps."""
    by_k = {r["k"]: r for r in decoder}
    lines = [
        "| k | engine | tau | round | draft | verification (k+1 tokens) | overhead | break-even tau |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in llama:
        for name, x in (("llama.cpp", r), ("eagle3 decoder", by_k.get(r["k"]))):
            if x is None:
                continue
            p = x["plain_steps"]
            tau = "-" if x.get("tau") is None else f"{x['tau']:.3f}"
            lines.append(
                f"| {r['k']} | {name} | {tau} | {p['round']:.2f} | {p['draft']:.2f} | {p['verify']:.2f} | "
                f"{p['overhead']:.2f} | {x['break_even_tau']:.2f} |"
            )
    return "\n".join(lines)
