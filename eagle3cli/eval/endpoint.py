"""`eagle3 eval --endpoint URL`: acceptance, speed and losslessness of a running engine.

Every prompt is rendered with the target's chat template and sent as token ids, one request at
a time, so engine and `eagle3 eval` decode from identical inputs.

* SGLang: native `/generate`, whose `meta_info` carries `spec_verify_ct` (target verification
  passes) next to `completion_tokens`.
* llama.cpp's llama-server (found by `/props`): `eval/llama_server.py`.
* vLLM (found by its `vllm:` counters on `/metrics`): `/v1/completions`; acceptance from the
  engine's own spec-decode counters, scraped before and after each prompt (requests are
  sequential, so the difference is that prompt's): tau = 1 + accepted / drafts, and
  per-position acceptance accepted_at_k / drafts, which is eval's chain `unconditional` alpha_k.

`--base-endpoint` is the same target served without speculation: tokens/s of both, the speed-up,
greedy outputs compared token for token, and at temperature > 0 the losslessness check on the
engine: speculative vs plain samples of the first prompt, position by position (chi-square,
as eval's own check), plus the target's mean log-prob of the sampled tokens on each side.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from ..config import config_dict
from ..console import log, print_table, warn
from ..engines.engine_api import EngineClient, TokenCount, Unreachable, checked_count, completion_body, run_sync
from ..engines.engine_api import generate_body as sglang_body
from ..errors import UsageError
from ..prompts import load_prompts, render
from ..run_folder.manifest import atomic_write_json, write_manifest
from .config import EvalConfig
from .paired import ORDER, paired_speedup, run_interleaved, speedup_cell

SAMPLE_POSITIONS = 8  # positions compared by the engine's sampling check (0 is the prefill's token)
PLAIN_SEED_OFFSET = 10_000_019


def generate_body(tokenizer, messages: list[dict], sampling_params: dict) -> dict:
    """The body of SGLang's `POST /generate` for one chat prompt, as eval and serve-bench send it."""
    return sglang_body(render(tokenizer, messages), sampling_params)


def _unreachable(url: str, e: Unreachable) -> UsageError:
    return UsageError(
        f"cannot reach {url} ({e.detail})",
        "a running SGLang or vLLM server",
        "eagle3 serve --target T --head H, then pass its URL",
    )


def _count(url: str, reported, max_tokens, ids) -> TokenCount:
    """The server's completion count, checked (`engine_api.checked_count`): recounted from the token
    ids that came back, or exit 2 where there are none (tau and tok/s are divided by it)."""
    c = checked_count(reported, max_tokens, lambda: len(ids) if isinstance(ids, list) else None)
    if c.source == "refused":
        raise UsageError(
            f"{url}: {c.why}, and its answer carries no token ids to count",
            "completion token counts from 0 to max_tokens, or the answer's token ids",
            "check the server (its usage counting), or measure it with eagle3 serve-bench --target MODEL_DIR",
        )
    return c


def recounted_rows(rows: list[dict]) -> int:
    """Prompts whose token count the server got wrong (counted from the answer's ids), warned about once."""
    bad = [r["tokens_recounted"] for r in rows if r.get("tokens_recounted")]
    if bad:
        warn(f"{len(bad)} answer(s) counted from their token ids: {bad[0]}")
    return len(bad)


# ---------------------------------------------------------------- SGLang
async def _sglang_prompt(client: EngineClient, url: str, ids: list[int], cfg: EvalConfig) -> dict:
    params = {"temperature": cfg.temperature, "top_p": cfg.top_p, "max_new_tokens": cfg.max_new_tokens}
    try:
        r = await client.post(url, "/generate", sglang_body(ids, params))
    except Unreachable as e:
        raise _unreachable(url, e) from e
    if r.status != 200:
        raise UsageError(f"{url}/generate answered HTTP {r.status}: {r.text[:200]}", "HTTP 200 from SGLang")
    data = r.json()
    meta = data.get("meta_info") or {}
    if "spec_verify_ct" not in meta:
        raise UsageError(
            f"{url} reports no spec_verify_ct in meta_info: speculative decoding is off there",
            "a server started with --speculative-algorithm EAGLE3",
            "eagle3 serve --target T --head H",
        )
    out_ids = data.get("output_ids")
    count = _count(url, meta.get("completion_tokens"), cfg.max_new_tokens, out_ids)
    return {
        "completion_tokens": count.n,
        **({"tokens_recounted": count.why} if count.why else {}),
        "verify_ct": int(meta["spec_verify_ct"]),
        "accept_length": meta.get("spec_accept_length"),
        "seconds": r.seconds,
    }


# ---------------------------------------------------------------- vLLM
async def _completion(client: EngineClient, url: str, model: str, body: dict) -> dict:
    try:
        r = await client.post(url, "/v1/completions", {**body, "model": model})
    except Unreachable as e:
        raise _unreachable(url, e) from e
    if r.status != 200:
        raise UsageError(f"{url}/v1/completions answered HTTP {r.status}: {r.text[:300]}", "HTTP 200 from vLLM")
    try:
        data = r.json()
        choice = data["choices"][0]
        tokens = [int(t) for t in choice.get("token_ids") or []]
        lp = (choice.get("logprobs") or {}).get("token_logprobs")
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise UsageError(f"{url}/v1/completions answered 200 without choices[0] ({e})", "a completion") from e
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    count = _count(url, usage.get("completion_tokens"), body.get("max_tokens"), tokens if tokens else None)
    return {
        "completion_tokens": count.n,
        **({"tokens_recounted": count.why} if count.why else {}),
        "token_ids": tokens,
        "finish_reason": choice.get("finish_reason"),
        "logprobs": [float(x) for x in lp if x is not None] if isinstance(lp, list) else None,
        "seconds": r.seconds,
    }


async def _vllm_one(
    client: EngineClient, url: str, model: str, k: int, pid, ids: list[int], cfg: EvalConfig, stop: list[int]
) -> dict:
    """One greedy/sampled completion; the spec-decode counters' difference around it."""
    before = await client.spec_counters(url)
    body = completion_body(model, ids, cfg.max_new_tokens, cfg.temperature, top_p=cfg.top_p, seed=cfg.seed + k)
    res = await _completion(client, url, model, {**body, "stop_token_ids": stop})
    after = await client.spec_counters(url)
    delta = after.minus(before) if after is not None and before is not None else None
    res.update(
        prompt=pid,
        drafts=delta.drafts if delta else 0,
        accepted=delta.accepted if delta else 0,
        per_pos=list(delta.per_pos) if delta else [],
    )
    return res


async def _vllm_runs(client: EngineClient, urls: list[str], prompts: list, cfg: EvalConfig, stop: list[int]):
    """(served model name per URL, rows per URL): the prompts on every server, interleaved (eval/paired.py)."""
    models = {url: await client.model_name([url]) for url in urls}  # each server checks its own name
    rows = await run_interleaved(
        urls, prompts, lambda url, k, pid, ids: _vllm_one(client, url, models[url], k, pid, ids, cfg, stop)
    )
    return models, rows


def acceptance_summary(rows: list[dict]) -> dict:
    """Engine tau and per-position acceptance over all prompts (counter sums)."""
    from ..speculate.acceptance import tau_from_counts, unconditional_from_counts  # lazy: the wing imports torch

    drafts = sum(r["drafts"] for r in rows)
    accepted = sum(r["accepted"] for r in rows)
    k = max((len(r["per_pos"]) for r in rows), default=0)
    per = [sum(r["per_pos"][i] for r in rows if i < len(r["per_pos"])) for i in range(k)]
    return {
        "drafts": drafts,
        "accepted": accepted,
        "tau": tau_from_counts(accepted, drafts),
        "per_position": unconditional_from_counts(per, drafts) if drafts else [],
        "definition": "vLLM counters: tau = 1 + num_accepted_tokens / num_drafts; per_position[k-1] = "
        "num_accepted_tokens_per_pos[k-1] / num_drafts = P(first k draft tokens accepted) "
        "(eval's chain per_depth[k].unconditional)",
    }


async def _samples(
    client: EngineClient, url: str, model: str, ids: list[int], cfg: EvalConfig, stop, seed0: int
) -> list[dict]:
    """`sampling_check` seeded draws of SAMPLE_POSITIONS tokens, 8 in flight."""
    sem = asyncio.Semaphore(8)

    async def one(s: int) -> dict:
        body = completion_body(model, ids, SAMPLE_POSITIONS, cfg.temperature, top_p=cfg.top_p, seed=seed0 + s)
        async with sem:
            return await _completion(client, url, model, {**body, "logprobs": 0, "stop_token_ids": stop})

    return list(await asyncio.gather(*(one(s) for s in range(cfg.sampling_check))))


def sampling_comparison(spec: list[dict], plain: list[dict]) -> dict:
    """Position-wise chi-square of speculative vs plain samples, and mean sampled-token log-prob."""
    from .losslessness import two_sample_chi_square

    tests = []
    for j in range(1, SAMPLE_POSITIONS):
        a = [r["token_ids"][j] for r in spec if len(r["token_ids"]) > j]
        b = [r["token_ids"][j] for r in plain if len(r["token_ids"]) > j]
        if len(a) >= 20 and len(b) >= 20:
            tests.append({"position": j, **two_sample_chi_square(a, b)})
    worst = min((t["p_value"] for t in tests), default=1.0)

    def mean_lp(rows):
        lps = [x for r in rows for x in (r["logprobs"] or [])]
        return sum(lps) / len(lps) if lps else None

    return {
        "draws": len(spec),
        "positions": tests,
        "min_p_value": worst,
        "passed": worst * max(len(tests), 1) >= 0.01,
        "mean_logprob_speculative": mean_lp(spec),
        "mean_logprob_plain": mean_lp(plain),
        "test": "two-sample chi-square per output position, engine speculative vs engine plain samples, "
        "Bonferroni 1%; mean_logprob = the target's log-prob of the sampled tokens as the engine reports them",
    }


def _stop_ids(tok, target_dir: Path) -> list[int]:
    """eval's stop tokens: the generation config's, the model config's and the tokenizer's."""
    ids = {int(tok.eos_token_id)} if tok.eos_token_id is not None else set()
    for name in ("generation_config.json", "config.json"):
        p = Path(target_dir) / name
        try:
            eos = json.loads(p.read_text(encoding="utf-8")).get("eos_token_id") if p.exists() else None
        except (ValueError, AttributeError):
            eos = None
        if eos is not None:
            ids.update(int(i) for i in (eos if isinstance(eos, list) else [eos]))
    return sorted(ids)


# ---------------------------------------------------------------- the command
def run_endpoint_eval(cfg: EvalConfig, endpoint: str) -> Path:
    from ..model.target import open_target

    if not cfg.target:
        raise UsageError(
            "--endpoint needs --target: prompts are rendered with the target's chat template, as the head was trained",
            "--target MODEL_DIR (the model the server runs)",
            f"eagle3 eval --endpoint {endpoint} --target MODEL_DIR",
        )
    opened = open_target(cfg.target)
    target_dir, tok = opened.path, opened.tokenizer
    out = cfg.out or (cfg.run / "eval" if cfg.run else Path("eval"))
    prompts = [(pid, render(tok, msgs)) for pid, msgs in load_prompts(cfg.bench, cfg.num_prompts)]

    async def measure(client: EngineClient) -> dict:
        from .llama_server import SamplingCheck, is_llama_server, llama_server_report

        if await is_llama_server(client, endpoint):
            check = SamplingCheck(SAMPLE_POSITIONS, PLAIN_SEED_OFFSET, sampling_comparison)
            return await llama_server_report(client, endpoint, prompts, cfg, check)
        if await client.is_vllm(endpoint):
            return await _vllm_report(client, endpoint, prompts, cfg, _stop_ids(tok, target_dir))
        rows = [{"prompt": pid, **await _sglang_prompt(client, endpoint, ids, cfg)} for pid, ids in prompts]
        return _sglang_report(endpoint, rows, cfg)

    report = run_sync(measure)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "report.json", report)
    write_manifest(
        out,
        "eval",
        config=config_dict(cfg),
        counts={"prompts": report["num_prompts"], "tokens": report["tokens"]},
        files=["report.json"],
    )
    log(f"eval: wrote {out / 'report.json'}")
    return out


def _sglang_report(endpoint: str, rows: list[dict], cfg: EvalConfig) -> dict:
    toks = sum(r["completion_tokens"] for r in rows)
    verify = sum(r["verify_ct"] for r in rows)
    secs = sum(r["seconds"] for r in rows)
    report = {
        "endpoint": endpoint,
        "engine": "sglang",
        "bench": cfg.bench,
        "num_prompts": len(rows),
        "tokens": toks,
        "tokens_recounted": recounted_rows(rows),
        "temperature": cfg.temperature,
        "tau": toks / verify if verify else None,
        "tau_definition": "completion_tokens / spec_verify_ct summed over prompts (bonus token included)",
        "tokens_per_s_sequential": toks / secs if secs else 0.0,
        "per_prompt": rows,
    }
    print_table(
        f"{endpoint} on {cfg.bench}",
        ["prompts", "tokens", "verify passes", "tau", "tok/s"],
        [
            [
                len(rows),
                toks,
                verify,
                f"{report['tau']:.3f}" if verify else "-",
                f"{report['tokens_per_s_sequential']:.1f}",
            ]
        ],
    )
    return report


async def _vllm_report(client: EngineClient, endpoint: str, prompts: list, cfg: EvalConfig, stop: list[int]) -> dict:
    if cfg.base_endpoint and not await client.is_vllm(cfg.base_endpoint):
        raise UsageError(
            f"--base-endpoint {cfg.base_endpoint} is not a vLLM server (no vllm: counters on /metrics)",
            "the same target served by vLLM without --speculative-config",
        )
    urls = [endpoint, cfg.base_endpoint] if cfg.base_endpoint else [endpoint]
    models, (rows, *based) = await _vllm_runs(client, urls, prompts, cfg, stop)
    toks = sum(r["completion_tokens"] for r in rows)
    secs = sum(r["seconds"] for r in rows)
    acc = acceptance_summary(rows)
    if not acc["drafts"]:
        warn(f"{endpoint} drafted nothing (no vllm:spec_decode counters moved): is --speculative-config set?")
    report: dict = {
        "endpoint": endpoint,
        "engine": "vllm",
        "bench": cfg.bench,
        "num_prompts": len(rows),
        "tokens": toks,
        "tokens_recounted": recounted_rows(rows),
        "temperature": cfg.temperature,
        "max_new_tokens": cfg.max_new_tokens,
        "tau": acc["tau"],
        "tau_definition": acc["definition"],
        "acceptance": acc,
        "tokens_per_s_sequential": toks / secs if secs else 0.0,
        "per_prompt": rows,
    }
    table = [["speculative", len(rows), toks, _f(acc["tau"]), _f(report["tokens_per_s_sequential"], 1), "", ""]]
    if cfg.base_endpoint:
        (base,) = based
        btoks, bsecs = sum(r["completion_tokens"] for r in base), sum(r["seconds"] for r in base)
        differ = [s["prompt"] for s, b in zip(rows, base) if s["token_ids"] != b["token_ids"]]
        bt = btoks / bsecs if bsecs else 0.0
        report["baseline"] = {
            "endpoint": cfg.base_endpoint,
            "tokens": btoks,
            "tokens_per_s_sequential": bt,
            "speedup": report["tokens_per_s_sequential"] / bt if bt else None,
            "speedup_interval": paired_speedup(rows, base)["interval"],
            "outputs_differ": len(differ),
            "differing_prompts": differ,
            "outputs_compared": "generated token ids, speculative vs plain, same seed per prompt",
            "order": ORDER,
        }
        table.append(
            ["plain", len(base), btoks, "1", _f(bt, 1), f"{len(differ)}/{len(rows)}", speedup_cell(report["baseline"])]
        )
        if cfg.temperature == 0 and differ:
            warn(
                f"{len(differ)}/{len(rows)} greedy outputs differ from plain decoding (bf16 rounding ties? serve with --dtype float32)"
            )
        if cfg.temperature > 0 and cfg.sampling_check > 0:
            pid, ids = prompts[0]
            log(f"sampling check: {cfg.sampling_check} speculative vs plain engine samples on {pid}")
            s = await _samples(client, endpoint, models[endpoint], ids, cfg, stop, cfg.seed)
            # other seeds on the plain side: two servers given the same URL are compared on independent draws
            p = await _samples(
                client, cfg.base_endpoint, models[cfg.base_endpoint], ids, cfg, stop, cfg.seed + PLAIN_SEED_OFFSET
            )
            report["sampling_check"] = {"prompt": pid, **sampling_comparison(s, p)}
            sc = report["sampling_check"]
            (log if sc["passed"] else warn)(
                f"engine sampling check {'passed' if sc['passed'] else 'FAILED'}: min p = {sc['min_p_value']:.2g}; "
                f"mean sampled-token log-prob {_f(sc['mean_logprob_speculative'])} speculative vs "
                f"{_f(sc['mean_logprob_plain'])} plain"
            )
    print_table(
        f"{endpoint} on {cfg.bench} (vLLM counters)",
        ["server", "prompts", "tokens", "tau", "tok/s", "outputs differ", "speed-up"],
        table,
    )
    if acc["per_position"]:
        log("per-position acceptance: " + ", ".join(f"{k + 1}: {a:.3f}" for k, a in enumerate(acc["per_position"])))
    return report


def _f(v, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"
