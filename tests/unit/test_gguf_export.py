"""`eagle3 export --format gguf`: refusals before anything is converted, and the read-back check of
what llama.cpp's converter wrote (names, shapes, values, d2t as absolute target ids, aux ids, tokenizer).

The conversions run llama.cpp's own converter (pure Python, from the source `make llama-cpp` unpacks):
those tests skip, saying so, where that source is absent."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from cli_helpers import err, wide_console  # noqa: F401 — autouse fixture
from head_fixtures import make_head
from safetensors.torch import load_file, save_file

from eagle3cli.cli import main
from eagle3cli.engines.gguf_export import (
    HEAD_GGUF,
    TARGET_GGUF,
    check_head_gguf,
    llama_cpp_source,
    pre_tokenizer_name,
    read_gguf,
)
from eagle3cli.head.read import load_head_weights, read_head

needs_converter = pytest.mark.skipif(
    llama_cpp_source() is None,
    reason="llama.cpp's converter is not here (.llama-cpp/src): run `make llama-cpp`",
)


@pytest.fixture(scope="module")
def head(deep_target_dir, tmp_path_factory) -> Path:
    """A random head for the 8-layer target (aux layers [2, 4, 5]), d2t = target ids 2*i."""
    return make_head(deep_target_dir, tmp_path_factory.mktemp("gguf") / "head")


@pytest.fixture(scope="module")
def exported(head, deep_target_dir, tmp_path_factory) -> Path:
    if llama_cpp_source() is None:
        pytest.skip("llama.cpp's converter is not here (.llama-cpp/src): run `make llama-cpp`")
    out = tmp_path_factory.mktemp("gguf-out") / "gguf"
    # --out relative to the working directory, as users write it (`--out runs/demo/gguf`): the
    # converter runs elsewhere (the temp dir), so the path it is handed must not be relative
    cwd = os.getcwd()
    os.chdir(out.parent)
    try:
        argv = ["export", "--head", str(head), "--format", "gguf", "--target", str(deep_target_dir)]
        assert main([*argv, "--out", "gguf"]) == 0
    finally:
        os.chdir(cwd)
    return out


def _edit_head(src: Path, dst: Path, edit) -> Path:
    import shutil

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"), {"format": "pt"})
    return dst


def _export(head: Path, target: Path, out: Path, capsys) -> tuple[int, str]:
    code = main(["export", "--head", str(head), "--format", "gguf", "--target", str(target), "--out", str(out)])
    return code, err(capsys)


# ---------------------------------------------------------------- refused before converting
def test_duplicate_d2t_is_refused_and_nothing_written(head, deep_target_dir, tmp_path, capsys):
    def dup(t):
        t["d2t"][1] = t["d2t"][0] - 1  # draft id 1 lands on draft id 0's target id

    bad = _edit_head(head, tmp_path / "bad", dup)
    code, text = _export(bad, deep_target_dir, tmp_path / "out", capsys)
    assert code == 2, text
    assert "d2t maps 1 draft id(s) to the same target id as another draft id" in text
    assert not (tmp_path / "out" / HEAD_GGUF).exists()


def test_d2t_outside_the_vocab_is_refused(head, deep_target_dir, tmp_path, capsys):
    def far(t):
        t["d2t"][-1] = 10**6

    code, text = _export(_edit_head(head, tmp_path / "bad", far), deep_target_dir, tmp_path / "out", capsys)
    assert code == 2 and "outside" in text, text
    assert not (tmp_path / "out" / HEAD_GGUF).exists()


def test_missing_tensor_is_refused(head, deep_target_dir, tmp_path, capsys):
    code, text = _export(
        _edit_head(head, tmp_path / "bad", lambda t: t.pop("midlayer.mlp.up_proj.weight")),
        deep_target_dir,
        tmp_path / "out",
        capsys,
    )
    assert code == 2 and "midlayer.mlp.up_proj.weight" in text, text
    assert not (tmp_path / "out" / HEAD_GGUF).exists()


def test_two_aux_layers_are_refused(deep_target_dir, tmp_path, capsys):
    two = make_head(deep_target_dir, tmp_path / "two", aux=[2, 5])
    code, text = _export(two, deep_target_dir, tmp_path / "out", capsys)
    assert code == 2 and "reads exactly 3" in text, text


def test_head_of_another_target_is_refused(head, tiny_target_dir, tmp_path, capsys):
    # the 4-layer target lacks layer 5, which the head reads
    code, text = _export(head, tiny_target_dir, tmp_path / "out", capsys)
    assert code == 2 and "[2, 4, 5]" in text, text


def test_map_problems_reads_t2d_against_d2t():
    from eagle3cli.speculate.vocab import map_problems

    d2t = torch.tensor([0, 1, 1])  # target ids 0, 2, 3
    t2d = torch.zeros(8, dtype=torch.bool)
    t2d[[0, 2, 4]] = True
    assert any("t2d disagrees" in p for p in map_problems(d2t, t2d, 8))
    t2d[[4, 3]] = torch.tensor([False, True])
    assert map_problems(d2t, t2d, 8) == []


def test_pre_tokenizer_named_by_regex(tmp_path, trained_target_dir):
    assert pre_tokenizer_name(trained_target_dir) == "gpt-2"  # ByteLevel(use_regex) = GPT-2's regex
    tok = json.loads((trained_target_dir / "tokenizer.json").read_text())
    tok["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(tok))
    assert pre_tokenizer_name(tmp_path) is None  # no llama.cpp pre-tokenizer is guessed
    tok["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        ],
    }
    (tmp_path / "tokenizer.json").write_text(json.dumps(tok))
    assert pre_tokenizer_name(tmp_path) == "smollm"


# ---------------------------------------------------------------- converted and read back
@pytest.mark.slow  # the `exported` fixture runs llama.cpp's converter: ~10 s
@needs_converter
def test_export_writes_checked_gguf_files(exported, head, deep_target_dir):
    manifest = json.loads((exported / "manifest.json").read_text())
    assert manifest["stage"] == "export" and manifest["format"] == "gguf"
    assert {s["file"] for s in manifest["shards"]} == {HEAD_GGUF, TARGET_GGUF}
    assert all(len(s["sha256"]) == 64 for s in manifest["shards"])
    assert manifest["target"]["fingerprint"] and manifest["target"]["num_hidden_layers"] == 8
    g = read_gguf(exported / HEAD_GGUF)
    assert g.arch == "eagle3"
    assert [int(x) for x in g.get("{arch}.target_layers")] == [2, 4, 5]
    assert g.types["d2t"] == "I64"
    assert g.tensors["d2t"].tolist() == [2 * i for i in range(512)]  # absolute: i + d2t[i] = i + i
    assert "token_embd.weight" not in g.shapes  # the target's embeddings are used
    assert g.fields["tokenizer.ggml.pre"] == "gpt-2"
    t = read_gguf(exported / TARGET_GGUF, tensors=False)
    assert t.arch == "llama" and t.get("{arch}.block_count") == 8
    assert t.fields["tokenizer.ggml.tokens"] == g.fields["tokenizer.ggml.tokens"]


@pytest.mark.slow  # the `exported` fixture runs llama.cpp's converter: ~10 s
@needs_converter
def test_read_back_finds_every_kind_of_difference(exported, head):
    spec = read_head(head, 8)
    draft = load_head_weights(spec, None, torch.float32)
    g = read_gguf(exported / HEAD_GGUF)
    assert check_head_gguf(g, draft, spec.aux_layer_ids, 8, 4096) == []

    g = read_gguf(exported / HEAD_GGUF)
    del g.shapes["blk.0.ffn_up.weight"]
    assert any("blk.0.ffn_up.weight is missing" in p for p in check_head_gguf(g, draft, (2, 4, 5), 8, 4096))

    g = read_gguf(exported / HEAD_GGUF)
    g.tensors["d2t"] = g.tensors["d2t"] - range(512)  # relative offsets, as safetensors stores them
    assert any("d2t differs" in p for p in check_head_gguf(g, draft, (2, 4, 5), 8, 4096))

    g = read_gguf(exported / HEAD_GGUF)
    g.tensors["blk.0.attn_q.weight"] = g.tensors["blk.0.attn_q.weight"] * 0 + 1
    assert any("attn_q.weight differs" in p for p in check_head_gguf(g, draft, (2, 4, 5), 8, 4096))

    g = read_gguf(exported / HEAD_GGUF)
    g.shapes["token_embd.weight"] = (4096, 64)
    assert any("token_embd" in p for p in check_head_gguf(g, draft, (2, 4, 5), 8, 4096))

    g = read_gguf(exported / HEAD_GGUF)
    assert any("target_layers" in p for p in check_head_gguf(g, draft, (2, 4, 6), 8, 4096))


@pytest.mark.slow  # the `exported` fixture runs llama.cpp's converter: ~10 s
@needs_converter
def test_other_settings_into_the_same_folder_are_refused(exported, head, deep_target_dir, capsys):
    args = ["export", "--head", str(head), "--format", "gguf", "--target", str(deep_target_dir), "--out", str(exported)]
    code = main([*args, "--dtype", "bf16"])
    text = err(capsys)
    assert code == 2 and "other settings" in text, text


# ---------------------------------------------------------------- serve --engine llama.cpp (preflight, dry run)
@pytest.mark.slow  # the `exported` fixture runs llama.cpp's converter: ~10 s
@needs_converter
def test_serve_dry_run_prints_the_llama_server_command(exported, deep_target_dir, capsys):
    args = ["serve", "--engine", "llama.cpp", "--target", str(deep_target_dir), "--head", str(exported)]
    assert main([*args, "--steps", "5", "--dry-run"]) == 0
    text = err(capsys)
    assert f"-m {exported / TARGET_GGUF}" in text and f"-md {exported / HEAD_GGUF}" in text
    assert "--spec-type draft-eagle3" in text and "--spec-draft-n-max 5" in text and "--metrics" in text


@pytest.mark.slow  # the `exported` fixture runs llama.cpp's converter: ~10 s
@needs_converter
def test_serve_takes_k_from_the_eval_report(exported, deep_target_dir, tmp_path, capsys):
    (tmp_path / "report.json").write_text(json.dumps({"recommended": {"steps": 4, "topk": 1, "num_draft_tokens": 5}}))
    args = ["serve", "--engine", "llama.cpp", "--target", str(deep_target_dir), "--head", str(exported)]
    assert main([*args, "--from-eval", str(tmp_path), "--dry-run"]) == 0
    assert "--spec-draft-n-max 4" in err(capsys)


@pytest.mark.slow  # the `exported` fixture runs llama.cpp's converter: ~10 s
@needs_converter
def test_serve_refuses_a_tree_and_flags_it_owns(exported, deep_target_dir, capsys):
    args = ["serve", "--engine", "llama.cpp", "--target", str(deep_target_dir), "--head", str(exported), "--dry-run"]
    assert main([*args, "--steps", "3", "--topk", "2", "--draft-tokens", "6"]) == 2
    assert "drafts a chain" in err(capsys)
    assert main([*args, "--", "-md", "other.gguf"]) == 2
    assert "-md" in err(capsys)


@pytest.mark.slow  # the `exported` fixture runs llama.cpp's converter: ~10 s
@needs_converter
def test_pair_preflight_finds_what_llama_cpp_refuses(exported):
    from eagle3cli.serve.llama_cpp import check_pair

    head = read_gguf(exported / HEAD_GGUF, tensors={"d2t"})
    target = read_gguf(exported / TARGET_GGUF, tensors=False)
    assert [p for p in check_pair(head, target) if p.is_error] == []
    target.fields["llama.block_count"] = 4  # a shallower target: layer 5 is not there (llama.cpp aborts)
    assert any("[4, 5]" in p.what and p.is_error for p in check_pair(head, target))  # 4 = the output: refused too
    target = read_gguf(exported / TARGET_GGUF, tensors=False)
    target.fields["tokenizer.ggml.tokens"] = list(reversed(target.fields["tokenizer.ggml.tokens"]))
    assert any("tokenizer.ggml.tokens differs" in p.what for p in check_pair(head, target))
    target = read_gguf(exported / TARGET_GGUF, tensors=False)
    target.fields["llama.embedding_length"] = 96
    assert any("96" in p.what for p in check_pair(head, target))


def test_a_converter_without_its_imports_names_the_gguf_extra(monkeypatch, tmp_path):
    """The converter runs in a child process, so what it imports is checked here first (by
    `extras.require_all`, the one home of "an extra is missing"): exit 2 naming the package and the extra."""
    import eagle3cli.engines.gguf_export as ge
    from eagle3cli import extras
    from eagle3cli.errors import UsageError

    monkeypatch.setattr(ge, "llama_cpp_source", lambda: tmp_path)
    present = extras.available
    monkeypatch.setattr(extras, "available", lambda m: m != "sentencepiece" and present(m))
    with pytest.raises(UsageError) as e:
        ge.converter_source()
    assert e.value.what == "llama.cpp's converter imports sentencepiece, which this environment lacks"
    assert "pip install 'eagle3cli[gguf]'" in (e.value.next_step or "") and "pip install sentencepiece" in (
        e.value.next_step or ""
    )
    monkeypatch.setattr(extras, "available", present)
    if all(present(m) for m in ("sentencepiece", "numpy", "transformers")):
        assert ge.converter_source() == tmp_path
