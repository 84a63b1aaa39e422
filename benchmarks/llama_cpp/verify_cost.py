"""What a verification costs in llama.cpp on this CPU, by the target's weight type: one target pass
over n = 1..5 tokens (`llama-bench -p n -d 256`, one thread unless `--threads`), in units of a decoded token (`-n`:
what plain decoding pays per token; llama-bench's 1-token `-p` pass is slower than that on this CPU).

A round of EAGLE-3 at chain length k verifies k+1 tokens, so this ratio at n = k+1 is the least a
round can cost in plain steps (the draft and the server's bookkeeping come on top), and a head pays
only above it. The weight type decides how much a pass over more tokens re-uses what a 1-token pass
already paid for (the weights' memory traffic) and how much is new arithmetic:

    .llama-cpp/build/bin/...   (make llama-cpp)
    eagle3 export --format gguf --target models/smollm2-135m --dtype bf16 --out runs/gguf-target-bf16
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/llama_cpp/verify_cost.py \\
        f32=runs/llama-cpp-bench/gguf/target.gguf bf16=runs/gguf-target-bf16/target.gguf --out runs/verify-cost.json

Prints a markdown table; writes the JSON (pass ms and ratios per type, the commands) with --out.

**Break-even tau** (issue 53: which target can a head pay on in llama.cpp?). A round at chain length
k costs pass(k+1) + its draft + the server's per-round overhead, in decoded tokens, and yields tau
tokens: it pays when tau exceeds that sum. `--threads 1,2` measures each GGUF at each thread count.
The draft and the overhead, per target LABEL:

- measured, with `--head LABEL=HEAD.gguf` (a head exported for that target): llama-server with the
  head at each k of `--ks` (`-lv 4`: llama.cpp's own clock around every `draft()` call, read as
  round_cost.py does) and a plain llama-server, a few MT-bench prompts each; round = the speculative
  server's decode ms per draft call, draft = that clock per call, overhead = round - draft -
  llama-bench's pass over k+1, all in the plain server's decode ms per token;
- else a **lower bound** from weight bytes: a draft step reads one decoder layer (q/k/v over the
  2h-wide [embedding, hidden] input) + the draft vocab's lm_head (`--draft-vocab`) in `--head-type`
  weights; the round also reads fc (3h -> h) once; over the bytes a decoded token of the target reads
  (every tensor but token_embd, unless the lm_head is tied to it). No overhead: unmeasurable without
  a head the engine can run on that target.

    eagle3 export --head models/smollm2-135m-eagle3 --format gguf --target models/smollm2-135m --out runs/smollm2-gguf
    make qwen-coder   # the GGUF in eagle3's cache
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/llama_cpp/verify_cost.py --threads 1,2 \\
        smollm2=runs/smollm2-gguf/target.gguf qwen-coder=~/.cache/eagle3/qwen2.5-coder-0.5b/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \\
        --head smollm2=runs/smollm2-gguf/head.gguf --head-type bf16,q8_0 --draft-vocab 16384,32000 --out runs/break-even.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repo root, for `benchmarks`
from benchmarks.llama_cpp.round_cost import llama_bench, spec_stats  # noqa: E402
from eagle3cli.engines.local_engine import which_llama_server  # noqa: E402

BYTES_PER_WEIGHT = {"f32": 4.0, "bf16": 2.0, "f16": 2.0, "q8_0": 34 / 32, "q4_k": 144 / 256}


def measure(label: str, gguf: Path, binary: Path, reps: int, threads: int = 1) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    b = llama_bench(binary, gguf, [1, 2, 3, 4, 5], threads, env, reps=reps)
    one = b["tg_ms_per_token"]  # a plain decoding step
    return {
        "type": label,
        "threads": threads,
        "gguf_bytes": gguf.stat().st_size,
        "pass_ms": {n: round(ms, 3) for n, ms in sorted(b["pass_ms"].items())},
        "pass_vs_tg": {n: round(ms / one, 3) for n, ms in sorted(b["pass_ms"].items())},
        "tg_ms_per_token": round(b["tg_ms_per_token"], 3),
        "command": b["command"],
    }


def weight_shares(gguf: Path, draft_vocab: int, head_types: list[str]) -> dict:
    """Lower bounds on a draft step's and a round's fc cost, in decoded tokens of the target, from weight
    bytes (decoding a token of these sizes is bound by reading the weights)."""
    import gguf as gg

    r = gg.GGUFReader(str(gguf))
    arch = r.get_field("general.architecture").contents()

    def meta(key: str) -> int:
        return int(r.get_field(f"{arch}.{key}").contents())

    h, inter = meta("embedding_length"), meta("feed_forward_length")
    heads, kv = meta("attention.head_count"), meta("attention.head_count_kv")
    names = {t.name for t in r.tensors}
    tied = "output.weight" not in names  # then the lm_head reads token_embd
    target = sum(int(t.n_bytes) for t in r.tensors if tied or t.name != "token_embd.weight")
    kv_w = kv * (h // heads)
    layer = 2 * h * h + 2 * (2 * h * kv_w) + h * h + 3 * h * inter  # q, k, v over 2h inputs; o; gate/up/down
    step = layer + draft_vocab * h
    return {
        "target_step_bytes": target,
        "draft_vocab": draft_vocab,
        "draft_step_params": step,
        "fc_params": 3 * h * h,
        "per_type": {
            t: {
                "draft_step": round(step * BYTES_PER_WEIGHT[t] / target, 4),
                "fc": round(3 * h * h * BYTES_PER_WEIGHT[t] / target, 4),
            }
            for t in head_types
        },  # fmt: skip
    }


def break_even(pass_vs_tg: dict, k: int, draft_per_token: float, fc: float = 0.0, overhead: float = 0.0) -> float:
    """The tau at which a round at chain length k costs what it yields, in decoded tokens."""
    return round(pass_vs_tg[k + 1] + k * draft_per_token + fc + overhead, 2)


def head_rounds(server: Path, target: Path, head: Path, threads: int, ks: list[int], prompts: int,
                max_tokens: int, log_dir: Path) -> dict:  # fmt: skip
    """llama-server's own clock of a real head at each k, and a plain server's decode ms per token."""
    import httpx

    from eagle3cli.engines.local_engine import free_port, running
    from eagle3cli.prompts import load_prompts

    msgs = [m for _, m in load_prompts("mt_bench", prompts)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))

    def serve(extra: list[str], name: str) -> tuple[float, int, dict | None]:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = log_dir / f"{name}-t{threads}.log"
        log.unlink(missing_ok=True)
        argv = [str(server), "-m", str(target), "-t", str(threads), "-tb", str(threads), "-np", "1", "-c", "4096",
                "--host", "127.0.0.1", "--port", str(port), "--no-webui", *extra]  # fmt: skip
        ms = n = 0
        with running(argv, env, log, f"{url}/health", timeout_s=300):
            for m in msgs:
                prompt = httpx.post(f"{url}/apply-template", json={"messages": m}, timeout=60).json()["prompt"]
                body = {"prompt": prompt, "n_predict": max_tokens, "temperature": 0.0, "cache_prompt": False}
                t = httpx.post(f"{url}/completion", json=body, timeout=900).json()["timings"]
                ms, n = ms + float(t["predicted_ms"]), n + int(t["predicted_n"])
        return ms, n, spec_stats(log)

    ms, n, _ = serve([], "plain")
    plain = ms / max(n, 1)
    out = {"plain_server_ms_per_token": round(plain, 3), "prompts": prompts, "max_tokens": max_tokens, "ks": {}}
    for k in ks:
        ms, n, st = serve(["-md", str(head), "--spec-type", "draft-eagle3", "--spec-draft-n-max", str(k), "-lv", "4"],
                          f"eagle3-k{k}")  # fmt: skip
        if st is None or not st["calls_draft"]:
            raise SystemExit(f"llama-server printed no speculative statistics at k={k}: see {log_dir}")
        calls = st["calls_draft"]
        out["ks"][k] = {"round_ms": round(ms / calls, 3), "draft_ms": round(st["draft_ms"] / calls, 3),
                        "draft_calls": calls, "tokens": n, "tau": round(n / calls, 3)}  # fmt: skip
    return out


def table(rows: list[dict]) -> str:
    lines = ["| weights | threads | GGUF MB | decode ms/token | pass over 1 | 2 | 3 | 4 | 5 tokens (x a decoded token) |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        v = r["pass_vs_tg"]
        lines.append(f"| {r['type']} | {r['threads']} | {r['gguf_bytes'] / 1e6:.0f} | {r['tg_ms_per_token']:.1f} | "
                     f"{v[1]:.2f} | {v[2]:.2f} | {v[3]:.2f} | {v[4]:.2f} | {v[5]:.2f} |")  # fmt: skip
    return "\n".join(lines)


def break_even_rows(row: dict, shares: list[dict], rounds: dict | None, ks: list[int]) -> list[dict]:
    """One row per draft-cost source: measured (a head in llama-server) or per head type's weight bytes."""
    v = row["pass_vs_tg"]
    out = []
    if rounds is not None:
        plain = rounds["plain_server_ms_per_token"]
        per_k = {}
        for k in ks:
            m = rounds["ks"][k]
            draft = m["draft_ms"] / plain
            over = (m["round_ms"] - m["draft_ms"] - row["pass_ms"][k + 1]) / plain
            per_k[k] = {"round": round(m["round_ms"] / plain, 2), "draft": round(draft, 2),
                        "verify": round(row["pass_ms"][k + 1] / plain, 2), "overhead": round(over, 2),
                        "tau": m["tau"], "break_even_tau": round(m["round_ms"] / plain, 2)}  # fmt: skip
        out.append({"draft": "measured (head in llama-server)", "per_k": per_k})
    for t, sh, vocab in ((t, sh, s["draft_vocab"]) for s in shares for t, sh in s["per_type"].items()):
        out.append({"draft": f">= a {t} head's weight bytes (draft vocab {vocab}), no overhead",
                    "draft_per_token": sh["draft_step"], "fc": sh["fc"],
                    "per_k": {k: {"break_even_tau": break_even(v, k, sh["draft_step"], sh["fc"])} for k in ks}})  # fmt: skip
    return out


def break_even_table(rows: list[dict], ks: list[int]) -> str:
    head = " | ".join(f"k={k}" for k in ks)
    lines = [f"| weights | threads | draft cost | draft per drafted token | {head} (break-even tau) |",
             "|---|---|---|---|" + "---|" * len(ks)]  # fmt: skip
    for r in rows:
        for b in r.get("break_even", []):
            per = b.get("draft_per_token")
            if per is None:  # measured: per k
                per_s = " / ".join(f"{b['per_k'][k]['draft'] / k:.2f}" for k in ks)
            else:
                per_s = f"{per:.3f} (+ fc {b['fc']:.3f} a round)"
            cells = " | ".join(f"{b['per_k'][k]['break_even_tau']:.2f}" for k in ks)
            lines.append(f"| {r['type']} | {r['threads']} | {b['draft']} | {per_s} | {cells} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ggufs", nargs="+", metavar="LABEL=PATH", help="target GGUFs to measure, each with its label")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--threads", default="1",
                    help="llama.cpp threads, a comma list (the serving benches use 1; 2 asks whether more cores make a "
                         "pass over several tokens cheaper relative to a decoded one)")  # fmt: skip
    ap.add_argument("--ks", default="1,2,3,4", help="chain lengths k for the break-even tau")
    ap.add_argument("--head", action="append", default=[], metavar="LABEL=HEAD.gguf",
                    help="a head GGUF for target LABEL: its draft cost and the per-round overhead measured in "
                         "llama-server; other labels get the weight-bytes lower bound")  # fmt: skip
    ap.add_argument(
        "--head-type", default="bf16", help=f"weight types of the lower bound, of {sorted(BYTES_PER_WEIGHT)}"
    )
    ap.add_argument("--draft-vocab", default="16384,32000", help="draft vocab(s) of the lower bound's lm_head")
    ap.add_argument("--head-prompts", type=int, default=2, help="MT-bench prompts per server for --head")
    ap.add_argument("--head-tokens", type=int, default=64, help="new tokens per prompt for --head")
    a = ap.parse_args()
    server = which_llama_server()
    try:
        threads = [int(x) for x in a.threads.split(",") if x]
        ks = [int(x) for x in a.ks.split(",") if x]
        vocabs = [int(x) for x in a.draft_vocab.split(",") if x]
    except ValueError:
        threads = ks = vocabs = []
    if not threads or min(threads) < 1 or not ks or min(ks) < 1 or max(ks) > 4 or not vocabs or min(vocabs) < 1:
        print(f"error: --threads {a.threads} --ks {a.ks} --draft-vocab {a.draft_vocab}: expected comma lists of "
              "threads >= 1, k in 1..4, vocab sizes >= 1", file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    head_types = [t for t in a.head_type.split(",") if t]
    if not head_types or set(head_types) - set(BYTES_PER_WEIGHT):
        print(f"error: --head-type {a.head_type}: expected a comma list of {sorted(BYTES_PER_WEIGHT)}", file=sys.stderr)
        raise SystemExit(2)
    if server is None:
        print("error: llama.cpp is not built here (expected .llama-cpp/build/bin/llama-bench): run `make llama-cpp`",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    pairs = []
    for spec in a.ggufs:
        label, sep, path = spec.partition("=")
        if not sep or not Path(path).expanduser().is_file():
            print(f"error: {spec!r} is not LABEL=PATH to a GGUF file (e.g. f32=runs/llama-cpp-bench/gguf/target.gguf)",
                  file=sys.stderr)  # fmt: skip
            raise SystemExit(2)
        pairs.append((label, Path(path).expanduser()))
    heads = {}
    for spec in a.head:
        label, sep, path = spec.partition("=")
        if not sep or label not in dict(pairs) or not Path(path).expanduser().is_file():
            print(f"error: --head {spec!r} is not LABEL=PATH to a head GGUF for one of the targets' labels "
                  f"({', '.join(dict(pairs))})", file=sys.stderr)  # fmt: skip
            raise SystemExit(2)
        heads[label] = Path(path).expanduser()
    log_dir = (a.out.parent if a.out else Path("runs")) / "verify-cost-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for t in threads:
        for label, path in pairs:
            row = measure(label, path, Path(server).with_name("llama-bench"), a.reps, t)
            shares = [weight_shares(path, v, head_types) for v in vocabs]
            rounds = None
            if label in heads:
                rounds = head_rounds(Path(server), path, heads[label], t, ks, a.head_prompts, a.head_tokens, log_dir)
            row.update(weight_shares=shares, head_rounds=rounds, break_even=break_even_rows(row, shares, rounds, ks))
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(table(rows))
    print()
    print(break_even_table(rows, ks))
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"rows": rows, "threads": threads, "depth": 256, "ks": ks}, indent=2) + "\n")


if __name__ == "__main__":
    main()
