"""gen-data through a batched engine vs the engine's own capacity vs the embedded hf backend.

    .venv/bin/python benchmarks/stages/gen_data_engine.py --target models/smollm2-135m --input sharegpt \
        --engine vllm --concurrency 1,8,32,64 --out runs/bench/gen-data-engine.json
    .venv/bin/python benchmarks/stages/gen_data_engine.py ... --endpoint http://127.0.0.1:8080   # a running server

At each concurrency C, on the same server started with prefix caching off (with --endpoint, start it
so yourself: with it on, whichever client runs second finds every prompt cached and skips its
prefill, which made gen-data look 0.41-0.53x the client at C=8-32 when it ran first): `eagle3
gen-data --backend openai --concurrency C` on the first max(16, 4C) first-turn prompts, and a plain
asyncio client that sends exactly the same chat requests with C in flight (the engine's capacity
for this load), in the order gen-data, client, client, gen-data (--reps 2; ratios of the means), so
neither gets the warmer server.
Both are greedy with the same max_tokens, so both generate the same tokens (the JSON says how many
texts agree). gen-data's clock is its own generation time (manifest `throughput`), the client's
the wall time of its requests. Then the hf backend (embedded transformers, batched) on the same
prompts (the first --hf-prompts), unless --no-hf. Prints one JSON object; --out also writes it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


NO_PREFIX_CACHE = ("--no-enable-prefix-caching",)


def first_turn_prompts(spec: str, n: int) -> list[dict]:
    from eagle3cli.data.formats import parse_input_spec, read_input

    out = []
    for r in read_input(parse_input_spec(spec)).records:
        msgs = r["messages"]
        i = next(i for i, m in enumerate(msgs) if m["role"] == "user")
        out.append({"id": r["id"].split(":", 1)[-1], "messages": msgs[: i + 1]})
        if len(out) == n:
            break
    return out


async def plain_client(url: str, model: str, prompts: list[dict], max_tokens: int, concurrency: int) -> dict:
    import httpx

    from eagle3cli.engines.engine_api import chat_body

    sem = asyncio.Semaphore(concurrency)
    texts: dict[str, str] = {}
    tokens = 0

    async def one(client: httpx.AsyncClient, p: dict) -> None:
        nonlocal tokens
        body = chat_body(model, p["messages"], max_tokens, 0.0, top_p=1.0)
        async with sem:
            r = await client.post(f"{url}/v1/chat/completions", json=body)
        r.raise_for_status()
        data = r.json()
        texts[p["id"]] = data["choices"][0]["message"]["content"] or ""
        tokens += int(data["usage"]["completion_tokens"])

    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=1800, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(client, p) for p in prompts))
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, "tokens": tokens, "tok_s": tokens / seconds, "texts": texts}


def gen_data(target: str, prompts_file: Path, out: Path, n: int, max_tokens: int, **kw) -> dict:
    from eagle3cli.data.config import GenDataConfig
    from eagle3cli.data.run import run_gen_data
    from eagle3cli.readers.jsonl import read_records

    cfg = GenDataConfig(target=target, inputs=(str(prompts_file),), out=out, num_samples=n, max_new_tokens=max_tokens,
                        temperature=0.0, top_p=1.0, shard_size=max(n, 1), exclude_eval=False, **kw)  # fmt: skip
    run_gen_data(cfg)
    m = json.loads((out / "manifest.json").read_text())
    texts = {}
    for shard in sorted(out.glob("shard-*.jsonl")):
        for r in read_records(shard):  # JSON lines split at \n only (texts hold U+2028 and friends)
            texts[r["id"].split(":", 1)[-1]] = r["messages"][-1]["content"]
    t = m["throughput"]
    return {"seconds": t["seconds"], "tokens": t["completion_tokens"], "tok_s": t["completion_tok_s"], "texts": texts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(REPO / "models" / "smollm2-135m"))
    ap.add_argument("--input", default="sharegpt")
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--engine", choices=["vllm"], default=None, help="start this engine on the target")
    ap.add_argument("--endpoint", default=None, help="or use a running OpenAI-compatible server")
    ap.add_argument("--dtype", default="bf16", help="the engine's and the hf backend's dtype")
    ap.add_argument("--reps", type=int, default=2, help="runs of each client per concurrency, in ABBA order")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--hf-prompts", type=int, default=64, help="prompts for the hf backend (the first of the same set)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    levels = [int(c) for c in a.concurrency.split(",")]
    n_max = max(16, 4 * max(levels))
    prompts = first_turn_prompts(a.input, n_max)
    tmp = Path(tempfile.mkdtemp(prefix="gen-data-engine-"))
    model = Path(a.target).name
    with contextlib.ExitStack() as stack:
        engine = None
        if a.endpoint:
            url = a.endpoint.rstrip("/")
        else:
            from eagle3cli.engines.local_engine import vllm_for_target

            url, engine = stack.enter_context(
                vllm_for_target(Path(a.target), a.dtype, max(levels), tmp / "engine.log", extra=NO_PREFIX_CACHE)
            )
        rows = []
        for c in levels:
            n = max(16, 4 * c)
            pf = tmp / f"prompts-{c}.jsonl"
            pf.write_text("".join(json.dumps(p) + "\n" for p in prompts[:n]))
            asyncio.run(plain_client(url, model, prompts[: min(n, c)], 8, c))  # warm the server's path for C
            gs, ps = [], []
            for i in range(a.reps):  # ABBA: gen-data, client, client, gen-data, ...
                order = ("g", "p") if i % 2 == 0 else ("p", "g")
                for who in order:
                    if who == "g":
                        gs.append(gen_data(a.target, pf, tmp / f"gd-{c}-{i}", n, a.max_new_tokens, backend="openai",
                                           endpoints=(url,), concurrency=c, served_model_name=model))  # fmt: skip
                    else:
                        ps.append(asyncio.run(plain_client(url, model, prompts[:n], a.max_new_tokens, c)))
            g_tok_s = sum(x["tokens"] for x in gs) / sum(x["seconds"] for x in gs)
            p_tok_s = sum(x["tokens"] for x in ps) / sum(x["seconds"] for x in ps)
            same = sum(gs[0]["texts"].get(k) == v for k, v in ps[0]["texts"].items())
            rows.append({"concurrency": c, "prompts": n, "gen_data_tok_s": round(g_tok_s, 1),
                         "engine_tok_s": round(p_tok_s, 1), "ratio": round(g_tok_s / p_tok_s, 3),
                         "runs": {"gen_data": [round(x["tok_s"], 1) for x in gs],
                                  "engine": [round(x["tok_s"], 1) for x in ps]},
                         "tokens": [gs[0]["tokens"], ps[0]["tokens"]], "same_texts": same})  # fmt: skip
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    hf = None
    if not a.no_hf:  # the engine is stopped: the hf backend gets the machine to itself
        n = min(a.hf_prompts, n_max)
        pf = tmp / "prompts-hf.jsonl"
        pf.write_text("".join(json.dumps(p) + "\n" for p in prompts[:n]))
        h = gen_data(a.target, pf, tmp / "hf", n, a.max_new_tokens, backend="hf", dtype=a.dtype, device="cpu",
                     batch_size=32)  # fmt: skip
        hf = {"prompts": n, "tok_s": round(h["tok_s"], 1), "tokens": h["tokens"]}
        for r in rows:
            r["hf_tok_s"] = hf["tok_s"]
            r["vs_hf"] = round(r["gen_data_tok_s"] / hf["tok_s"], 2)
    result = {
        "target": a.target,
        "input": a.input,
        "max_new_tokens": a.max_new_tokens,
        "engine": engine.as_dict() if engine else {"endpoint": a.endpoint},
        "threads": os.environ.get("OMP_NUM_THREADS"),
        "rows": rows,
        "hf": hf,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
