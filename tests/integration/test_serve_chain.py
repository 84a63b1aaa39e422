"""Serve on the real pieces: a head exported for the committed target passes preflight and its
dry-run command parses under SGLang; the bench client measures a real model server
(eagle3cli.data.http_server: /generate + /v1/chat/completions backed by a transformers model)."""

from __future__ import annotations

import json

import pytest
import serve_helpers as pf
from serve_helpers import assert_sglang_parses, export_head, printed_command, serve_args

from eagle3cli.cli import main

pytestmark = pytest.mark.integration


def test_head_for_trained_target_passes_and_parses(trained_target_dir, tmp_path, capsys):
    head = export_head(tmp_path / "head", trained_target_dir, draft_vocab=1024)
    assert pf.check_head(head, trained_target_dir, "sglang") == []
    assert pf.check_head(head, trained_target_dir, "vllm") == []
    code = main(serve_args(trained_target_dir, head, "--dry-run", "--steps", "6", "--topk", "1", "--draft-tokens", "7"))
    cap = capsys.readouterr()
    assert code == 0, cap.err
    assert_sglang_parses(printed_command(cap.out))


def test_head_exported_by_eagle3_train_passes_and_parses(tiny_target_dir, tmp_path, capsys):
    """The issue's "done when": `eagle3 train` exports a head; preflight passes; the dry run parses."""
    from train_fixtures import make_run

    run = make_run(tmp_path / "run", tiny_target_dir, n=8)
    code = main(
        [
            "train",
            "--run",
            str(run),
            "--max-steps",
            "2",
            "--token-budget",
            "640",
            "--max-length",
            "160",
            "--ttt-steps",
            "2",
        ]
    )
    assert code == 0, capsys.readouterr().err
    head = run / "head"
    for engine in ("sglang", "vllm"):
        assert pf.check_head(head, tiny_target_dir, engine) == [], engine
    capsys.readouterr()
    code = main(serve_args(tiny_target_dir, head, "--dry-run"))
    cap = capsys.readouterr()
    assert code == 0, cap.err
    assert_sglang_parses(printed_command(cap.out))


@pytest.fixture(scope="module")
def model_server(tiny_target_dir):
    from eagle3cli.data.http_server import ModelServer
    from eagle3cli.model.target import load_target

    model, tok, _ = load_target(tiny_target_dir)
    server = ModelServer(model, tok, served_model_name="tiny", max_new_tokens=16)
    server.start()
    yield server
    server.stop()


@pytest.mark.parametrize("api", ["generate", "openai"])
def test_bench_against_model_server(model_server, tiny_target_dir, tmp_path, api, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["Hello", "What is 2+2?", "Name a colour."]))
    code = main(
        [
            "serve-bench",
            "--spec-url",
            model_server.url,
            "--base-url",
            model_server.url,
            "--api",
            api,
            "--concurrency",
            "1,2",
            "--requests",
            "2",
            "--max-tokens",
            "6",
            "--prompts",
            str(prompts),
            "--out",
            str(tmp_path / "bench"),
            "--target",  # /generate gets the chat-templated token ids, as eval sends them
            str(tiny_target_dir),
        ]
    )
    cap = capsys.readouterr()
    assert code == 0, cap.err
    report = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert len(report["levels"]) == 4 and set(report["speedup"]) == {"1", "2"}
    for r in report["levels"]:
        assert r["failed"] == 0 and r["requests"] >= 2
        assert 0 < r["output_tokens"] <= 6 * r["requests"]
        assert r["accept_length"] is None  # a plain server: no speculation fields, and none invented
    assert (tmp_path / "bench" / "bench.png").exists()
