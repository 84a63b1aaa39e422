"""Serve's guard on engine arguments after `--` (issue 52 item 3): every argument that changes the
draft, its weights, its vocab map, the acceptance rule or the target's identity is refused with exit
2 for SGLang and vLLM, in every spelling (flags, `--config` YAML, dotted keys, old names,
positionals); SGLang's table is read from its own parser where it imports (`make sglang-cpu`)."""

from __future__ import annotations

import json

import pytest
from serve_helpers import CHAIN, export_head, serve_args, skip_without_sglang_parser

from eagle3cli.cli import main
from eagle3cli.engines.sglang import DEFAULTS as SGLANG_DEFAULTS
from eagle3cli.serve import engine_args
from eagle3cli.serve.commands import (
    SpecNumbers,
    build_command,
    validate_sglang_argv,
)
from eagle3cli.serve.engine_args import check_engine_args


@pytest.fixture(scope="module")
def head(tiny_target_dir, tmp_path_factory):
    return export_head(tmp_path_factory.mktemp("serve-guard") / "head", tiny_target_dir)


def serve(engine, target, head, extra, monkeypatch):
    """`eagle3 serve --dry-run -- EXTRA` (vLLM's own parser is the slow tier's: not asked here)."""
    import eagle3cli.serve.run as serve_run

    monkeypatch.setattr(serve_run, "default_engine_python", lambda engine: None)
    args = serve_args(target, head, "--engine", engine, "--dry-run")
    if engine == "vllm":
        args += CHAIN
    return main([*args, "--", *extra])


def yaml_file(folder, text):
    path = folder / "engine.yaml"
    path.write_text(text)
    return str(path)


# the engine arguments that swap what serve checked, and a word of the refusal
REFUSED = [
    ("sglang", ["--speculative-accept-threshold-single", "0.01"], "acceptance rule"),
    ("sglang", ["--speculative-accept-threshold-acc=0.01"], "acceptance rule"),
    ("sglang", ["--speculative_accept_threshold_single", "0.5"], "acceptance rule"),
    ("sglang", ["--speculative-use-rejection-sampling"], "acceptance rule"),
    ("sglang", ["--speculative-token-map", "map.pt"], "vocab map"),
    ("sglang", ["--speculative-draft-load-format", "dummy"], "random weights"),
    ("sglang", ["--speculative-draft-model-revision", "main"], "draft head"),
    ("sglang", ["--load-format", "dummy"], "random weights"),
    ("sglang", ["--json-model-override-args", '{"num_hidden_layers": 2}'], "config.json"),
    ("sglang", ["--tokenizer-path", "other"], "tokenizer"),
    ("sglang", ["--revision", "v2"], "another revision"),
    ("sglang", ["--model", "other"], "--target"),
    ("sglang", ["other/model"], "positional"),
    ("sglang", ["--enable-metrics", "other/model"], "positional"),  # --enable-metrics takes no value
    ("sglang", ["--config", "{dir}/engine.yaml"], "acceptance rule"),
    ("vllm", ["-sc.model", "/other/head"], "--head and --steps"),
    ("vllm", ["-sc.num_speculative_tokens=9"], "--head and --steps"),
    ("vllm", ["--speculative-config.model", "/other/head"], "--head and --steps"),
    ("vllm", ["--speculative-model", "/other/head"], "--head"),
    ("vllm", ["--num-speculative-tokens", "9"], "--steps"),
    ("vllm", ["--model-tag", "other"], "--target"),
    ("vllm", ["other/model"], "positional"),
    ("vllm", ["--hf-overrides", '{"num_hidden_layers": 2}'], "config.json"),
    ("vllm", ["--hf_overrides.architectures", "X"], "config.json"),
    ("vllm", ["--load-format=dummy"], "random weights"),
    ("vllm", ["--tokenizer", "other"], "tokenizer"),
    ("vllm", ["--spec-decoding-acceptance-method", "typical_acceptance_sampler"], "acceptance rule"),
    ("vllm", ["--config", "{dir}/engine.yaml"], "--head and --steps"),
]
# what the --config YAML of the cases above holds, per engine
CONFIG = {
    "sglang": "mem-fraction-static: 0.8\nspeculative_accept_threshold_single: 0.01\n",
    "vllm": "max-num-seqs: 4\nspeculative-config:\n  model: /other/head\n  num_speculative_tokens: 9\n",
}


@pytest.mark.parametrize("engine, extra, needle", REFUSED)
def test_serve_refuses_engine_args_that_swap_what_it_checked(
    engine, extra, needle, head, tiny_target_dir, tmp_path, monkeypatch, capsys
):
    if "{dir}/engine.yaml" in extra:
        extra = [yaml_file(tmp_path, CONFIG[engine]) if a == "{dir}/engine.yaml" else a for a in extra]
    code = serve(engine, tiny_target_dir, head, extra, monkeypatch)
    cap = capsys.readouterr()
    text = " ".join(cap.err.split())
    assert code == 2 and "preflight passed" not in text, text
    assert needle in text and "fix:" in text
    assert cap.out == ""  # no command is printed


@pytest.mark.parametrize("use_parser", [True, False], ids=["sglang-parser", "static-table"])
def test_both_sglang_tables_refuse_every_case(use_parser, tmp_path, monkeypatch):
    """The static table (no SGLang here) refuses what the parser-derived one does."""
    if use_parser:
        skip_without_sglang_parser()
    for engine, extra, _ in REFUSED:
        if engine != "sglang":
            continue
        extra = [yaml_file(tmp_path, CONFIG[engine]) if a == "{dir}/engine.yaml" else a for a in extra]
        problems = check_engine_args("sglang", extra, use_parser=use_parser)
        assert any(p.is_error for p in problems), extra


def test_a_config_file_the_guard_cannot_read_is_refused(tmp_path):
    for text in ("[1, 2]\n", "a: [\n"):
        problems = check_engine_args("sglang", ["--config", yaml_file(tmp_path, text)])
        assert [p.is_error for p in problems] == [True] and "cannot be checked" in problems[0].what
    missing = check_engine_args("vllm", ["--config", str(tmp_path / "none.yaml")])
    assert missing[0].is_error and "not a file" in missing[0].what
    nested = yaml_file(tmp_path, f"config: {tmp_path / 'other.yaml'}\n")
    assert check_engine_args("vllm", ["--config", nested])[0].is_error


@pytest.mark.parametrize(
    "engine, extra, warned",
    [
        ("sglang", ["--mem-fraction-static", "0.7", "--enable-metrics", "--load-format", "safetensors"], None),
        ("sglang", ["--speculative-draft-load-format=auto", "--speculative-attention-mode", "decode"], None),
        ("sglang", ["--speculative-adaptive"], "speculation numbers while serving"),
        ("sglang", ["--speculative-draft-model-quantization", "fp8"], "quantized"),
        ("sglang", ["--speculative-ngram-max-trie-depth", "4"], "does not know what this sglang flag does"),
        (
            "vllm",
            ["--max-num-seqs", "4", "--enforce-eager", "--dtype", "float32", "--served-model-name", "a", "b"],
            None,
        ),
        ("vllm", ["-q", "awq"], "quantized"),
    ],
)
def test_harmless_engine_args_pass_and_the_rest_are_warned_about(
    engine, extra, warned, head, tiny_target_dir, monkeypatch, capsys
):
    code = serve(engine, tiny_target_dir, head, extra, monkeypatch)
    text = " ".join(capsys.readouterr().err.split())
    assert code == 0, text
    if warned:
        assert warned in text and f"`{extra[0]}` after `--`" in text
    else:
        assert "after `--`" not in text


def test_the_sglang_table_is_sglangs_own():
    """Each dest of the table is a flag of this SGLang, and the static table (used where SGLang does not
    import) spells each refused flag as SGLang's parser does: a renamed flag fails here first."""
    skip_without_sglang_parser()
    parsed = engine_args.engine_table("sglang", use_parser=True)
    static = engine_args.engine_table("sglang", use_parser=False)
    assert parsed.complete and not static.complete
    dests = set(parsed.options.values())
    e = engine_args.engine("sglang")
    ours = {*e.refused, *e.warned, *e.spec_ok}
    assert ours - dests == set()
    for option, dest in parsed.options.items():
        if dest in e.refused and option.startswith("--"):
            assert static.options.get(option) == dest, option
    # every flag SGLang has about the draft, its map or acceptance is in the table: refused, warned or harmless
    eagle_words = ("draft", "token_map", "accept", "verification", "rejection")
    unknown = {d for d in dests if d.startswith("speculative_") and any(w in d for w in eagle_words)} - ours
    assert unknown == set()


def test_sglangs_parser_reads_refused_args_back_in_any_spelling(tmp_path):
    """Past the guard, the command SGLang parses (its --config merged by SGLang's own code) must hold
    SGLang's default for every refused flag serve does not set itself."""
    skip_without_sglang_parser()

    def check(extra):
        return validate_sglang_argv(build_command("sglang", "T", "H", SGLANG_DEFAULTS, "127.0.0.1", 30000, extra))

    assert check(["--load-format", "safetensors"]).ok
    assert check(["--mem-fraction-static", "0.7"]).ok
    bad = check(["--speculative-token-map", "map.pt"])
    assert not bad.ok and "speculative_token_map='map.pt'" in bad.message
    config = yaml_file(tmp_path, "speculative-accept-threshold-acc: 0.01\n")
    bad = check(["--config", config])
    assert not bad.ok and "speculative_accept_threshold_acc=0.01" in bad.message


def test_vllms_parser_reads_refused_args_back(tmp_path):
    """vLLM's probe (in the engine's python) reports every refused dest it parsed away from its default,
    and the model it would serve; either differing from what serve meant refuses the command."""
    from eagle3cli.serve.vllm_check import validate_vllm_argv

    meant = {"method": "eagle3", "model": "H", "num_speculative_tokens": 3}
    parsed = {"ok": True, "version": "0.x", "model": "T", "speculative_config": meant, "host": "h", "port": 1}

    def probe(found: dict):
        python = tmp_path / "python"
        python.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(found)}\nEOF\n")
        python.chmod(0o755)
        argv = build_command("vllm", "T", "H", SpecNumbers(3, 1, 4, "f"), "h", 1)
        return validate_vllm_argv(argv, str(python), meant, "h", 1, model="T")

    assert probe({**parsed, "changed": {}}).ok
    assert probe({**parsed, "changed": {"load_format": "'safetensors'"}}).ok
    bad = probe({**parsed, "changed": {"hf_overrides": "{'num_hidden_layers': 2}"}})
    assert not bad.ok and "hf_overrides=" in bad.message and "config.json" in bad.message
    bad = probe({**parsed, "model": "other", "changed": {}})
    assert not bad.ok and "model='other' (meant 'T')" in bad.message
