"""`eagle3 serve --engine llama.cpp`: llama-server with the target and the head as GGUF files (its
command: `engines/llama_cpp.py`). llama.cpp drafts a chain of up to K
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
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.markup import escape

from ..console import log, warn
from ..engines.gguf_export import (
    HEAD_GGUF,
    TARGET_GGUF,
    GgufFile,
    export_gguf,
    read_gguf,
    same_tokenizer,
)
from ..engines.llama_cpp import DEFAULTS
from ..engines.local_engine import which_llama_server
from ..engines.serving import SpecNumbers
from ..errors import UsageError
from ..head.check import Problem, error, llama_cpp_layer_problems, raise_if_errors
from ..run_folder.manifest import cache_dir, file_digest, model_fingerprint
from ..speculate.vocab import map_problems
from .commands import build_command, print_or_launch, refuse_errors, spec_from_eval
from .config import ServeConfig
from .engine_args import check_engine_args

SAMPLE_TEXTS = (
    "What is 17 * 23? Think step by step.",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "  Leading spaces, trailing tabs\t\tand 3.14159, 2,718 or 1e-9!\n\nNew paragraph.",
    "Ünïcödé: café, naïve, 東京, 🦙 — done.",
)


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
    layers = [int(x) for x in layers] if isinstance(layers, list) else []
    problems += [error(p, fix) for p in llama_cpp_layer_problems(layers, n_layer if isinstance(n_layer, int) else None)]
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
    if "d2t" in head.tensors:  # absolute target ids in a GGUF; the one rule for maps reads offsets
        d2t = torch.from_numpy(head.tensors["d2t"])
        vocab = len(target.fields.get("tokenizer.ggml.tokens") or [])
        problems += [error(f"d2t: {p}", fix) for p in map_problems(d2t - torch.arange(len(d2t)), None, vocab)]
    problems += [
        error(p + " (llama.cpp refuses a draft with another vocabulary)", fix) for p in same_tokenizer(head, target)
    ]
    return problems


def draft_n_max(cfg: ServeConfig) -> tuple[int, str]:
    """K = --spec-draft-n-max: --steps, or the eval report's recommended steps, or llama.cpp's default."""
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
    return DEFAULTS.steps, DEFAULTS.source


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
    from .machine import check_port

    assert cfg.target is not None and cfg.head is not None  # validate() requires both
    k, k_source = draft_n_max(cfg)
    raise_if_errors(check_engine_args("llama.cpp", cfg.extra_args), "eagle3 serve --help")
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
    refuse_errors(problems, "fix the files/flags above, then re-run with --dry-run to check")
    spec = SpecNumbers(k, 1, k + 1, k_source)
    argv = build_command(
        "llama.cpp", served.target_gguf, served.head_gguf, spec, cfg.host, cfg.port, cfg.extra_args, binary
    )
    log(f"speculation: draft-eagle3, chain of up to K={k} draft tokens per round (from {escape(k_source)})")

    def on_ready(url: str) -> str | None:
        if served.target_dir is None:
            warn("--target is a .gguf file: the tokenizer is not compared with transformers'")
            return None
        return tokenizer_check(url, served.target_dir)

    return print_or_launch(cfg, argv, log_prefix="llama-server", on_ready=on_ready)
