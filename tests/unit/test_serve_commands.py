"""Engine commands: built from flags / eval report / defaults, and parsed by SGLang's own parser.

The parser tests need `from sglang.srt.server_args import ServerArgs` to import; on a CPU machine
that is `make sglang-cpu` (sglang --no-deps plus a few light packages). Without it they skip and
say why.
"""

from __future__ import annotations

import json
import shlex

import pytest
from serve_helpers import CHAIN, export_head, printed_command, serve_args, skip_without_sglang_parser

from eagle3cli.cli import main
from eagle3cli.engines.sglang import DEFAULTS as SGLANG_DEFAULTS
from eagle3cli.errors import UsageError
from eagle3cli.serve.commands import (
    SpecNumbers,
    build_command,
    format_command,
    ready_request,
    resolve_spec,
    spec_from_eval,
    validate_sglang_argv,
)


@pytest.fixture(scope="module")
def sglang_parser():
    skip_without_sglang_parser()


@pytest.fixture(scope="module")
def head(tiny_target_dir, tmp_path_factory):
    return export_head(tmp_path_factory.mktemp("serve-cmd") / "head", tiny_target_dir)


def write_report(folder, recommended):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps({"tau": 3.1, "recommended": recommended}))
    return folder


# ---------------------------------------------------------------- numbers
def test_resolve_spec_sources(tmp_path):
    assert resolve_spec(None, None, None, None) == SGLANG_DEFAULTS
    assert resolve_spec(3, 1, 4, None) == SpecNumbers(3, 1, 4, "--steps/--topk/--draft-tokens (flags or recipe)")
    ev = write_report(tmp_path / "eval", {"steps": 6, "topk": 1, "num_draft_tokens": 7})
    s = resolve_spec(None, None, None, ev)
    assert (s.steps, s.topk, s.draft_tokens) == (6, 1, 7) and "report.json" in s.source
    with pytest.raises(UsageError, match="both given"):
        resolve_spec(3, 1, 4, ev)
    assert spec_from_eval(tmp_path).steps == 6  # the run folder works too


def test_eval_report_errors(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        spec_from_eval(tmp_path / "nope")
    ev = write_report(tmp_path / "eval", {"steps": 6})
    with pytest.raises(UsageError, match="usable `recommended`"):
        spec_from_eval(ev)


# ---------------------------------------------------------------- command shapes
def test_sglang_command_shape():
    argv = build_command(
        "sglang", "T", "H", SpecNumbers(3, 1, 4, "flags"), "0.0.0.0", 31000, ["--tp-size", "2"], "python"
    )
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    pairs = dict(zip(argv[3:-2:2], argv[4:-2:2]))
    assert pairs == {
        "--model-path": "T",
        "--speculative-algorithm": "EAGLE3",
        "--speculative-draft-model-path": "H",
        "--speculative-num-steps": "3",
        "--speculative-eagle-topk": "1",
        "--speculative-num-draft-tokens": "4",
        "--host": "0.0.0.0",
        "--port": "31000",
    }
    assert argv[-2:] == ["--tp-size", "2"]


def test_vllm_command_shape():
    argv = build_command("vllm", "T", "H", SpecNumbers(5, 1, 6, "flags"), "127.0.0.1", 8000)
    assert argv[1:3] == ["serve", "T"] and argv[argv.index("--port") + 1] == "8000"
    cfg = json.loads(argv[argv.index("--speculative-config") + 1])
    assert cfg == {"method": "eagle3", "model": "H", "num_speculative_tokens": 5}


def test_format_command_round_trips():
    argv = build_command("sglang", "/m/t x", "/h", SpecNumbers(3, 1, 4, "f"), "127.0.0.1", 1, ["--enable-metrics"])
    text = format_command(argv)
    assert text.count("\\\n") == len(text.splitlines()) - 1
    assert shlex.split(text.replace("\\\n", " ")) == argv
    v = build_command("vllm", "T", "H", SpecNumbers(3, 1, 4, "f"), "h", 2)
    assert shlex.split(format_command(v).replace("\\\n", " ")) == v


def test_ready_request_is_valid_json():
    text = ready_request("sglang", "0.0.0.0", 30000, "models/t")
    assert "http://127.0.0.1:30000/generate" in text and "/v1/chat/completions" in text
    bodies = [shlex.split(line)[-1] for line in text.splitlines() if line.startswith("curl")]
    assert all(isinstance(json.loads(b), dict) for b in bodies)


# ---------------------------------------------------------------- SGLang's own parser
@pytest.mark.parametrize(
    "spec,extra",
    [
        (SGLANG_DEFAULTS, []),
        (SpecNumbers(3, 1, 4, "chain"), []),
        (SpecNumbers(5, 8, 32, "tree"), ["--mem-fraction-static", "0.8", "--context-length", "4096"]),
        (
            SpecNumbers(7, 1, 8, "deep chain"),
            ["--tp-size", "2", "--dtype", "bfloat16", "--cuda-graph-max-bs-decode", "32"],
        ),
    ],
)
def test_commands_parse_under_sglang(sglang_parser, spec, extra):
    check = validate_sglang_argv(
        build_command("sglang", "models/tiny-target", "runs/demo/head", spec, "127.0.0.1", 30000, extra)
    )
    assert check.available and check.ok, check.message


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--mem-frac", "0.8"], "unrecognized arguments: --mem-frac"),  # abbreviations are refused
        (["--speculative-eagle-topk", "x"], "invalid int value"),
        (["--no-such-flag"], "unrecognized arguments"),
    ],
)
def test_sglang_rejects_bad_flags(sglang_parser, extra, needle):
    check = validate_sglang_argv(build_command("sglang", "T", "H", SGLANG_DEFAULTS, "127.0.0.1", 30000, extra))
    assert check.available and not check.ok and needle in check.message


def test_sglang_parsed_values_are_checked(sglang_parser):
    # a later flag overrides ours: SGLang would run steps=9, and the check reads it back from ServerArgs
    argv = build_command(
        "sglang", "T", "H", SpecNumbers(3, 1, 4, "f"), "127.0.0.1", 30000, ["--speculative-num-steps", "9"]
    )
    check = validate_sglang_argv(argv)
    assert check.ok, check.message  # the last occurrence is what we mean, and what SGLang runs
    from sglang.srt.server_args import ServerArgs  # noqa: F401 — importable, per the fixture


def test_dry_run_prints_a_command_sglang_parses(sglang_parser, head, tiny_target_dir, tmp_path, capsys):
    """The exported head passes preflight and its dry-run command parses (the issue's 'done when')."""
    ev = write_report(tmp_path / "eval", {"steps": 4, "topk": 1, "num_draft_tokens": 5})
    code = main(
        serve_args(tiny_target_dir, head, "--from-eval", str(ev), "--dry-run", "--port", "30123", "--")
        + ["--mem-fraction-static", "0.7"]
    )
    cap = capsys.readouterr()
    assert code == 0, cap.err
    argv = printed_command(cap.out)
    assert argv[argv.index("--speculative-num-steps") + 1] == "4"
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "5"
    assert argv[-2:] == ["--mem-fraction-static", "0.7"]
    check = validate_sglang_argv(argv)
    assert check.ok, check.message
    assert "parsed by sglang" in cap.err


def test_dry_run_refuses_abbreviated_engine_flag(sglang_parser, head, tiny_target_dir, capsys):
    code = main(serve_args(tiny_target_dir, head, "--dry-run", "--", "--mem-frac", "0.8"))
    assert code == 2 and "rejects the command" in " ".join(capsys.readouterr().err.split())


@pytest.mark.slow  # vLLM's own parser in its venv: ~11 s a call
def test_dry_run_vllm(head, tiny_target_dir, capsys):
    code = main(serve_args(tiny_target_dir, head, "--engine", "vllm", "--dry-run", *CHAIN))
    cap = capsys.readouterr()
    assert code == 0, cap.err
    argv = printed_command(cap.out)
    assert json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"] == 3


def test_dry_run_vllm_refuses_a_tree(head, tiny_target_dir, capsys):
    args = serve_args(tiny_target_dir, head, "--engine", "vllm", "--dry-run")
    code = main([*args, "--steps", "5", "--topk", "4", "--draft-tokens", "8"])  # SGLang's default tree
    assert code == 2 and "drafts a chain" in " ".join(capsys.readouterr().err.split())


@pytest.mark.slow  # vLLM's own parser in its venv: ~11 s a call
def test_vllm_without_numbers_drafts_its_default_chain(head, tiny_target_dir, capsys):
    code = main(serve_args(tiny_target_dir, head, "--engine", "vllm", "--dry-run"))
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0 and '"num_speculative_tokens": 3' in out


@pytest.mark.slow  # vLLM's own parser in its venv: ~11 s a call
def test_recipe_supplies_flags(head, tiny_target_dir, tmp_path, capsys):
    recipe = tmp_path / "serve.yaml"
    recipe.write_text(
        f"serve:\n  target: {tiny_target_dir}\n  head: {head}\n  engine: vllm\n  steps: 2\n"
        f"  topk: 1\n  draft_tokens: 3\n  port: 30999\n"
    )
    code = main(["serve", "--recipe", str(recipe), "--dry-run", "--port", "31000"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    assert "--port 31000" in cap.out and '"num_speculative_tokens": 2' in cap.out
    recipe.write_text("serve:\n  steps: 2\n  topc: 1\n")
    assert main(["serve", "--recipe", str(recipe), "--dry-run"]) == 2
    assert "unknown key(s) for serve: topc" in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize(
    "engine, extra, own",
    [
        ("sglang", ["--model-path", "other"], "--target"),
        ("sglang", ["--speculative-num-steps=9"], "--steps"),
        ("sglang", ["--port", "31999"], "--port"),
        ("sglang", ["--speculative-draft-model-path", "/tmp/other-head"], "--head"),
        ("vllm", ["--speculative-config", "{}"], "--head and --steps"),
    ],
)
def test_engine_args_after_dashes_cannot_override_what_serve_checked(head, tiny_target_dir, capsys, engine, extra, own):
    """Issue 24: SGLang takes the last value, so `-- --model-path other` served another model unchecked."""
    args = serve_args(tiny_target_dir, head, "--engine", engine, "--dry-run")
    if engine == "vllm":
        args += CHAIN
    code = main([*args, "--", *extra])
    cap = capsys.readouterr()
    text = " ".join(cap.err.split())
    assert code == 2 and "preflight passed" not in text
    assert f"use serve's own flag {own} instead" in text and extra[0].split("=")[0] in text
    assert "--model-path" not in cap.out  # no command is printed


@pytest.mark.parametrize(
    "engine,arg",
    [
        ("vllm", "--speculative_config"),
        ("vllm", "--speculative-config.model=/other/head"),
        ("vllm", "--speculative-config={}"),
        ("vllm", "--speculative-conf"),
        ("sglang", "--speculative_draft_model_path=/other"),
        ("sglang", "--Port=1"),
    ],
)
def test_the_engine_argument_guard_matches_the_engines_own_spellings(engine, arg):
    from eagle3cli.serve.engine_args import check_engine_args as check_extra_args

    assert check_extra_args(engine, [arg, "x"]), arg
    assert not check_extra_args(engine, ["--max-num-seqs", "4", "--dtype", "float32"])


def test_vllm_serves_a_target_that_names_no_architecture_from_a_lasting_copy(
    head, tiny_target_dir, tmp_path, monkeypatch, capsys
):
    """SmolLM2 from `make smollm2` (GGUF-converted) has "architectures": null, which vLLM refuses:
    serve runs a copy that names the class, kept in eagle3's cache so the printed command runs later,
    and never edits the target (its fingerprint keys its corpora and heads)."""
    import shutil

    import eagle3cli.serve.run as serve_run

    monkeypatch.setattr(serve_run, "default_engine_python", lambda engine: None)  # vLLM's parser: slow tier
    monkeypatch.setenv("EAGLE3_CACHE", str(tmp_path / "cache"))
    target = tmp_path / "converted"
    shutil.copytree(tiny_target_dir, target)
    cfg = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**cfg, "architectures": None}))
    before = (target / "config.json").read_bytes()
    chain = ("--engine", "vllm", "--dry-run", "--steps", "2", "--topk", "1", "--draft-tokens", "3")
    args = serve_args(target, head, *chain)
    assert main(args) == 0
    cap = capsys.readouterr()
    assert "names no architectures" in " ".join(cap.err.split())
    argv = printed_command(cap.out)
    model = argv[argv.index("serve") + 1]  # `vllm serve MODEL` (no CPU build named here)
    assert model.startswith(str(tmp_path / "cache" / "served" / "converted-"))
    assert json.loads((tmp_path / "cache" / "served" / model.rsplit("/", 1)[1] / "config.json").read_text())[
        "architectures"
    ] == ["LlamaForCausalLM"]
    assert (target / "config.json").read_bytes() == before  # the target is untouched
    assert main(args) == 0  # the same copy again, not a second one
    assert len(list((tmp_path / "cache" / "served").iterdir())) == 1
    assert main(serve_args(tiny_target_dir, head, *chain)) == 0
    assert str(tiny_target_dir) in capsys.readouterr().out  # a target naming its class is served as is
