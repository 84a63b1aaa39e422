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
    sglang_id_problems,
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


# ---------------------------------------------------------------- SGLang's rule per target class
# What SGLang 0.5.23's `set_eagle3_layers_to_capture` captures for the ids [1, 5, 8] and [2, 6, 9]: Llama,
# Qwen2 and Qwen3 add 1 always (llama.py, qwen2.py, qwen3.py); the DeepSeek-V2 family (deepseek_v2.py,
# glm4_moe_lite.py) adds 1 only when the first id is 1.
FAMILIES = {
    "LlamaForCausalLM": ([2, 6, 9], [3, 7, 10]),
    "Qwen2ForCausalLM": ([2, 6, 9], [3, 7, 10]),
    "Qwen3ForCausalLM": ([2, 6, 9], [3, 7, 10]),
    "DeepseekV2ForCausalLM": ([2, 6, 9], [2, 6, 9]),
    "DeepseekV3ForCausalLM": ([2, 6, 9], [2, 6, 9]),
    "Glm4MoeLiteForCausalLM": ([2, 6, 9], [2, 6, 9]),
}


@pytest.mark.parametrize("arch", sorted(FAMILIES))
def test_sglang_captures_by_the_targets_class(arch):
    from eagle3cli.head.engines import sglang_first_id_rule

    rule = sglang_first_id_rule([arch])
    assert rule == arch.startswith(("Deepseek", "Glm4MoeLite"))
    from_one, from_two = FAMILIES[arch]
    assert from_sglang_ids([1, 5, 8], rule) == from_one  # a first id of 1: +1 everywhere
    assert from_sglang_ids([2, 6, 9], rule) == from_two
    for ids in ([2, 6, 9], [3, 6, 9], [2, 15, 27]):  # written for the class, read back as trained
        assert from_sglang_ids(sglang_ids(ids, rule), rule) == ids
    # hidden_states[1] cannot be written for the DeepSeek family: no ids (the field is written null), and the rule says so
    assert (sglang_ids([1, 6, 9], rule) is None) == rule == bool(sglang_id_problems([1, 6, 9], rule))


def test_the_first_id_rule_table_is_sglangs_source():
    """Every class whose SGLang `set_eagle3_layers_to_capture` (its own or a base's) holds
    `layer_ids[0] == 1` is in the table (read from the installed SGLang; skipped without one)."""
    import ast

    from eagle3cli.head.engines import SGLANG_FIRST_ID_RULE, _installed_sglang_models, sglang_eagle3_architectures

    found = _installed_sglang_models()
    if found is None:
        pytest.skip("sglang is not installed here (make sglang-cpu)")
    classes: dict[str, tuple[list[str], bool | None]] = {}
    for f in sorted(found[1].glob("*.py")):
        for node in ast.parse(f.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                meth = next((n for n in node.body if getattr(n, "name", "") == "set_eagle3_layers_to_capture"), None)
                rule = None if meth is None else "layer_ids[0] == 1" in ast.unparse(meth)
                classes[node.name] = ([getattr(b, "id", "") for b in node.bases], rule)

    def rule(name: str, seen: tuple = ()) -> bool | None:
        bases, own = classes.get(name, ([], None))
        if own is not None:
            return own
        return next((r for b in bases if b not in seen and (r := rule(b, (*seen, name))) is not None), None)

    derived = {a for a in sglang_eagle3_architectures(found[1]) if rule(a)}
    # Kimi K2.5 hands the ids to its DeepSeek-V3 language model (a delegation this reading does not follow)
    assert derived == SGLANG_FIRST_ID_RULE - {"KimiK25ForConditionalGeneration"}


def test_a_head_for_a_deepseek_target_is_written_and_read_in_its_convention(tmp_path):
    from eagle3cli.head.write import save_head

    tcfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                       num_hidden_layers=12, vocab_size=512).to_dict()  # fmt: skip
    for aux, arch in (((3, 6, 9), "DeepseekV3ForCausalLM"), ((3, 6, 9), "LlamaForCausalLM")):
        head = save_head(
            Eagle3Draft(draft_config_from_target(tcfg, 512, aux)),
            tmp_path / arch,
            {"num_hidden_layers": 12},
            {"target_architectures": [arch]},
        )
        cfg = json.loads((head / "config.json").read_text())
        deepseek = arch.startswith("Deepseek")
        assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ([3, 6, 9] if deepseek else [2, 5, 8])
        for engine in ("sglang", "vllm"):
            assert [p.what for p in problems(head, None, engine) if p.is_error and "feed" in p.what] == []
        if deepseek:  # the Llama convention's ids on a DeepSeek target: SGLang would feed [2, 5, 8]
            cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 5, 8]
            (head / "config.json").write_text(json.dumps(cfg))
            assert any("contradict" in p.what for p in problems(head, None, "sglang") if p.is_error)
    first_is_1 = save_head(
        Eagle3Draft(draft_config_from_target(tcfg, 512, (1, 6, 9))),
        tmp_path / "one",
        {"num_hidden_layers": 12},
        {"target_architectures": ["DeepseekV3ForCausalLM"]},
    )
    assert any("cannot be told to capture" in p.what for p in problems(first_is_1, None, "sglang") if p.is_error)
    assert not [p for p in problems(first_is_1, None, "vllm") if p.is_error and "capture" in p.what]
