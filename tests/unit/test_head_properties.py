"""Issue 61's two properties of the one head check, over every crafted head of `head_fixtures.CRAFTED`
(>= 20) and every engine, on the committed tiny target:

1. every head eval refuses, serve refuses for every engine (SGLang, vLLM, llama.cpp);
2. what `export --format F` writes passes `serve --engine E`'s check of a head folder, E the engine
   that serves F (gguf: the folder llama.cpp's converter is handed).

The check functions are called directly (eval: `load_any_head` against the target, as `_load_heads`
asks it; serve: `problems(head, target, engine)`, the head part of `serve --dry-run`; llama.cpp: the check
`export --format gguf` and `serve --engine llama.cpp` refuse a head folder by); one case each goes
through the command line."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from cli_helpers import err, wide_console  # noqa: F401
from head_fixtures import CRAFTED, crafted_heads
from serve_helpers import CHAIN, check_head, serve_args

from eagle3cli.cli import main
from eagle3cli.errors import StageError, UsageError
from eagle3cli.export.run import EXPORT_FORMATS, export_head
from eagle3cli.head.check import problems, read_target
from eagle3cli.head.read import load_any_head
from eagle3cli.head.table import FORMAT_ENGINE
from eagle3cli.head.write import layout_files, write_head_files

SERVING = ("sglang", "vllm", "llama.cpp")


@pytest.fixture(scope="module")
def corpus(trained_target_dir, tmp_path_factory) -> dict[str, Path]:
    return crafted_heads(trained_target_dir, tmp_path_factory.mktemp("crafted"))


@pytest.fixture(scope="module")
def facts(trained_target_dir):
    return read_target(trained_target_dir)  # one reading of the target's tokenizer for every case


def eval_refusal(head: Path, facts) -> str | None:
    """What eval's head loading says of `head` on the target (None: it evaluates it)."""
    try:
        load_any_head(head, None, target=facts)
    except (UsageError, StageError) as e:
        return e.what
    return None


def serve_errors(head: Path, target: Path, engine: str, facts) -> list[str]:
    if engine == "llama.cpp":  # serve converts a head folder with export --format gguf, which asks this
        return [p.what for p in problems(head, facts, "llama.cpp") if p.is_error]
    return [p.what for p in check_head(head, target, engine) if p.is_error]


def test_the_corpus_is_large_and_holds_heads_eval_accepts_and_refuses(corpus, facts):
    assert len(corpus) >= 20 and set(corpus) == set(CRAFTED)
    verdicts = {name: eval_refusal(h, facts) is None for name, h in corpus.items()}
    assert verdicts["good"] and verdicts["sglang-layout"] and verdicts["vllm-layout"]
    assert sum(verdicts.values()) >= 5 and sum(not v for v in verdicts.values()) >= 15, verdicts


def test_every_head_eval_refuses_every_engine_refuses(corpus, trained_target_dir, facts):
    refused = {name: eval_refusal(h, facts) for name, h in corpus.items()}
    broken = [
        (name, engine)
        for name, why in refused.items()
        if why is not None
        for engine in SERVING
        if not serve_errors(corpus[name], trained_target_dir, engine, facts)
    ]
    assert broken == [], broken


def test_what_export_writes_passes_the_serving_engines_check(corpus, trained_target_dir, facts, tmp_path):
    written, failed = 0, []
    for name, head in corpus.items():
        if eval_refusal(head, facts) is not None:
            continue  # export reads heads as eval does: refused before anything is written
        for fmt in EXPORT_FORMATS:
            out = tmp_path / f"{name}-{fmt}"
            try:
                export_head(head, fmt, out)
            except UsageError:
                assert not out.exists(), (name, fmt)
                continue
            written += 1
            found = serve_errors(out, trained_target_dir, FORMAT_ENGINE[fmt], facts)
            if found:
                failed.append((name, fmt, found))
        # gguf: the folder llama.cpp's converter is handed (the converter may not be here)
        if not [p for p in problems(head, facts, "llama.cpp") if p.is_error]:
            draft, spec = load_any_head(head, None, target=facts)
            with tempfile.TemporaryDirectory() as staged:
                write_head_files(Path(staged), *layout_files(draft, spec, "vllm"))
                found = serve_errors(Path(staged), trained_target_dir, "llama.cpp", facts)
            written += 1
            if found:
                failed.append((name, "gguf", found))
    assert failed == [] and written >= 15, (written, failed)


def test_serve_refuses_what_eval_refuses_on_the_command_line(corpus, trained_target_dir, tmp_path, capsys):
    head = corpus["another-vocab"]
    assert main(["eval", "--target", str(trained_target_dir), "--head", str(head), "--out", str(tmp_path / "e")]) == 2
    for engine in ("sglang", "vllm"):
        assert main(serve_args(trained_target_dir, head, "--engine", engine, *CHAIN, "--dry-run")) == 2
        assert "another vocabulary" in err(capsys)


# vLLM's own parser checks a vLLM command in the engine's environment where it is installed: ~15 s
@pytest.mark.parametrize("fmt", ["sglang", *(pytest.param(f, marks=pytest.mark.slow) for f in ("vllm", "speculators"))])
def test_an_export_is_served_on_the_command_line(fmt, corpus, trained_target_dir, tmp_path, capsys):
    out = tmp_path / fmt
    assert main(["export", "--head", str(corpus["sglang-layout"]), "--format", fmt, "--out", str(out)]) == 0
    engine = FORMAT_ENGINE[fmt]
    assert main(serve_args(trained_target_dir, out, "--engine", engine, *CHAIN, "--dry-run")) == 0, err(capsys)
