"""One rule decides which aux layer ids a head may be trained on and served with
(`speculate.aux_layers.aux_layer_problems`): cache, train, export, eval and serve all refuse id 0 and
ids out of layer order with the same words, and cache refuses them before the target is opened or a
feature computed."""

from __future__ import annotations

import json

import pytest
from transformers import LlamaConfig

from eagle3cli.cli import main
from eagle3cli.errors import UsageError
from eagle3cli.head.check import problems
from eagle3cli.head.write import head_config
from eagle3cli.speculate.aux_layers import (
    aux_layer_problems,
    default_aux_layer_ids,
    from_sglang_ids,
    sglang_ids,
    vllm_ids,
)
from eagle3cli.speculate.draft import Eagle3Draft, draft_config_from_target

IDS = [0, 2, 3]


def words(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines


def test_the_rule_and_the_engines_conventions():
    assert aux_layer_problems(default_aux_layer_ids(8), 8) == []
    assert aux_layer_problems([1, 7], 8) == [] and aux_layer_problems([1, 2, 2], 4) == []  # repeats are legal
    assert default_aux_layer_ids(4) == (1, 2, 2)  # [2, L//2, L-3] in the layer order the engines capture
    (order,) = aux_layer_problems([9, 2, 6], 12)
    assert "not in layer order" in order and "fed [2, 6, 9]" in order and "use 2,6,9" in order
    low, high = aux_layer_problems([0, 8], 8)
    assert "[0]" in low and "embedding output" in low and "[8]" in high and "1..7" in high
    assert aux_layer_problems([0, 99]) == [low.replace("[0, 8]", "[0, 99]")]  # no target: the lower bound only
    assert sglang_ids([2, 4, 5]) == [1, 3, 4] and from_sglang_ids(sglang_ids([2, 4, 5])) == [2, 4, 5]
    assert vllm_ids([2, 4, 5]) == [2, 4, 5]


def test_id_0_is_refused_with_the_same_words_by_cache_train_export_and_serve(tmp_path, capsys, deep_target_dir):
    message = words(aux_layer_problems(IDS)[0])

    # cache: at once, from the flag (the data folder does not even exist; no target is opened)
    out = tmp_path / "cache"
    assert main(["cache", "--data", str(tmp_path / "no-data"), "--out", str(out), "--aux-layers", "0,2,3"]) == 2
    assert message in words(capsys.readouterr().err)
    assert not out.exists() or not any(out.iterdir())

    # train: at once, from the flag
    assert main(["train", "--run", str(tmp_path / "run"), "--aux-layers", "0,2,3"]) == 2
    assert message in words(capsys.readouterr().err)

    # export: a head whose config names id 0
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=8, num_attention_heads=2)
    draft = Eagle3Draft(draft_config_from_target(cfg, 32, tuple(IDS)))
    with pytest.raises(UsageError) as e:
        head_config(draft)
    assert message in words(e.value.what)

    # serve and eval (the one head check): a head trained on id 0
    from serve_helpers import export_head

    head = export_head(tmp_path / "head", deep_target_dir, aux=(1, 2, 3))
    cfg = json.loads((head / "config.json").read_text())
    cfg["eagle3"]["aux_layer_ids"] = IDS
    (head / "config.json").write_text(json.dumps(cfg))
    for engine in ("eagle3", "sglang", "vllm"):
        assert any(p.is_error and message in words(p.what) for p in problems(head, deep_target_dir, engine)), engine
