"""Issue 61: one check for every head. eval, export and serve answer every question about a head
folder through `head.check.problems(head, target, engine)`, so they agree. The three cases that
disagreed on main, each on the committed tiny target with a head from `tests/head_fixtures.py` and
one field edited."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import err, wide_console  # noqa: F401
from head_fixtures import make_head
from serve_helpers import CHAIN, edit_config, serve_args

from eagle3cli.cli import main


@pytest.fixture(scope="module")
def tiny_head(trained_target_dir, tmp_path_factory) -> Path:
    return make_head(trained_target_dir, tmp_path_factory.mktemp("one-check") / "head")


@pytest.fixture
def head(tiny_head, tmp_path) -> Path:
    import shutil

    return Path(shutil.copytree(tiny_head, tmp_path / "head"))


def _eval(target: Path, head: Path, out: Path) -> int:
    return main(
        ["eval", "--target", str(target), "--head", str(head), "--out", str(out), "--num-prompts", "1",
         "--max-new-tokens", "4", "--depth", "2"]
    )  # fmt: skip


def _serve(target: Path, head: Path, engine: str) -> int:
    return main(serve_args(target, head, "--engine", engine, *CHAIN, "--dry-run"))


def test_a_head_for_another_vocabulary_is_refused_by_serve_as_by_eval(head, trained_target_dir, tmp_path, capsys):
    # was: eval exit 2 ("trained with another vocabulary"), serve --engine sglang --dry-run exit 0
    cfg = json.loads((head / "config.json").read_text())
    cfg["eagle3"]["target"]["vocab_hash"] = "0" * 64
    edit_config(head, eagle3=cfg["eagle3"])
    assert _eval(trained_target_dir, head, tmp_path / "eval") == 2
    assert "another vocabulary" in err(capsys)
    for engine in ("sglang", "vllm"):
        assert _serve(trained_target_dir, head, engine) == 2, engine
        assert "another vocabulary" in err(capsys)


def test_norm_output_is_refused_by_an_sglang_export_or_written_as_sglang_serves_it(
    head, trained_target_dir, tmp_path, capsys
):
    # was: export --format sglang wrote a head that serve --engine sglang refused
    edit_config(head, norm_output=True)
    out = tmp_path / "sglang"
    rc = main(["export", "--head", str(head), "--format", "sglang", "--out", str(out)])
    if rc == 2:
        assert "norm_output" in err(capsys)
        assert not (out / "model.safetensors").exists()
    else:
        assert rc == 0 and _serve(trained_target_dir, out, "sglang") == 0, err(capsys)


def test_a_short_max_position_embeddings_gets_one_answer_from_eval_export_and_serve(
    head, trained_target_dir, tmp_path, capsys
):
    # was: eval accepted it, export --format vllm wrote it, serve --engine vllm refused the export
    edit_config(head, max_position_embeddings=64)  # the target's is 2048
    eval_rc = _eval(trained_target_dir, head, tmp_path / "eval")
    serve_rc = _serve(trained_target_dir, head, "vllm")
    assert eval_rc == serve_rc == 2, (eval_rc, serve_rc)
    assert "max_position_embeddings" in err(capsys)
    out = tmp_path / "vllm"
    rc = main(["export", "--head", str(head), "--format", "vllm", "--out", str(out)])
    assert rc == 2 or _serve(trained_target_dir, out, "vllm") == 0
    assert not (out / "model.safetensors").exists() or rc == 0
