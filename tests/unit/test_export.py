"""The exported head: exact names and config fields (DESIGN.md), lossless round trip, refusals,
and the other layouts of `eagle3 export`."""

from __future__ import annotations

import json

import pytest
import torch
from head_fixtures import init_draft_from_target
from safetensors.torch import load_file, save_file
from tiny_configs import tiny_llama_config
from transformers import LlamaForCausalLM

from eagle3cli.cli import main
from eagle3cli.errors import UsageError
from eagle3cli.export.run import export_head
from eagle3cli.head.read import load_head
from eagle3cli.head.table import HEAD_TENSOR_NAMES
from eagle3cli.head.write import save_head, self_check
from eagle3cli.speculate.draft import Eagle3Draft, draft_config_from_target

EXPECTED_NAMES = {
    "fc.weight",
    "norm.weight",
    "lm_head.weight",
    "d2t",
    "t2d",
    *(f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"),
    *(f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
    *(f"midlayer.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")),
}


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    cfg = tiny_llama_config(300, layers=8, max_positions=4096)
    return LlamaForCausalLM(cfg).eval()


def trained_like_draft(target, aux=(2, 4, 5), vd=100):
    torch.manual_seed(1)
    draft = Eagle3Draft(draft_config_from_target(target.config, vd, aux))
    ids = torch.sort(torch.randperm(300)[:vd]).values
    init_draft_from_target(draft, target, ids - torch.arange(vd))
    return draft


def test_head_files_names_and_config_fields(tmp_path, target):
    draft = trained_like_draft(target)
    ident = {"path": "/models/t", "vocab_size": 300, "max_position_embeddings": 8192}
    head = save_head(draft, tmp_path / "head", ident, {"training": {"steps": 3}})
    assert sorted(p.name for p in head.iterdir()) == ["config.json", "manifest.json", "model.safetensors"]
    tensors = load_file(str(head / "model.safetensors"))
    assert set(tensors) == EXPECTED_NAMES == set(HEAD_TENSOR_NAMES)  # no embeddings, no `model.` prefix
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert tensors["fc.weight"].shape == (32, 3 * 32) and tensors["lm_head.weight"].shape == (100, 32)
    assert tensors["midlayer.self_attn.q_proj.weight"].shape[1] == 64  # [embed; hidden] = 2H
    cfg = json.loads((head / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["model_type"] == "llama"
    assert cfg["num_hidden_layers"] == 1 and cfg["draft_vocab_size"] == 100 and cfg["vocab_size"] == 300
    assert cfg["tie_word_embeddings"] is False and cfg["norm_output"] is False
    assert cfg["max_position_embeddings"] == 8192  # >= the target's context
    assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "use_aux_hidden_state": True}
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]  # vLLM: hidden_states[k]
    assert cfg["eagle3"]["aux_layer_ids"] == [2, 4, 5] and cfg["eagle3"]["target"] == ident
    assert cfg["eagle3"]["training"] == {"steps": 3}
    assert cfg["rope_theta"] == target.config.rope_parameters["rope_theta"]
    assert json.loads((head / "manifest.json").read_text())["stage"] == "head"


def test_round_trip_reproduces_logits_and_init_from_target(tmp_path, target):
    draft = trained_like_draft(target)
    torch.nn.init.normal_(draft.fc.weight)  # "trained": differs from any fresh init
    head = save_head(draft, tmp_path / "head")
    assert self_check(draft, head)[0] == 0.0
    loaded = load_head(head, target)
    assert torch.equal(loaded.embed_tokens.weight, target.model.embed_tokens.weight)
    assert not loaded.embed_tokens.weight.requires_grad
    tid = torch.arange(100) + loaded.d2t
    assert torch.equal(loaded.lm_head.weight, target.lm_head.weight[tid])  # init: the target's rows
    assert torch.equal(loaded.norm.weight, target.model.norm.weight)
    assert loaded.t2d.sum() == 100 and loaded.t2d[tid].all()


def test_load_refuses_wrong_names_shapes_and_configs(tmp_path, target):
    draft = trained_like_draft(target)
    head = save_head(draft, tmp_path / "head")
    t = load_file(str(head / "model.safetensors"))
    bad = dict(t)
    bad["model.fc.weight"] = bad.pop("fc.weight")  # SGLang's `model.` prefix: the same tensor
    save_file(bad, str(head / "model.safetensors"))
    assert torch.equal(load_head(head).fc.weight, t["fc.weight"])
    bad["fc_w"] = bad.pop("model.fc.weight")
    save_file(bad, str(head / "model.safetensors"))
    with pytest.raises(UsageError, match=r"(?s)no place for, .*: fc_w.*lacks fc.weight"):
        load_head(head)
    bad = dict(t, **{"lm_head.weight": torch.zeros(99, 32)})
    save_file(bad, str(head / "model.safetensors"))
    with pytest.raises(UsageError, match=r"lm_head.weight has shape \(99, 32\), but config says draft_vocab_size=100"):
        load_head(head)
    save_file(t, str(head / "model.safetensors"))
    cfg = json.loads((head / "config.json").read_text())
    for key, value, msg in [
        ("tie_word_embeddings", True, "tie_word_embeddings"),
        ("num_hidden_layers", 2, "num_hidden_layers is 2"),
        ("architectures", ["LlamaForCausalLM"], "architectures"),
        ("eagle_config", {"eagle_aux_hidden_state_layer_ids": [2, 4, 5]}, "contradict each other"),
    ]:
        (head / "config.json").write_text(json.dumps(dict(cfg, **{key: value})))
        with pytest.raises(UsageError, match=msg):
            load_head(head)
    (head / "config.json").write_text(json.dumps(cfg))
    small = LlamaForCausalLM(tiny_llama_config(200, layers=2, max_positions=2048))
    with pytest.raises(UsageError, match="a 2-layer target does not have"):
        load_head(head, small)


def test_export_formats(tmp_path, target):
    draft = trained_like_draft(target)
    head = save_head(draft, tmp_path / "head", {"path": "/models/t"})
    for fmt in ("sglang", "vllm"):
        out = export_head(head, fmt, tmp_path / fmt)
        assert load_file(str(out / "model.safetensors")).keys() == load_file(str(head / "model.safetensors")).keys()
        assert json.loads((out / "config.json").read_text())["draft_vocab_size"] == 100
    out = export_head(head, "speculators", tmp_path / "spec", num_speculative_tokens=5)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["architectures"] == ["Eagle3Speculator"]
    assert cfg["transformer_layer_config"]["num_hidden_layers"] == 1 and cfg["draft_vocab_size"] == 100
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 5
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "/models/t"
    names = set(load_file(str(out / "model.safetensors")))
    assert "layers.0.self_attn.q_proj.weight" in names and not any(n.startswith("midlayer.") for n in names)


def test_export_in_bf16_halves_the_weights_and_keeps_the_maps(tmp_path, target):
    draft = trained_like_draft(target)
    head = save_head(draft, tmp_path / "head")
    out = export_head(head, "sglang", tmp_path / "bf16", dtype="bf16")
    full, half = load_file(str(head / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert half["d2t"].dtype == torch.int64 and half["t2d"].dtype == torch.bool
    assert torch.equal(half["d2t"], full["d2t"]) and torch.equal(half["t2d"], full["t2d"])
    for name, t in full.items():
        if t.is_floating_point():
            assert half[name].dtype == torch.bfloat16 and torch.equal(half[name], t.to(torch.bfloat16)), name
    assert (out / "model.safetensors").stat().st_size < 0.6 * (head / "model.safetensors").stat().st_size
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    loaded = load_head(out, target)  # a bf16 head loads like any other
    assert loaded.fc.weight.shape == draft.fc.weight.shape


def test_export_cli(tmp_path, target, capsys):
    head = save_head(trained_like_draft(target), tmp_path / "head")
    assert main(["export", "--head", str(head), "--format", "vllm", "--out", str(tmp_path / "v")]) == 0
    assert (tmp_path / "v" / "manifest.json").exists()
    assert main(["export", "--head", str(head), "--format", "onnx", "--out", str(tmp_path / "x")]) == 2
    assert "'onnx' is not one of" in " ".join(capsys.readouterr().err.split())
    assert main(["export", "--head", str(tmp_path / "nope"), "--out", str(tmp_path / "y")]) == 2
    assert "does not exist" in " ".join(capsys.readouterr().err.split())  # rich wraps lines
