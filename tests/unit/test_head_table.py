"""The head table (`eagle3cli/head/table.py`) is what the code does: every row walked through the
writer (train's RUN/head), export's layouts, the reader, the GGUF tensor names and the engines'
checks. A field added to a head is one row there; a row the code does not honour fails here."""

from __future__ import annotations

import json

import pytest
import torch
from head_fixtures import make_head

from eagle3cli.engines.gguf_export import expected_head_tensors
from eagle3cli.head.check import problems
from eagle3cli.head.read import draft_config, load_any_head, read_head
from eagle3cli.head.table import (
    ENGINES,
    FIELDS,
    GGUF_TENSOR_NAMES,
    HEAD_KEYS,
    TENSORS,
    get_path,
    head_tensor_names,
)
from eagle3cli.head.write import head_state_dict

FLAGS = {"norm_before_fc": True, "norm_before_residual": True}


@pytest.fixture(scope="module")
def layouts(deep_target_dir, tmp_path_factory):
    """An EAGLE-3.1 head (both norms, so every row has a value) and its exports in every layout."""
    from eagle3cli.export.run import export_head

    root = tmp_path_factory.mktemp("table")
    head = make_head(deep_target_dir, root / "eagle3", aux=[1, 3, 6], **FLAGS)
    out = {"eagle3": head}
    for fmt in ("vllm", "speculators"):
        out[fmt] = export_head(head, fmt, root / fmt)
    return out


def cfg(path):
    return json.loads((path / "config.json").read_text())


def test_every_row_is_written_where_the_table_says(layouts):
    written = {"eagle3": cfg(layouts["eagle3"]), "speculators": cfg(layouts["speculators"])}
    for f in FIELDS:
        for layout, where in (("eagle3", f.eagle3), ("speculators", f.speculators)):
            value = get_path(written[layout], where) if where else get_path(written[layout], f.name)
            assert (value is not None) == (where is not None), (f.name, layout, where, value)
    layer = written["speculators"]["transformer_layer_config"]
    # a head field leaked into the Llama layer config? (the layer names its own class)
    assert set(HEAD_KEYS) & set(layer) == {"architectures"} and layer["architectures"] == ["LlamaForCausalLM"]
    assert {f.name for f in FIELDS if f.kind == "layer"} <= set(layer)


def test_every_row_is_read_back_by_the_one_reader(layouts):
    for layout, path in layouts.items():
        spec = read_head(path, 8)
        assert spec.aux_layer_ids == (1, 3, 6), layout
        assert (spec.norm_before_fc, spec.norm_before_residual) == (True, True), layout
        assert spec.draft_vocab_size == 512 and spec.target_hidden_size == 64, layout
        llama = draft_config(spec).to_dict()
        own = ("architectures", "draft_vocab_size", "target_hidden_size", *FLAGS)  # draft_config sets these itself
        assert not {k for k in HEAD_KEYS if k in llama and k not in own}, layout
        assert spec.notices == (), (layout, spec.notices)


def test_engine_columns_are_the_places_the_engines_read(layouts):
    """Each engine's column, read from our export, gives the value eagle3 wrote; a field an engine
    does not read (None) and that changes the draft makes that engine's check refuse the head."""
    written = cfg(layouts["eagle3"])
    for f in FIELDS:
        for column in (f.sglang, f.vllm):
            if column and f.eagle3 and f.kind != "meta":
                first = next((get_path(written, p) for p in column if get_path(written, p) is not None), None)
                assert first is not None, (f.name, column)
    unread_by_sglang = [f.name for f in FIELDS if f.sglang is None and f.name in FLAGS]
    assert unread_by_sglang == ["norm_before_residual"]


def test_tensor_rows_are_the_heads_tensors_and_llama_cpps_names(layouts):
    draft, spec = load_any_head(layouts["eagle3"], None, torch.float32)
    assert set(head_state_dict(draft)) == set(head_tensor_names(True))
    assert set(head_tensor_names(False)) == {t.name for t in TENSORS if t.present == "always"}
    assert set(spec.names) == set(head_tensor_names(True))
    gguf = set(expected_head_tensors(draft))
    assert gguf == {GGUF_TENSOR_NAMES[n] for n in head_tensor_names(True) if n in GGUF_TENSOR_NAMES}
    speculators = read_head(layouts["speculators"], 8)
    assert all(
        v.startswith(("layers.0.", "fc", "norm", "lm_head", "d2t", "t2d", "input_norm"))
        for v in speculators.names.values()
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_the_engines_checks_know_every_row(layouts, deep_target_dir, engine):
    """The flagged head: refused only by SGLang (which reads neither norm flag, or only
    norm_before_fc from 0.5.23 on), for exactly those rows."""
    found = problems(layouts["eagle3"], deep_target_dir, engine)
    errors = [p.what for p in found if p.is_error]
    if engine == "sglang":
        assert errors and all("EAGLE-3.1 head" in e for e in errors), errors
    else:
        assert errors == [], errors
