"""`eagle3 eval --endpoint URL` against llama.cpp's llama-server (found by `/props` `build_info`).

Each prompt is rendered with the target's chat template and sent as token ids to the native
`/completion` (llama-server uses an array of ids as it is, adding no BOS), one at a time, with
`return_tokens` and no prompt cache, so every request decodes from the same prefill as eval's.

* Per request, from the response's `timings`: `draft_n` (draft tokens proposed) and
  `draft_n_accepted`, `predicted_n` / `predicted_ms` (decode only).
* Engine tau from llama-server's `/metrics` (`--metrics`, which `eagle3 serve --engine llama.cpp`
  passes): `llamacpp:spec_decode_num_drafts_total` counts verification steps, so over the prompts
  tau = 1 + accepted / verification steps, the definition llama-server logs as "mean len" and
  eval's chain tau; per-position acceptance from `..._num_accepted_tokens_per_pos_total`.
  The counters are summed when a request ends, and requests are sequential, so the difference
  around each request is that request's.
* Sampling as the plain target's: llama-server's default sampler chain also applies top_k 40 and
  min_p 0.05, which are switched off (top_k 0, min_p 0, typical_p 1, no penalties).
* `--base-endpoint`: the same target served without a draft, each prompt sent to it right after the
  speculative server (interleaved: the two see the same minutes of a shared machine's load): tokens/s
  of both, the speed-up,
  greedy outputs compared token for token, and at temperature > 0 the chi-square check of
  speculative vs plain samples (eval's `sampling_comparison`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..console import log, print_table, warn
from ..engines.engine_api import EngineClient, Unreachable, parse_prometheus
from ..errors import UsageError
from .config import EvalConfig
from .paired import ORDER, paired_speedup, run_interleaved, speedup_cell

METRIC_PREFIX = "llamacpp:spec_decode_"


@dataclass(frozen=True)
class SamplingCheck:
    """The engine sampling check `eval.endpoint` runs for every engine: positions, seeds, the test."""

    positions: int
    seed_offset: int
    compare: Callable[[list[dict], list[dict]], dict]


async def is_llama_server(client: EngineClient, base: str) -> bool:
    props = await client.get_json(base, "/props", timeout=10.0)
    return isinstance(props, dict) and "build_info" in props and "default_generation_settings" in props


def completion_body(ids: list[int], max_tokens: int, temperature: float, top_p: float, seed: int) -> dict:
    return {
        "prompt": ids,
        "n_predict": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": 0,
        "min_p": 0.0,
        "typical_p": 1.0,
        "repeat_penalty": 1.0,
        "seed": seed,
        "return_tokens": True,
        "cache_prompt": False,
        "stream": False,
    }


def counters(metrics_text: str) -> dict[str, float] | None:
    """llama-server's spec-decode counters (`--metrics`), or None when it exports none."""
    out: dict[str, float] = {}
    for name, labels, value in parse_prometheus(metrics_text):
        if name.startswith(METRIC_PREFIX):
            key = name[len(METRIC_PREFIX) :]
            if "position" in labels:
                key += f"[{int(labels['position'])}]"
            out[key] = out.get(key, 0.0) + value
    return out or None


async def _metrics(client: EngineClient, base: str) -> dict[str, float] | None:
    try:
        r = await client.get(base, "/metrics", timeout=10.0)
    except Unreachable:
        return None
    return counters(r.text) if r.status == 200 else None


async def _complete(client: EngineClient, url: str, body: dict) -> dict:
    try:
        r = await client.post(url, "/completion", body)
    except Unreachable as e:
        raise UsageError(f"cannot reach {url} ({e.detail})", "a running llama-server") from e
    if r.status != 200:
        raise UsageError(f"{url}/completion answered HTTP {r.status}: {r.text[:300]}", "HTTP 200 from llama-server")
    data = r.json()
    t = data.get("timings") or {}
    return {
        "token_ids": [int(x) for x in data.get("tokens") or []],
        "completion_tokens": int(t.get("predicted_n") or len(data.get("tokens") or [])),
        "draft_n": int(t.get("draft_n") or 0),
        "draft_n_accepted": int(t.get("draft_n_accepted") or 0),
        "decode_ms": float(t.get("predicted_ms") or 0.0),
        "stop_type": data.get("stop_type"),
        "probs": data.get("completion_probabilities"),
        "seconds": r.seconds,
    }


async def _one(client: EngineClient, url: str, k: int, pid, ids: list[int], cfg: EvalConfig) -> dict:
    before = await _metrics(client, url)
    body = completion_body(ids, cfg.max_new_tokens, cfg.temperature, cfg.top_p, cfg.seed + k)
    res = await _complete(client, url, body)
    after = await _metrics(client, url)
    delta = {key: after[key] - before.get(key, 0.0) for key in after} if after and before is not None else {}
    res.pop("probs")
    res.update(prompt=pid, verify_steps=delta.get("num_drafts_total"), metrics=delta)
    return res


async def run_prompts(client: EngineClient, urls: list[str], prompts: list, cfg: EvalConfig) -> list[list[dict]]:
    """Each prompt on every server, interleaved (eval/paired.py): their tokens/s are measured over
    the same minutes of a shared machine's load."""
    return await run_interleaved(urls, prompts, lambda url, k, pid, ids: _one(client, url, k, pid, ids, cfg))


def summary(rows: list[dict]) -> dict:
    toks = sum(r["completion_tokens"] for r in rows)
    drafted = sum(r["draft_n"] for r in rows)
    accepted = sum(r["draft_n_accepted"] for r in rows)
    steps = [r["verify_steps"] for r in rows]
    known = all(s is not None for s in steps)
    n_steps = sum(s for s in steps if s is not None)
    per: dict[int, float] = {}
    for r in rows:
        for key, v in (r.get("metrics") or {}).items():
            if key.startswith("num_accepted_tokens_per_pos_total["):
                pos = int(key.split("[")[1].rstrip("]"))
                per[pos] = per.get(pos, 0.0) + v
    secs = sum(r["seconds"] for r in rows)
    decode_s = sum(r["decode_ms"] for r in rows) / 1000
    return {
        "tokens": toks,
        "draft_n": drafted,
        "draft_n_accepted": accepted,
        "draft_acceptance_rate": accepted / drafted if drafted else None,
        "verify_steps": n_steps if known else None,
        "tau": 1 + accepted / n_steps if known and n_steps else None,
        "per_position": [per[i] / n_steps for i in sorted(per)] if known and n_steps else [],
        "tokens_per_s_sequential": toks / secs if secs else 0.0,
        "decode_tokens_per_s": toks / decode_s if decode_s else 0.0,
    }


async def _samples(client: EngineClient, url: str, ids: list[int], cfg: EvalConfig, positions: int, seed0: int) -> list:
    async def one(s: int) -> dict:
        return await _complete(client, url, completion_body(ids, positions, cfg.temperature, cfg.top_p, seed0 + s))

    out = []
    for s in range(cfg.sampling_check):  # llama-server runs one slot per request; sequential is as fast
        out.append(await one(s))
    return out


async def llama_server_report(
    client: EngineClient, endpoint: str, prompts: list, cfg: EvalConfig, sampling: SamplingCheck
) -> dict:
    if cfg.base_endpoint and not await is_llama_server(client, cfg.base_endpoint):
        raise UsageError(
            f"--base-endpoint {cfg.base_endpoint} is not a llama-server (no build_info on /props)",
            "the same target served by llama-server without -md",
        )
    urls = [endpoint, cfg.base_endpoint] if cfg.base_endpoint else [endpoint]
    rows, *based = await run_prompts(client, urls, prompts, cfg)
    s = summary(rows)
    if not s["draft_n"]:
        warn(
            f"{endpoint} drafted nothing (no timings.draft_n): a head needs -md HEAD --spec-type draft-eagle3; "
            "an n-gram speculator (--spec-type ngram-*) drafts only where the text repeats"
        )
    if s["verify_steps"] is None and s["draft_n"]:
        warn(f"{endpoint}/metrics is off: tau needs llama-server's --metrics (eagle3 serve --engine llama.cpp sets it)")
    report: dict = {
        "endpoint": endpoint,
        "engine": "llama.cpp",
        "bench": cfg.bench,
        "num_prompts": len(rows),
        "temperature": cfg.temperature,
        "max_new_tokens": cfg.max_new_tokens,
        **s,
        "tau_definition": "1 + draft_n_accepted / verification steps (llamacpp:spec_decode_num_drafts_total), "
        "summed over prompts (bonus token included); per_position[k-1] = accepted at draft position k / steps",
        "per_prompt": rows,
    }
    table = [
        [
            "speculative",
            len(rows),
            s["tokens"],
            f"{s['draft_n_accepted']}/{s['draft_n']}",
            _f(s["tau"]),
            _f(s["tokens_per_s_sequential"], 1),
            "",
            "",
        ]
    ]
    if based:
        base = based[0]
        b = summary(base)
        differ = [x["prompt"] for x, y in zip(rows, base) if x["token_ids"] != y["token_ids"]]
        bt = b["tokens_per_s_sequential"]
        report["baseline"] = {
            "endpoint": cfg.base_endpoint,
            "tokens": b["tokens"],
            "tokens_per_s_sequential": bt,
            "decode_tokens_per_s": b["decode_tokens_per_s"],
            "speedup": s["tokens_per_s_sequential"] / bt if bt else None,
            "decode_speedup": s["decode_tokens_per_s"] / b["decode_tokens_per_s"] if b["decode_tokens_per_s"] else None,
            "outputs_differ": len(differ),
            "differing_prompts": differ,
            "first_difference": [_first_difference(x["token_ids"], y["token_ids"]) for x, y in zip(rows, base)],
            "outputs_compared": "generated token ids, speculative vs plain, same seed per prompt",
            "speedup_interval": paired_speedup(rows, base)["interval"],
            "order": ORDER,
        }
        table.append(
            [
                "plain",
                len(base),
                b["tokens"],
                "-",
                "1",
                _f(bt, 1),
                f"{len(differ)}/{len(rows)}",
                speedup_cell(report["baseline"]),
            ]
        )
        if cfg.temperature == 0 and differ:
            warn(f"{len(differ)}/{len(rows)} greedy outputs differ from plain llama-server decoding")
        if cfg.temperature > 0 and cfg.sampling_check > 0:
            assert cfg.base_endpoint is not None  # this report section exists only with --base-endpoint
            pid, ids = prompts[0]
            log(f"sampling check: {cfg.sampling_check} speculative vs plain llama-server samples on {pid}")
            sp = await _samples(client, endpoint, ids, cfg, sampling.positions, cfg.seed)
            pl = await _samples(
                client, cfg.base_endpoint, ids, cfg, sampling.positions, cfg.seed + sampling.seed_offset
            )
            for r in (*sp, *pl):
                r["logprobs"] = None
            report["sampling_check"] = {"prompt": pid, **sampling.compare(sp, pl)}
            sc = report["sampling_check"]
            (log if sc["passed"] else warn)(
                f"engine sampling check {'passed' if sc['passed'] else 'FAILED'}: min p = {sc['min_p_value']:.2g}"
            )
    print_table(
        f"{endpoint} on {cfg.bench} (llama-server timings)",
        ["server", "prompts", "tokens", "accepted/drafted", "tau", "tok/s", "outputs differ", "speed-up"],
        table,
    )
    if s["per_position"]:
        log("per-position acceptance: " + ", ".join(f"{k + 1}: {a:.3f}" for k, a in enumerate(s["per_position"])))
    return report


def _first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two outputs differ (None: identical)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _f(v, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"
