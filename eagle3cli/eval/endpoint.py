"""`eagle3 eval --endpoint URL`: acceptance and speed of a running SGLang server (target + head)
through its native `/generate`, whose `meta_info` carries `spec_verify_ct` (target verification
passes) and `spec_accept_length` next to `completion_tokens`."""

from __future__ import annotations

import time
from pathlib import Path

from ..config import config_dict
from ..console import log, print_table
from ..errors import UsageError
from ..manifest import atomic_write_json, write_manifest
from .config import EvalConfig
from .prompts import load_prompts


def generate_body(tokenizer, messages: list[dict], sampling_params: dict) -> dict:
    """The body of SGLang's `POST /generate` for one chat prompt, as eval and serve-bench send it.

    The prompt is rendered with the target's chat template (heads are trained on templated
    turns) and sent as token ids: sending the rendered text would let the server tokenize it
    again and add a second BOS where the template already has one."""
    from .prompts import render

    return {"input_ids": render(tokenizer, messages), "sampling_params": sampling_params}


def query(client, url: str, body: dict) -> dict:
    import httpx

    t0 = time.perf_counter()
    try:
        r = client.post(url.rstrip("/") + "/generate", json=body)
    except httpx.HTTPError as e:
        raise UsageError(
            f"cannot reach {url} ({type(e).__name__}: {e})",
            "a running SGLang server",
            "eagle3 serve --target T --head H, then pass its URL",
        ) from e
    seconds = time.perf_counter() - t0
    if r.status_code != 200:
        raise UsageError(f"{url}/generate answered HTTP {r.status_code}: {r.text[:200]}", "HTTP 200 from SGLang")
    meta = r.json().get("meta_info") or {}
    if "spec_verify_ct" not in meta:
        raise UsageError(
            f"{url} reports no spec_verify_ct in meta_info: speculative decoding is off there",
            "a server started with --speculative-algorithm EAGLE3",
            "eagle3 serve --target T --head H",
        )
    return {
        "completion_tokens": int(meta.get("completion_tokens", 0)),
        "verify_ct": int(meta["spec_verify_ct"]),
        "accept_length": meta.get("spec_accept_length"),
        "seconds": seconds,
    }


def run_endpoint_eval(cfg: EvalConfig, endpoint: str) -> Path:
    import httpx

    from ..model.target import load_tokenizer, resolve_model_path

    if not cfg.target:
        raise UsageError(
            "--endpoint needs --target: prompts are rendered with the target's chat template, as the head was trained",
            "--target MODEL_DIR (the model the server runs)",
            f"eagle3 eval --endpoint {endpoint} --target MODEL_DIR",
        )
    tok = load_tokenizer(resolve_model_path(cfg.target))
    out = cfg.out or (cfg.run / "eval" if cfg.run else Path("eval"))
    prompts = load_prompts(cfg.bench, cfg.num_prompts)
    params = {"temperature": cfg.temperature, "top_p": cfg.top_p, "max_new_tokens": cfg.max_new_tokens}
    rows = []
    with httpx.Client(timeout=600) as client:
        for pid, msgs in prompts:
            rows.append({"prompt": pid, **query(client, endpoint, generate_body(tok, msgs, params))})
    toks = sum(r["completion_tokens"] for r in rows)
    verify = sum(r["verify_ct"] for r in rows)
    secs = sum(r["seconds"] for r in rows)
    report = {
        "endpoint": endpoint,
        "bench": cfg.bench,
        "num_prompts": len(rows),
        "temperature": cfg.temperature,
        "tau": toks / verify if verify else None,
        "tau_definition": "completion_tokens / spec_verify_ct summed over prompts (bonus token included)",
        "tokens_per_s_sequential": toks / secs if secs else 0.0,
        "per_prompt": rows,
    }
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "report.json", report)
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
    write_manifest(
        out, "eval", config=config_dict(cfg), counts={"prompts": len(rows), "tokens": toks}, files=["report.json"]
    )
    log(f"eval: wrote {out / 'report.json'}")
    return out
