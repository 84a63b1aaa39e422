"""SmolLM2 + its EAGLE-3 head in llama.cpp's llama-server against plain llama-server, and against
llama.cpp's n-gram speculators (no head): the numbers of docs/results-serve.md's llama.cpp section.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/llama_cpp/run_bench.py --ks 1,2,3,4 --prompts 10 --max-tokens 128

Steps, each an eagle3 command where one exists: `eagle3 export --format gguf` (head + target, f32,
checked), a plain llama-server (no draft) kept running, then per k `eagle3 serve --engine llama.cpp
--steps k` and `eagle3 eval --endpoint SPEC --base-endpoint PLAIN` (greedy, MT-bench, token ids in,
tau from llama-server's counters, outputs compared token for token, speed-up from one run each), then
the same eval against llama-server started with `--spec-type ngram-*`. One thread per server
(`-t 1`), one slot. Then where a round's time goes (round_cost.py: llama-server's own draft clock
at `-lv 4`, `llama-bench` for the verification pass); `--eval-tau` adds eagle3 eval's decoder tau
at each k (fp32) beside the engine's. Prints one JSON object (also OUT/results.json; `--record
docs/results-smollm2.json` writes it as that page's `llama_cpp` key, then benchmarks/smollm2/report_page.py
renders the page). Needs `make llama-cpp` and models/smollm2-135m (`make smollm2`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repo root, for `benchmarks`
from benchmarks.common import E3, REPO, Recorder, record  # noqa: E402
from eagle3cli.engines.engine_api import is_healthy  # noqa: E402
from eagle3cli.engines.local_engine import free_port, which_llama_server  # noqa: E402

ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", COLUMNS="200")
SERVER_ARGS = ["-t", "1", "-tb", "1", "-np", "1", "-c", "4096", "--no-webui"]
STATS_ARGS = ["-lv", "4"]  # llama-server then logs its speculative timings (round_cost.py reads them)
NGRAMS = ("ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache")
RECORDER = Recorder()


@contextlib.contextmanager
def server(argv: list, port: int, log: Path, timeout_s: float = 900):
    """A process (group) serving on `port` until the block ends; SIGTERM, then SIGKILL."""
    print(f"\n$ {RECORDER.show(argv)}", flush=True)
    RECORDER.commands.append(RECORDER.show(argv))
    with open(log, "ab") as f:
        proc = subprocess.Popen([str(a) for a in argv], cwd=REPO, env=ENV, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + timeout_s
        while not is_healthy(f"http://127.0.0.1:{port}/health"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"server on {port} did not start: see {log}")
            time.sleep(1)
        time.sleep(4)  # eagle3 serve compares the tokenizer once healthy
        if proc.poll() is not None:
            raise SystemExit(f"server on {port} stopped after starting: see {log}")
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def measure(spec: str, plain: str, out: Path, args) -> dict:
    RECORDER.sh(
        [*E3, "eval", "--endpoint", spec, "--base-endpoint", plain, "--target", args.target, "--bench", args.bench,
         "--num-prompts", args.prompts, "--max-new-tokens", args.max_tokens, "--overwrite", "--out", out],
        env=ENV,
    )  # fmt: skip
    r = json.loads((out / "report.json").read_text())
    b = r["baseline"]
    return {
        "tau": r["tau"],
        "draft_n": r["draft_n"],
        "draft_n_accepted": r["draft_n_accepted"],
        "per_position": r["per_position"],
        "tokens": r["tokens"],
        "tok_s": r["tokens_per_s_sequential"],
        "plain_tok_s": b["tokens_per_s_sequential"],
        "verify_steps": r["verify_steps"],
        "decode_tok_s": r["decode_tokens_per_s"],
        "plain_decode_tok_s": b["decode_tokens_per_s"],
        "speedup": b["speedup"],
        "decode_speedup": b["decode_speedup"],
        "outputs_differ": b["outputs_differ"],
        "first_difference": b["first_difference"],
    }


def decoder_tau(k: int, out: Path, args) -> float:
    """eagle3 eval's own decoder on the same head, prompts, chain length and tokens (fp32, greedy)."""
    RECORDER.sh(
        [*E3, "eval", "--head", args.head, "--target", args.target, "--bench", args.bench, "--num-prompts",
         args.prompts, "--max-new-tokens", args.max_tokens, "--depth", k, "--mode", "chain", "--dtype", "fp32",
         "--threads", "1", "--no-generate-baseline", "--overwrite", "--out", out],
        env=ENV,
    )  # fmt: skip
    heads = json.loads((out / "report.json").read_text())["heads"]
    return float(next(iter(heads.values()))["chain"]["acceptance"]["tau"])


def _name(row: dict) -> str:
    return row["speculator"] if row["k"] is None else f"{row['speculator']} k={row['k']}"


def summarise(rows: list[dict]) -> dict:
    """The best k and the speed-ups of the results page. An n-gram speculator that drafted nothing ran
    as plain llama-server: its "speed-up" is the noise of the machine, so it is not a candidate."""
    heads = [r for r in rows if r["speculator"] == "eagle3" and r["speedup"]]
    ngrams = [r for r in rows if r["speculator"] != "eagle3" and r["speedup"] and r["draft_n"]]
    best = max(heads, key=lambda r: r["speedup"], default=None)
    best_ngram = max(ngrams, key=lambda r: r["speedup"], default=None)
    return {
        "best_k": best["k"] if best else None,
        "best_speedup_vs_plain": best["speedup"] if best else None,
        "best_ngram_speedup_vs_plain": best_ngram["speedup"] if best_ngram else None,
        "best_ngram": best_ngram["speculator"] if best_ngram else None,
        "ngrams_that_drafted_nothing": [
            r["speculator"] for r in rows if r["speculator"] != "eagle3" and not r["draft_n"]
        ],
        "identical": all(r["outputs_differ"] == 0 for r in rows),
        "greedy_outputs_identical": {
            _name(r): f"{len(r['first_difference']) - r['outputs_differ']}/{len(r['first_difference'])}" for r in rows
        },
        "rows": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="models/smollm2-135m")
    ap.add_argument("--head", default="models/smollm2-135m-eagle3")
    ap.add_argument("--ks", default="1,2,3,4")
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--bench", default="mt_bench", help="eval's --bench (the tiny target: gsm8k)")
    ap.add_argument("--eval-tau", action="store_true", help="also eagle3 eval's decoder tau at each k (fp32)")
    ap.add_argument("--no-breakdown", action="store_true", help="skip the per-round cost breakdown (llama-bench)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--ngrams", default=",".join(NGRAMS), help="n-gram speculators to compare ('' for none)")
    ap.add_argument("--out", type=Path, default=Path("runs/llama-cpp-bench"))
    ap.add_argument("--record", type=Path, metavar="RESULTS_JSON", help="also as its `llama_cpp` key")
    args = ap.parse_args()
    binary = which_llama_server()
    if binary is None:
        raise SystemExit("llama-server is not built here: run `make llama-cpp`")
    out = REPO / args.out
    out.mkdir(parents=True, exist_ok=True)
    gguf = out / "gguf"
    if not (gguf / "manifest.json").is_file():
        RECORDER.sh(
            [*E3, "export", "--head", args.head, "--format", "gguf", "--target", args.target, "--out", gguf], env=ENV
        )
    rows = []
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load_start = os.getloadavg()
    port_plain = free_port()
    plain_argv = [binary, "-m", gguf / "target.gguf", "--port", port_plain, "--metrics", *SERVER_ARGS]
    with server(plain_argv, port_plain, out / "plain.log") as plain:
        for k in [int(x) for x in args.ks.split(",") if x]:
            port = free_port()
            argv = [*E3, "serve", "--engine", "llama.cpp", "--target", args.target, "--head", gguf, "--steps", k,
                    "--port", port, "--", *SERVER_ARGS, *STATS_ARGS]  # fmt: skip
            (out / f"eagle3-k{k}.log").unlink(missing_ok=True)  # the breakdown reads this run's statistics
            with server(argv, port, out / f"eagle3-k{k}.log") as spec:
                rows.append({"speculator": "eagle3", "k": k, **measure(spec, plain, out / f"eval-eagle3-k{k}", args)})
            if args.eval_tau:
                rows[-1]["decoder_tau"] = decoder_tau(k, out / f"decoder-k{k}", args)
                rows[-1]["engine_vs_decoder_tau"] = round(rows[-1]["tau"] / rows[-1]["decoder_tau"], 4)
            print(json.dumps(rows[-1]), flush=True)
        for kind in [x for x in args.ngrams.split(",") if x]:
            port = free_port()
            argv = [binary, "-m", gguf / "target.gguf", "--port", port, "--metrics", "--spec-type", kind, *SERVER_ARGS]
            with server(argv, port, out / f"{kind}.log") as spec:
                rows.append({"speculator": kind, "k": None, **measure(spec, plain, out / f"eval-{kind}", args)})
            print(json.dumps(rows[-1]), flush=True)
    costs = None
    heads = [r for r in rows if r["speculator"] == "eagle3"]
    if heads and not args.no_breakdown:
        from benchmarks.llama_cpp.round_cost import breakdown, llama_bench, spec_stats, table

        bench = llama_bench(Path(binary).with_name("llama-bench"), gguf / "target.gguf",
                            sorted({1, *(r["k"] + 1 for r in heads)}), 1, ENV)  # fmt: skip
        RECORDER.commands.append(bench["command"])
        costs = {"llama_bench": bench, "rounds": []}
        for r in heads:
            b = breakdown(r, spec_stats(out / f"eagle3-k{r['k']}.log"), bench)
            if b is not None:
                costs["rounds"].append(b)
        print(table(costs["rounds"]), flush=True)
    result = {
        "llama_cpp": {**summarise(rows), "round_cost": costs},
        "measured_at": started,
        "machine": {
            "cpu_cores": os.cpu_count(),
            "load_average_1_5_15_min": {"start": load_start, "end": os.getloadavg()},
        },
        "settings": {
            "prompts": args.prompts,
            "max_tokens": args.max_tokens,
            "bench": args.bench,
            "target": args.target,
            "head": args.head,
            "server_args": SERVER_ARGS,
        },  # fmt: skip
        "commands": RECORDER.commands,
    }
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    if args.record:
        keys = ("measured_at", "machine", "settings", "commands")
        record(args.record, "llama_cpp", {**result["llama_cpp"], **{k: result[k] for k in keys}})


if __name__ == "__main__":
    main()
