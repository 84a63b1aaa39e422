"""Every serve recipe loads into its config, names itself in its header, and (for SGLang) yields a
command SGLang's parser accepts. No weights needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3cli.config import build_config
from eagle3cli.engines.sglang import DEFAULTS as SGLANG_DEFAULTS
from eagle3cli.serve.commands import (
    build_command,
    resolve_spec,
    sglang_parser_unavailable_reason,
    validate_sglang_argv,
)
from eagle3cli.serve.config import BenchConfig, ServeConfig

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "recipes" / "serve").glob("*.yaml"))


def test_there_are_recipes():
    names = {p.name for p in RECIPES}
    assert {"tiny-target.yaml", "llama3-8b.yaml", "bench-local.yaml"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_loads_and_parses(path):
    rel = path.relative_to(REPO)
    header = path.read_text().splitlines()[0]
    assert header.startswith("# eagle3 ") and f"--recipe {rel}" in header
    if "serve-bench" in header:
        cfg = build_config(BenchConfig, path, "serve_bench")
        assert cfg.spec_url and cfg.concurrency
        return
    cfg = build_config(ServeConfig, path, "serve")
    spec = SGLANG_DEFAULTS if cfg.from_eval else resolve_spec(cfg.steps, cfg.topk, cfg.draft_tokens, None)
    argv = build_command(cfg.engine, cfg.target, cfg.head, spec, cfg.host, cfg.port, list(cfg.extra_args))
    reason = sglang_parser_unavailable_reason()
    if cfg.engine != "sglang" or reason is not None:
        pytest.skip(f"not an SGLang recipe, or sglang's parser is not importable ({reason})")
    check = validate_sglang_argv(argv)
    assert check.ok, check.message
