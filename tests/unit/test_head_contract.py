"""The head contract in one home (`eagle3cli/head/`): eval (the reader), export and serve (the one
check) agree on every head, for the four cases they used to disagree on: aux id 0, aux ids out of
layer order, maps that are not valid (two draft ids on one target id, a float d2t, a t2d that
disagrees), and, with the target, `architectures` null for SGLang as for vLLM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_helpers import err, wide_console  # noqa: F401
from safetensors.torch import load_file
from serve_helpers import edit_config, edit_tensors, export_head

from eagle3cli.cli import main
from eagle3cli.errors import UsageError
from eagle3cli.head.check import problems
from eagle3cli.head.read import read_head
from eagle3cli.run_folder.manifest import model_fingerprint, same_fingerprint


@pytest.fixture(scope="module")
def good_head(deep_target_dir, tmp_path_factory):
    return export_head(tmp_path_factory.mktemp("contract") / "head", deep_target_dir, aux=(1, 3, 6))


@pytest.fixture
def head(good_head, tmp_path):
    import shutil

    return Path(shutil.copytree(good_head, tmp_path / "head"))


def refused_everywhere(head: Path, target: Path, needle: str, tmp_path: Path, capsys) -> None:
    """eval's reader, export (exit 2, nothing written) and serve's check (both engines) refuse `head`,
    each naming `needle`."""
    with pytest.raises(UsageError) as e:
        read_head(head, 8)
    assert needle in " ".join(e.value.what.split()), e.value.what
    out = tmp_path / "out"
    assert main(["export", "--head", str(head), "--format", "vllm", "--out", str(out)]) == 2
    assert needle in err(capsys)
    assert not (out / "model.safetensors").exists()
    for engine in ("sglang", "vllm"):
        errors = [" ".join(p.what.split()) for p in problems(head, target, engine) if p.is_error]
        assert any(needle in e for e in errors), (engine, errors)


def as_vllm_layout(head: Path, ids: list[int]) -> None:
    """The head as another tool writes it for vLLM: top-level ids only, no eagle3 block."""
    cfg = json.loads((head / "config.json").read_text())
    for key in ("eagle3", "eagle_config"):
        cfg.pop(key)
    cfg["eagle_aux_hidden_state_layer_ids"] = ids
    (head / "config.json").write_text(json.dumps(cfg))


# ---------------------------------------------------------------- aux id 0
def test_aux_id_0_is_refused_by_eval_export_and_serve(head, deep_target_dir, tmp_path, capsys):
    # was: eval ran it, serve warned (recommending SGLang id -1), export refused
    as_vllm_layout(head, [0, 3, 6])
    refused_everywhere(head, deep_target_dir, "hidden_states[0] is the embedding output", tmp_path, capsys)


# ---------------------------------------------------------------- aux id order
def test_cache_refuses_aux_layers_out_of_layer_order_before_anything(tmp_path, capsys):
    out = tmp_path / "cache"
    assert main(["cache", "--data", str(tmp_path / "no-data"), "--out", str(out), "--aux-layers", "6,1,3"]) == 2
    text = err(capsys)
    assert "not in layer order" in text and "use 1,3,6" in text
    assert main(["train", "--run", str(tmp_path / "run"), "--aux-layers", "6,1,3"]) == 2
    assert "not in layer order" in err(capsys)


def test_a_foreign_heads_unsorted_engine_ids_are_read_as_the_engine_feeds_them(head, deep_target_dir):
    # vLLM captures in layer order whatever the list says: eval and serve both read [6, 1, 3] as [1, 3, 6]
    as_vllm_layout(head, [6, 1, 3])
    assert read_head(head, 8).aux_layer_ids == (1, 3, 6)
    assert [p.what for p in problems(head, deep_target_dir, "vllm") if p.is_error] == []


def test_eagle3_ids_out_of_layer_order_are_refused_by_eval_export_and_serve(head, deep_target_dir, tmp_path, capsys):
    # every field written consistently in the listed order: the engines would still feed [1, 3, 6]
    edit_config(
        head,
        eagle3={**json.loads((head / "config.json").read_text())["eagle3"], "aux_layer_ids": [6, 1, 3]},
        eagle_aux_hidden_state_layer_ids=[6, 1, 3],
        eagle_config={"eagle_aux_hidden_state_layer_ids": [5, 0, 2], "use_aux_hidden_state": True},
    )
    refused_everywhere(head, deep_target_dir, "not in layer order", tmp_path, capsys)


# ---------------------------------------------------------------- d2t / t2d
def _d2t(head: Path) -> torch.Tensor:
    return load_file(str(head / "model.safetensors"))["d2t"]


@pytest.mark.parametrize(
    "case, needle",
    [
        ("two-on-one", "to the same target id as another draft id"),
        ("float", "must be a 1-D integer tensor"),
        ("t2d", "t2d disagrees with d2t"),
    ],
)
def test_an_invalid_map_is_refused_by_eval_export_and_serve(case, needle, head, deep_target_dir, tmp_path, capsys):
    d2t = _d2t(head)
    if case == "two-on-one":
        d2t[1] = d2t[0] - 1  # draft id 1 lands on draft id 0's target id
        edit_tensors(head, replace={"d2t": d2t})
    elif case == "float":
        edit_tensors(head, replace={"d2t": d2t.to(torch.float32)})  # eval used to truncate it and go on
    else:
        t2d = load_file(str(head / "model.safetensors"))["t2d"].clone()
        t2d[t2d.nonzero()[0]] = False  # one target id of the draft vocab unmarked
        t2d[(~t2d).nonzero()[-1]] = True
        edit_tensors(head, replace={"t2d": t2d})
    refused_everywhere(head, deep_target_dir, needle, tmp_path, capsys)


# ---------------------------------------------------------------- the target's architectures
def test_a_target_naming_no_architectures_is_refused_for_sglang_as_for_vllm(good_head, deep_target_dir, tmp_path):
    import shutil

    target = Path(shutil.copytree(deep_target_dir, tmp_path / "target"))
    cfg = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**cfg, "architectures": None}))
    for engine in ("sglang", "vllm"):
        errors = [p.what for p in problems(good_head, target, engine) if p.is_error]
        assert any("names no architectures" in e for e in errors), (engine, errors)


def test_naming_the_architecture_keeps_the_targets_identity(deep_target_dir, tmp_path):
    """`make smollm2` now writes the class its GGUF-born config lacked; the corpora and heads recorded
    against the unnamed config still match it."""
    import shutil

    from eagle3cli.engines.gguf import name_architecture

    target = Path(shutil.copytree(deep_target_dir, tmp_path / "target"))
    cfg = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**cfg, "architectures": None}))
    recorded = model_fingerprint(target)
    name_architecture(target)
    assert json.loads((target / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    now = model_fingerprint(target)
    assert now != recorded and same_fingerprint(recorded, now)
    (target / "config.json").write_text(json.dumps({**cfg, "architectures": None, "hidden_act": "gelu"}))
    assert not same_fingerprint(model_fingerprint(target), now)  # another config is still another target
