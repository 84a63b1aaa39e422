"""`eagle3 serve-bench`: load a speculative server and a baseline at several concurrencies.

Speculation trades spare compute for fewer target passes; as the batch grows the GPU has
less to spare, so the speed-up shrinks and eventually turns into a slow-down. The bench
finds that concurrency. Per level: output-token throughput, request latency percentiles and
accept length — per request from SGLang's `meta_info` (`completion_tokens / spec_verify_ct`,
or `spec_accept_length` where the server reports it) or, on the OpenAI API, from SGLang's
`sglext.spec_tokens_details` extension; and after each level from `/server_info`'s
`avg_spec_accept_length` (a running average over recent batches), or on vLLM from its own
spec-decode counters on `/metrics`, scraped before and after the level.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from ..config import config_dict
from ..console import log, print_table, progress, warn
from ..engines.engine_api import EngineClient, Unreachable, chat_body, checked_count, generate_body
from ..errors import UsageError
from ..extras import draw_plot
from ..run_folder.folders import begin_writing, claim_output, end_writing, refuse_replacing
from ..run_folder.lock import locked_stage
from ..run_folder.manifest import atomic_write, atomic_write_json, remove_dead_temps, write_manifest
from .config import BenchConfig

DEFAULT_PROMPTS = "mt_bench"


@dataclass
class RequestResult:
    ok: bool
    latency_s: float
    completion_tokens: int = 0
    verify_ct: int | None = None  # target verify passes (SGLang meta_info.spec_verify_ct)
    accept_length: float | None = None  # tokens per verify pass, as the server reports it
    error: str | None = None
    recounted: str | None = None  # why the server's token count was not used (engine_api.checked_count)


@dataclass
class LevelResult:
    server: str
    concurrency: int
    requests: int
    failed: int
    wall_s: float
    output_tokens: int
    throughput_tok_s: float
    requests_per_s: float
    latency_p50_s: float | None
    latency_p90_s: float | None
    latency_p99_s: float | None
    accept_length: float | None  # sum(tokens) / sum(verify passes) over this level's requests
    server_accept_length: float | None  # SGLang: /server_info avg_spec_accept_length after the level;
    # vLLM: 1 + accepted / drafts from its /metrics counters over the level
    first_error: str | None = None
    engine_per_position: list[float] | None = None  # vLLM: accepted_per_pos[k] / drafts over the level
    recounted: int = 0  # requests whose token count the server got wrong, counted again from the answer
    first_recount: str | None = None  # what the server said for the first of them


# ---------------------------------------------------------------- prompts
def load_prompts(spec: str | Path | None) -> list[list[dict]]:
    """First-turn chat messages of every prompt in `spec` (a named source or a file; default
    MT-bench), read exactly as eval and gen-data read them."""
    from ..prompts import load_prompts as load_bench

    return [msgs for _, msgs in load_bench(str(spec or DEFAULT_PROMPTS), num_prompts=1 << 30, flag="--prompts")]


def render_payloads(prompts: list[list[dict]], api: str, target: str | Path | None) -> list:
    """What each request carries: for /generate the token ids of the prompt rendered with the
    target's chat template (exactly what `eagle3 eval --endpoint` sends); for the OpenAI API the
    messages (the server applies its own template)."""
    if api != "generate":
        return prompts
    from ..model.target import open_target
    from ..prompts import render

    assert target is not None  # BenchConfig.validate(): --api generate needs --target
    tok = open_target(target).tokenizer
    return [render(tok, m) for m in prompts]


TokenCounter = Callable[[str], int] | None  # the target's tokenizer counting an answer's tokens (None: no --target)


def token_counter(target: str | Path | None) -> TokenCounter:
    """The target's tokenizer as a counter of answer tokens (what a server's own count is checked
    against); None without --target."""
    if target is None:
        return None
    from ..model.target import open_target

    tok = open_target(target).tokenizer
    return lambda text: len(tok(text, add_special_tokens=False).input_ids)


# ---------------------------------------------------------------- one request
def request_body(api: str, prompt, model: str, cfg: BenchConfig) -> tuple[str, dict]:
    """(route, body) of one greedy request; `prompt` is token ids for /generate, messages for OpenAI."""
    if api == "generate":
        params: dict = {"max_new_tokens": cfg.max_tokens, "temperature": 0.0}
        if cfg.ignore_eos:
            params["ignore_eos"] = True
        return "/generate", generate_body(prompt, params)
    # return_spec_tokens_details: SGLang's extension (response `sglext.spec_tokens_details`); vLLM ignores it
    extra: dict = {"return_spec_tokens_details": True}
    if cfg.ignore_eos:
        extra["ignore_eos"] = True
    body = chat_body(model, prompt, cfg.max_tokens, 0.0, extra=extra)
    for k in ("stream",):  # as SGLang and vLLM default it
        body.pop(k)
    return "/v1/chat/completions", body


def _count(reported, cfg: BenchConfig, ids, text, counter: TokenCounter) -> tuple[int, str | None, str | None]:
    """(tokens, recounted-why, refused-why) of one answer: the server's count checked against the
    request's max_tokens, else recounted from the token ids or the text that came back."""

    def recount() -> int | None:
        if isinstance(ids, list):
            return len(ids)
        return counter(text) if counter is not None and isinstance(text, str) else None

    c = checked_count(reported, cfg.max_tokens, recount)
    if c.source == "refused":
        return 0, None, f"{c.why}; pass --target MODEL_DIR to count the answers with the target's tokenizer"
    return c.n, c.why, None


async def _request(
    client: EngineClient, url: str, api: str, prompt, model: str, cfg: BenchConfig, counter: TokenCounter = None
) -> RequestResult:
    """One request; `prompt` is token ids for /generate, chat messages for the OpenAI API."""
    route, body = request_body(api, prompt, model, cfg)
    t0 = time.perf_counter()
    try:
        r = await client.post(url, route, body)
        latency = r.seconds
        if r.status != 200:
            return RequestResult(False, latency, error=f"HTTP {r.status}: {r.text[:160]}")
        data = r.json()
    except Unreachable as e:
        return RequestResult(False, time.perf_counter() - t0, error=e.detail[:200])
    except json.JSONDecodeError as e:
        return RequestResult(False, time.perf_counter() - t0, error=f"{type(e).__name__}: {e}"[:200])
    if api == "generate":
        one = (data[0] if isinstance(data, list) else data) or {}
        meta = one.get("meta_info") or {}
        tokens, why, refused = _count(
            meta.get("completion_tokens"), cfg, one.get("output_ids"), one.get("text"), counter
        )
        if refused:
            return RequestResult(False, latency, error=refused)
        verify = _positive_int(meta.get("spec_verify_ct"))
        acc = meta.get("spec_accept_length")
        if acc is None or why is not None:  # a server that miscounts tokens: its own ratio is not used either
            acc = tokens / verify if verify else None
        return RequestResult(True, latency, tokens, verify, float(acc) if acc is not None else None, recounted=why)
    data = data if isinstance(data, dict) else {}
    choices = data.get("choices")
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    text = (first.get("message") or {}).get("content")
    usage = data.get("usage")
    reported = usage.get("completion_tokens") if isinstance(usage, dict) else None
    tokens, why, refused = _count(reported, cfg, None, text, counter)
    if refused:
        return RequestResult(False, latency, error=refused)
    spec = (data.get("sglext") or {}).get("spec_tokens_details")
    spec = spec[0] if isinstance(spec, list) and spec else spec
    verify = _positive_int(spec.get("spec_verify_ct")) if isinstance(spec, dict) else None
    if verify and isinstance(spec, dict):
        acc = spec.get("spec_accept_length") if why is None else None
        return RequestResult(True, latency, tokens, verify, float(acc or tokens / verify), recounted=why)
    return RequestResult(True, latency, tokens, recounted=why)


def _positive_int(v) -> int | None:
    """A count of verify passes as the server reports it, when it is one (else not used)."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


async def _check_reachable(client: EngineClient, label: str, url: str) -> None:
    why = await client.health(url)
    if why is not None:
        raise UsageError(
            f"the {label} server at {url} is not healthy ({why})",
            "a running SGLang/vLLM server",
            "start it: eagle3 serve --target T --head H --port PORT   (baseline: the plain engine)",
        )


# ---------------------------------------------------------------- one level
async def run_level(
    label: str,
    url: str,
    prompts: list,
    concurrency: int,
    n_requests: int,
    cfg: BenchConfig,
    counter: TokenCounter = None,
) -> LevelResult:
    async with EngineClient(timeout_s=cfg.timeout, concurrency=concurrency) as client:
        model = await client.model_name([url]) if cfg.api == "openai" else ""
        await _request(client, url, cfg.api, prompts[0], model, cfg, counter)  # warm-up, not counted
        before = await client.spec_counters(url)  # vLLM: its own counters, differenced over the level
        sem = asyncio.Semaphore(concurrency)
        results: list[RequestResult] = []
        with progress(f"{label} c={concurrency}", total=n_requests, unit="req") as bar:

            async def one(i: int) -> None:
                async with sem:
                    res = await _request(client, url, cfg.api, prompts[i % len(prompts)], model, cfg, counter)
                results.append(res)
                bar.advance(1, tokens=res.completion_tokens)

            t0 = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(n_requests)))
            wall = time.perf_counter() - t0
        after = await client.spec_counters(url)
        counters = after.minus(before) if after is not None and before is not None else None
        server_acc = counters.tau if counters is not None else await client.server_accept_length(url)
    good = [r for r in results if r.ok]
    tokens = sum(r.completion_tokens for r in good)
    verified = [r for r in good if r.verify_ct]
    acc = (sum(r.completion_tokens for r in verified) / sum(r.verify_ct or 0 for r in verified)) if verified else None
    if acc is None:
        reported = [r.accept_length for r in good if r.accept_length is not None]
        acc = sum(reported) / len(reported) if reported else None
    lat = [r.latency_s for r in good]
    errors = [r.error for r in results if not r.ok]
    return LevelResult(
        server=label,
        concurrency=concurrency,
        requests=len(results),
        failed=len(errors),
        wall_s=wall,
        output_tokens=tokens,
        throughput_tok_s=tokens / wall if wall > 0 else 0.0,
        requests_per_s=len(good) / wall if wall > 0 else 0.0,
        latency_p50_s=_percentile(lat, 0.5),
        latency_p90_s=_percentile(lat, 0.9),
        latency_p99_s=_percentile(lat, 0.99),
        accept_length=acc,
        server_accept_length=server_acc,
        first_error=errors[0] if errors else None,
        engine_per_position=counters.per_position() if counters is not None and counters.drafts else None,
        recounted=sum(1 for r in good if r.recounted),
        first_recount=next((r.recounted for r in good if r.recounted), None),
    )


# ---------------------------------------------------------------- summary
def speedups(levels: list[LevelResult]) -> dict[int, float]:
    """Speculative / baseline throughput per concurrency measured on both servers.

    A level where every request failed measured nothing; it gets no speed-up (not 0)."""
    spec = {r.concurrency: r.throughput_tok_s for r in levels if r.server == "speculative" and r.failed < r.requests}
    base = {r.concurrency: r.throughput_tok_s for r in levels if r.server == "baseline" and r.failed < r.requests}
    return {c: spec[c] / base[c] for c in sorted(spec) if c in base and base[c] > 0}


def crossover(speedup: dict[int, float]) -> int | None:
    """The smallest concurrency from which speculation no longer pays (speed-up < 1) at every higher one."""
    cs = sorted(speedup)
    for i, c in enumerate(cs):
        if all(speedup[d] < 1.0 for d in cs[i:]):
            return c
    return None


def plot(levels: list[LevelResult], speedup: dict[int, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for label, style in (("speculative", "o-"), ("baseline", "s--")):
        pts = sorted((r.concurrency, r.throughput_tok_s) for r in levels if r.server == label)
        if pts:
            ax1.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
    ax1.set(xscale="log", xlabel="concurrency (requests in flight)", ylabel="output tokens / s", title="throughput")
    ax1.legend()
    if speedup:
        cs = sorted(speedup)
        ax2.plot(cs, [speedup[c] for c in cs], "o-", color="tab:green")
        ax2.axhline(1.0, color="gray", lw=1, ls=":")
    ax2.set(
        xscale="log",
        xlabel="concurrency (requests in flight)",
        ylabel="speculative / baseline",
        title="speed-up" if speedup else "speed-up (no baseline given)",
    )
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)


def _fmt(v, digits=3):
    return "-" if v is None else (f"{v:.{digits}g}" if isinstance(v, float) else str(v))


@locked_stage("serve-bench", lambda cfg: Path(cfg.out))  # two benches on one folder: the second is refused
def run_bench(cfg: BenchConfig) -> Path:
    """Measure every level on the speculative (and baseline) server; write bench.json, bench.png, manifest."""
    assert cfg.spec_url is not None  # validate() requires --spec-url
    claim_output(Path(cfg.out), "serve-bench", ("bench.json", "bench.png"), marked=True)
    # another server, other levels or prompts (the default --out is shared): not replaced silently
    refuse_replacing(Path(cfg.out), "serve-bench", config_dict(cfg), cfg.overwrite)
    remove_dead_temps(Path(cfg.out))
    prompts = render_payloads(load_prompts(cfg.prompts), cfg.api, cfg.target)
    counter = token_counter(cfg.target)
    servers = [("speculative", cfg.spec_url.rstrip("/"))]
    if cfg.base_url:
        servers.append(("baseline", cfg.base_url.rstrip("/")))
    else:
        warn("no --base-url: throughput is measured, but there is no speed-up without a baseline server")

    async def main() -> list[LevelResult]:
        async with EngineClient(timeout_s=10.0) as client:
            for label, url in servers:
                await _check_reachable(client, label, url)
                if cfg.api == "generate" and await client.is_vllm(url):
                    raise UsageError(
                        f"the {label} server at {url} is vLLM, which has no SGLang /generate",
                        "--api openai for vLLM (its spec-decode counters give the accept length)",
                        "eagle3 serve-bench --api openai ...",
                    )
        levels = []
        for c in cfg.concurrency:
            for label, url in servers:
                levels.append(await run_level(label, url, prompts, c, max(cfg.requests, 2 * c), cfg, counter))
        return levels

    levels = asyncio.run(main())
    sp = speedups(levels)
    cross = crossover(sp)
    out = Path(cfg.out)
    begin_writing(out, "serve-bench")  # before the old manifest goes: a killed rerun stays ours
    (out / "manifest.json").unlink(missing_ok=True)
    rows = [
        [
            r.server,
            r.concurrency,
            r.requests,
            r.failed,
            r.throughput_tok_s,
            _fmt(r.latency_p50_s),
            _fmt(r.latency_p90_s),
            _fmt(r.latency_p99_s),
            _fmt(r.accept_length),
            _fmt(r.server_accept_length),
            _fmt(sp.get(r.concurrency)) if r.server == "speculative" else "",
            r.recounted,
        ]
        for r in levels
    ]
    print_table(
        "serve-bench",
        [
            "server",
            "conc",
            "reqs",
            "failed",
            "tok/s",
            "p50 s",
            "p90 s",
            "p99 s",
            "accept len",
            "server accept",
            "speed-up",
            "recounted",
        ],
        rows,
    )
    recounted = sum(r.recounted for r in levels)
    if recounted:
        first = next(r.first_recount for r in levels if r.first_recount)
        warn(f"{recounted} answer(s) were counted again with the target's tokenizer: {first}")
    if sp:
        verdict = (
            f"speculation stops paying at concurrency {cross}"
            if cross is not None
            else f"speculation pays at every tested concurrency (up to {max(sp)})"
        )
        log(verdict, style="bold")
    failed = sum(r.failed for r in levels)
    if failed:
        first = next(r.first_error for r in levels if r.first_error)
        warn(f"{failed} request(s) failed; first: {first}")
    report = {
        "config": config_dict(cfg),
        "levels": [asdict(r) for r in levels],
        "speedup": {str(c): v for c, v in sp.items()},
        "stops_paying_at": cross,
        "prompts": len(prompts),
    }
    atomic_write_json(out / "bench.json", report)
    drawn = draw_plot(out / "bench.png", lambda: plot(levels, sp, out / "bench.png"))
    write_manifest(
        out,
        "serve-bench",
        config=config_dict(cfg),
        counts={"requests": sum(r.requests for r in levels), "failed": failed},
        stops_paying_at=cross,
    )
    end_writing(out)
    log(f"wrote {out / 'bench.json'}" + (f" and {out / 'bench.png'}" if drawn else ""))
    return out
