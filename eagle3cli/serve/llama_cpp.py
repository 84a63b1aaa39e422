"""`eagle3 serve --engine llama.cpp`: llama-server with the target and the head as GGUF files.

    llama-server -m target.gguf -md head.gguf --spec-type draft-eagle3 --spec-draft-n-max K

(flags as `common/arg.cpp` of the pinned llama.cpp names them). llama.cpp drafts a chain of up to K
tokens per round, so K is the one speculation number: `--steps`, or the eval report's recommended
steps (`--from-eval`), else llama.cpp's own default 3.

--target and --head may be the transformers folders eagle3 trains with: they are converted once by
`eagle3 export --format gguf` (read back and checked tensor by tensor) into a cache folder keyed by
their contents, `$EAGLE3_GGUF_CACHE/KEY` (default ~/.cache/eagle3/gguf). A folder `export --format gguf` wrote
(head.gguf, and target.gguf) or .gguf files are served as they are, after the preflight below.

Preflight (what llama.cpp would refuse, abort on, or load wrong without a word): the draft's
architecture and its 3 extract layers against the target's layer count (llama.cpp aborts past it),
the feature width and embedding width against the target's, d2t inside the target's vocabulary, one
tokenizer in both files (else llama.cpp refuses the draft), the flags serve owns, the port and the
binary. Once the server is healthy, its `/tokenize` and `/apply-template` are compared with
transformers' tokenizer and chat template on sample texts: a GGUF whose tokenizer differs would
serve different prompts than the head was trained on, so serve stops it (exit 2).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from rich.markup import escape

from ..console import log, out, warn
from ..engines.gguf_export import HEAD_GGUF, TARGET_GGUF, GgufFile, export_gguf, read_gguf, same_tokenizer
from ..errors import UsageError
from ..run_folder.manifest import cache_dir, file_digest, model_fingerprint
from .config import ServeConfig
from .problems import Problem, error, raise_if_errors, warning

ENGINE = "llama.cpp"
DEFAULT_K = 3  # llama-server's --spec-draft-n-max default
OWNED = {
    "-m": "--target",
    "--model": "--target",
    "-md": "--head",
    "--model-draft": "--head",
    "--spec-draft-model": "--head",
    "--spec-type": "(serve sets draft-eagle3)",
    "--spec-draft-n-max": "--steps",
    "--draft-max": "--steps",
    "--draft": "--steps",
    "--host": "--host",
    "--port": "--port",
}
# llama-server flags (llama.cpp's common/arg.cpp) that load another model or draft than the GGUF files
# serve checked, or add adapters over them: refused after `--`, with no serve flag to use instead.
_MODEL = "loads another target than the one serve checked"
_DRAFT = "loads another draft than the head serve checked"
_ADAPTER = "adds adapters over the target the head was trained for"
SWAPS = {
    **dict.fromkeys(("-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-mu", "--model-url"), _MODEL),
    **dict.fromkeys(("-dr", "--docker-repo", "--models-dir", "--models-preset"), _MODEL),
    **dict.fromkeys(("--spec-draft-hf", "-hfd", "-hfrd", "--hf-repo-draft"), _DRAFT),
    **dict.fromkeys(("--lora", "--lora-scaled", "--lora-init-without-apply"), _ADAPTER),
    **dict.fromkeys(("--control-vector", "--control-vector-scaled", "--control-vector-layer-range"), _ADAPTER),
    **dict.fromkeys(("-mm", "--mmproj", "-mmu", "--mmproj-url"), _ADAPTER),
    "--override-kv": "changes the target's metadata, so it is no longer the model serve checked",
}
SAMPLE_TEXTS = (
    "What is 17 * 23? Think step by step.",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "  Leading spaces, trailing tabs\t\tand 3.14159, 2,718 or 1e-9!\n\nNew paragraph.",
    "Ünïcödé: café, naïve, 東京, 🦙 — done.",
)


def which_llama_server() -> str | None:
    from ..engines.local_engine import which_llama_server as find

    return find()


@dataclass(frozen=True)
class Served:
    target_gguf: Path
    head_gguf: Path
    target_dir: Path | None  # the transformers folder, for the tokenizer check
    converted: bool


# ---------------------------------------------------------------- the GGUF files
def cache_root() -> Path:
    """`$EAGLE3_GGUF_CACHE`, else `gguf/` in eagle3's cache (manifest.cache_dir: `$EAGLE3_CACHE`, ~/.cache/eagle3)."""
    if os.environ.get("EAGLE3_GGUF_CACHE"):
        return Path(os.environ["EAGLE3_GGUF_CACHE"])
    return cache_dir() / "gguf"


def _cache_key(head: Path, target: Path) -> str:
    h = hashlib.sha256(b"eagle3-gguf/1\n")
    h.update((head / "config.json").read_bytes())
    h.update(file_digest(head / "model.safetensors").encode())
    h.update(model_fingerprint(target).encode())
    return h.hexdigest()[:16]


def resolve_gguf(target: Path, head: Path) -> Served:
    """The two files llama-server loads, converting transformers folders once (cached by content)."""
    target, head = Path(target), Path(head)
    head_gguf = head if head.suffix == ".gguf" else head / HEAD_GGUF if (head / HEAD_GGUF).is_file() else None
    target_dir = target if (target / "config.json").is_file() else None
    if target.suffix == ".gguf":
        target_gguf: Path | None = target
    elif head_gguf is not None and head_gguf.parent == head and (head / TARGET_GGUF).is_file() and target_dir is None:
        target_gguf = head / TARGET_GGUF
    else:
        target_gguf = None
    for p, flag in ((target_gguf, "--target"), (head_gguf, "--head")):
        if p is not None and not p.is_file():
            raise UsageError(f"{flag} {p} does not exist", "a .gguf file or a model folder", "eagle3 serve --help")
    if target_gguf is not None and head_gguf is not None:
        return Served(target_gguf, head_gguf, target_dir, False)
    if target_dir is None:
        raise UsageError(
            f"--target {target} is neither a .gguf file nor a model folder with config.json",
            "the target as a transformers folder (converted here) or a .gguf file",
            "eagle3 serve --engine llama.cpp --target models/tiny-target --head runs/demo/head",
        )
    if head_gguf is None and not (head / "model.safetensors").is_file():
        raise UsageError(
            f"--head {head} holds neither head.gguf nor model.safetensors",
            "a head folder (runs/NAME/head), a folder `eagle3 export --format gguf` wrote, or a .gguf file",
            "eagle3 train --run runs/NAME   (exports runs/NAME/head)",
        )
    if head_gguf is not None and target_gguf is None and (head_gguf.parent / TARGET_GGUF).is_file():
        return Served(head_gguf.parent / TARGET_GGUF, head_gguf, target_dir, False)
    folder = cache_root() / (
        _cache_key(head, target_dir) if head_gguf is None else f"target-{model_fingerprint(target_dir)}"
    )
    if not (folder / "manifest.json").is_file():
        log(f"converting to GGUF for llama.cpp (once; cached in {escape(str(folder))})")
        export_gguf(head if head_gguf is None else None, target_dir, folder, overwrite=True)
    return Served(folder / TARGET_GGUF, head_gguf or folder / HEAD_GGUF, target_dir, True)


# ---------------------------------------------------------------- preflight
def check_pair(head: GgufFile, target: GgufFile) -> list[Problem]:
    """The head GGUF against the target GGUF: what llama.cpp refuses, aborts on, or loads silently wrong."""
    fix = "re-export both from the same target: eagle3 export --head HEAD --format gguf --target T --out DIR"
    if head.arch != "eagle3":
        return [error(f"{head.path} is a {head.arch!r} model, not an EAGLE-3 draft ('eagle3')", fix)]
    problems = []
    n_layer = target.get("{arch}.block_count")
    n_embd = target.get("{arch}.embedding_length")
    layers = head.get("{arch}.target_layers")
    layers = [int(x) for x in layers] if isinstance(layers, list) else None
    if layers is None or len(layers) != 3:
        problems.append(error(f"the head's eagle3.target_layers is {layers!r}; llama.cpp reads exactly 3", fix))
    elif isinstance(n_layer, int):
        past = [k for k in layers if k > n_layer or k < 0]
        if past:
            problems.append(
                error(f"extract layers {past} are not layers of the {n_layer}-layer target (llama.cpp aborts)", fix)
            )
        elif n_layer in layers:
            problems.append(
                warning(
                    f"extract layer {n_layer} = the target's output: llama.cpp feeds its last hidden state, "
                    "which eagle3 heads are never trained on",
                    "check the head was made for this target",
                )
            )
    if head.get("{arch}.target_hidden_size") != n_embd:
        problems.append(
            error(
                f"the head reads {head.get('{arch}.target_hidden_size')}-wide target features; the target is {n_embd}",
                fix,
            )
        )
    if "token_embd.weight" not in head.shapes and head.get("{arch}.embedding_length") != n_embd:
        problems.append(
            error(
                f"the head is {head.get('{arch}.embedding_length')} wide and has no embeddings of its own; it "
                f"takes the target's, {n_embd} wide",
                fix,
            )
        )
    if "d2t" in head.tensors:
        vocab = len(target.fields.get("tokenizer.ggml.tokens") or [])
        top = int(head.tensors["d2t"].max()) if head.tensors["d2t"].size else -1
        if top >= vocab:
            problems.append(error(f"d2t reaches target id {top}, past the target's {vocab} tokens", fix))
    problems += [
        error(p + " (llama.cpp refuses a draft with another vocabulary)", fix) for p in same_tokenizer(head, target)
    ]
    return problems


def check_extra(extra) -> list[Problem]:
    return [
        error(
            f"`{a}` after `--` sets what eagle3 serve sets itself (and checks)",
            f"use serve's own flag {OWNED[a.split('=', 1)[0]]} instead, and drop it after `--`",
        )
        for a in extra
        if a.split("=", 1)[0] in OWNED
    ] + [
        error(
            f"`{a}` after `--` {SWAPS[a.split('=', 1)[0]]}",
            "serve the head with the GGUF files serve converts and checks: --target and --head, no model flags after `--`",
        )
        for a in extra
        if a.split("=", 1)[0] in SWAPS
    ]


def draft_n_max(cfg: ServeConfig) -> tuple[int, str]:
    """K = --spec-draft-n-max: --steps, or the eval report's recommended steps, or llama.cpp's default."""
    from .commands import spec_from_eval

    if cfg.topk not in (None, 1) or (
        cfg.draft_tokens is not None and cfg.steps is not None and cfg.draft_tokens != cfg.steps + 1
    ):
        raise UsageError(
            f"--topk {cfg.topk} / --draft-tokens {cfg.draft_tokens}: llama.cpp's EAGLE-3 drafts a chain",
            "--steps K alone (K draft tokens per round, --spec-draft-n-max)",
            "eagle3 serve --engine llama.cpp --target T --head H --steps 3",
        )
    if cfg.steps is not None:
        if cfg.from_eval is not None:
            raise UsageError("--from-eval and --steps both given", "one source for K", "drop one of them")
        if not isinstance(cfg.steps, int) or cfg.steps < 1:
            raise UsageError(f"--steps {cfg.steps!r}", "an integer >= 1", "--steps 3")
        return cfg.steps, "--steps"
    if cfg.from_eval is not None:
        spec = spec_from_eval(cfg.from_eval)
        return spec.steps, spec.source
    return DEFAULT_K, "llama.cpp's default --spec-draft-n-max"


def llama_cpp_argv(binary: str, served: Served, k: int, host: str, port: int, extra=()) -> list[str]:
    return [
        binary, "-m", str(served.target_gguf), "-md", str(served.head_gguf),
        "--spec-type", "draft-eagle3", "--spec-draft-n-max", str(k),
        "--host", host, "--port", str(port),
        "--metrics",  # the spec-decode counters eval --endpoint reads tau from
        *extra,
    ]  # fmt: skip


def format_argv(argv: list[str]) -> str:
    """Copy-pasteable, one flag (with its value) per line."""
    import shlex

    lines, i = [shlex.quote(argv[0])], 1
    while i < len(argv):
        takes_value = i + 1 < len(argv) and not argv[i + 1].startswith("-")
        lines.append(shlex.join(argv[i : i + 2] if takes_value else argv[i : i + 1]))
        i += 2 if takes_value else 1
    return " \\\n    ".join(lines)


# ---------------------------------------------------------------- after start: the tokenizer
def tokenizer_check(base_url: str, target_dir: Path) -> str | None:
    """None when llama-server tokenizes and templates like transformers; else what differs."""
    from ..engines.engine_api import EngineClient, Unreachable, run_sync
    from ..model.target import load_tokenizer

    tok = load_tokenizer(target_dir)

    async def ask(c: EngineClient) -> str | None:
        for text in SAMPLE_TEXTS:
            got = (await c.post(base_url, "/tokenize", {"content": text, "add_special": False})).json()["tokens"]
            want = tok.encode(text, add_special_tokens=False)
            if got != want:
                return f"llama-server tokenizes {text!r} as {got[:12]}..., transformers as {want[:12]}..."
        if getattr(tok, "chat_template", None):
            msgs = [{"role": "user", "content": SAMPLE_TEXTS[0]}]
            r = await c.post(base_url, "/apply-template", {"messages": msgs})
            got_prompt = r.json().get("prompt") if r.status == 200 else None
            want_prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            if got_prompt is not None and got_prompt != want_prompt:
                return f"llama-server's chat template renders {got_prompt!r}; transformers' {want_prompt!r}"
        return None

    try:
        return run_sync(ask, timeout_s=60.0)
    except (Unreachable, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"could not ask llama-server to tokenize ({type(e).__name__}: {e})"


# ---------------------------------------------------------------- the command
def run_llama_cpp(cfg: ServeConfig) -> int:
    from .launch import launch
    from .machine import check_port

    assert cfg.target is not None and cfg.head is not None  # validate() requires both
    k, k_source = draft_n_max(cfg)
    problems = check_extra(cfg.extra_args)
    raise_if_errors(problems, "eagle3 serve --help")
    binary = which_llama_server()
    served = resolve_gguf(Path(cfg.target), Path(cfg.head))
    head = read_gguf(served.head_gguf, tensors={"d2t"})
    target = read_gguf(served.target_gguf, tensors=False)
    problems = check_pair(head, target)
    if not cfg.dry_run:
        if binary is None:
            problems.append(
                error("llama-server is not built here (.llama-cpp/build/bin, or on PATH)", "make llama-cpp")
            )
        problems += check_port(cfg.host, cfg.port)
    for p in problems:
        if not p.is_error:
            warn(f"{escape(p.what)}\n  fix: {escape(p.fix)}")
    raise_if_errors(problems, "fix the files/flags above, then re-run with --dry-run to check")
    argv = llama_cpp_argv(binary or "llama-server", served, k, cfg.host, cfg.port, cfg.extra_args)
    log(f"speculation: draft-eagle3, chain of up to K={k} draft tokens per round (from {escape(k_source)})")
    if cfg.dry_run:
        log("preflight passed; --dry-run: the command is printed, nothing is started")
        out.print(format_argv(argv), markup=False, highlight=False, soft_wrap=True)
        return 0
    from .launch import local_host

    def on_ready(url: str) -> str | None:
        if served.target_dir is None:
            warn("--target is a .gguf file: the tokenizer is not compared with transformers'")
            return None
        return tokenizer_check(url, served.target_dir)

    base = f"http://{local_host(cfg.host)}:{cfg.port}"
    chat = json.dumps(
        {"messages": [{"role": "user", "content": "What is 17 * 23?"}], "max_tokens": 64, "temperature": 0}
    )
    ready = (
        "# OpenAI-compatible chat; `timings.draft_n` / `draft_n_accepted` show speculation at work:\n"
        f"curl -s {base}/v1/chat/completions -H 'Content-Type: application/json' -d '{chat}'"
    )
    return launch(
        argv, cfg.host, cfg.port, health_timeout_s=cfg.health_timeout, ready_message=ready,
        log_prefix="llama-server", on_ready=on_ready,
    )  # fmt: skip
