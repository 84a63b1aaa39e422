"""Family facts on tiny random targets of every family (Llama-3.1, Qwen2.5, Qwen3, Mistral,
Qwen3-MoE, Gemma-2, Gemma-3, gpt-oss): the target's own logits (Gemma-2 softcapping), its final
norm's effective scale (Gemma's 1 + w), and a draft head that carries no biases, a flat rope of
the full-attention layers and SiLU, and that preflight and the loader accept."""

from __future__ import annotations

import json

import pytest
import torch
from family_fixtures import ENGINE_SUPPORT, FAMILIES, build_family_target
from head_fixtures import final_norm_scale, init_draft_from_target
from serve_helpers import check_head

from eagle3cli.head.read import load_head
from eagle3cli.head.table import HEAD_TENSOR_NAMES
from eagle3cli.head.write import save_head
from eagle3cli.speculate.aux_layers import default_aux_layer_ids
from eagle3cli.speculate.draft import Eagle3Draft, draft_config_from_target
from eagle3cli.speculate.target import final_norm_offset, logit_spec, target_logits
from eagle3cli.speculate.ttt import teacher_from_hidden


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = build_family_target(request.param, tmp_path_factory.mktemp(request.param) / "model")
    model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    return request.param, path, model


def _ids(model, n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (1, n), generator=g)


@torch.no_grad()
def test_target_logits_are_the_models_own(family):
    name, _, model = family
    ids = _ids(model)
    hidden = model.model(input_ids=ids).last_hidden_state
    own = model(input_ids=ids).logits
    torch.testing.assert_close(target_logits(model, hidden), own, rtol=1e-5, atol=1e-5)
    if name == "gemma2":  # softcapped: lm_head alone is not the target's distribution
        assert logit_spec(model.config).softcap == 30.0
        big = hidden * 1000  # random-init logits are small; real ones reach the cap
        assert target_logits(model, big).abs().max() <= 30.0 < model.lm_head(big).abs().max()


@torch.no_grad()
def test_final_norm_offset_gives_the_measured_scale(family):
    """Offline training reads the stored weight and config.json only: stored + offset must be the
    scale the loaded module applies (Gemma: 1 + w)."""
    name, path, model = family
    measured = final_norm_scale(model)
    stored = model.model.norm.weight.float()
    cfg_json = json.loads((path / "config.json").read_text())
    for cfg in (model.config, cfg_json):
        torch.testing.assert_close(stored + final_norm_offset(cfg), measured, rtol=1e-5, atol=1e-5)
    assert (final_norm_offset(cfg_json) == 1.0) == name.startswith("gemma")


@torch.no_grad()
def test_teacher_uses_the_targets_logit_processing(family):
    name, _, model = family
    ids = _ids(model, 16)
    hidden = model.model(input_ids=ids).last_hidden_state
    logits = target_logits(model, hidden)
    # a draft vocab holding every position's target argmax, so every position has a teacher row
    wanted = sorted(set(logits.argmax(-1).flatten().tolist()))
    fill = [i for i in range(0, model.config.vocab_size, 3) if i not in wanted][: 200 - len(wanted)]
    draft_ids = torch.tensor(sorted(wanted + fill))
    d2t = draft_ids - torch.arange(len(draft_ids))
    t = teacher_from_hidden(hidden, model.lm_head.weight, d2t, spec=logit_spec(model.config))
    want = torch.softmax(logits[..., draft_ids], dim=-1)
    assert bool(t.valid.all()) and t.probs.shape == (16, len(draft_ids))
    for b, i in ((0, k) for k in range(16)):
        torch.testing.assert_close(t.at(b, i), want[b, i], rtol=1e-5, atol=1e-6)
    if name == "gemma2":  # at real logit scales the cap changes the distribution the draft learns
        big = hidden * 1000
        capped = teacher_from_hidden(big, model.lm_head.weight, d2t, spec=logit_spec(model.config))
        plain = teacher_from_hidden(big, model.lm_head.weight, d2t)
        want = torch.softmax(target_logits(model, big)[..., draft_ids], dim=-1)
        torch.testing.assert_close(capped.probs, want[0][capped.row[0] >= 0], rtol=1e-4, atol=1e-6)
        assert (capped.probs - plain.probs).abs().max() > 0.05


def test_draft_head_for_every_family_loads_and_passes_preflight(family, tmp_path):
    name, path, model = family
    cfg = model.config
    aux = default_aux_layer_ids(cfg.num_hidden_layers)
    dcfg = draft_config_from_target(cfg, 300, aux)
    assert dcfg.hidden_act == "silu" and dcfg.attention_bias is False and dcfg.mlp_bias is False
    rope = dcfg.rope_parameters
    want = cfg.rope_parameters.get("full_attention", cfg.rope_parameters)
    assert rope["rope_type"] == want["rope_type"] and rope["rope_theta"] == want["rope_theta"]
    draft = Eagle3Draft(dcfg)
    assert not [n for n, _ in draft.named_parameters() if n.endswith(".bias")]
    d2t = torch.arange(0, 600, 2)[:300] - torch.arange(300)
    init_draft_from_target(draft, model, d2t)
    torch.testing.assert_close(draft.norm.weight.detach(), final_norm_scale(model))
    with torch.no_grad():  # at init the draft's logits are the target's rows: never all zero
        h = torch.randn(1, 4, dcfg.hidden_size)
        assert draft.logits(h).abs().max() > 0
    head = save_head(draft, tmp_path / "head")
    hc = json.loads((head / "config.json").read_text())
    assert hc["attention_bias"] is False and hc["mlp_bias"] is False and hc["hidden_act"] == "silu"
    assert hc["rope_theta"] == want["rope_theta"] and not any(
        isinstance(v, dict) for v in hc["rope_parameters"].values()
    )
    assert set(load_head(head).state_dict()) - {"embed_tokens.weight"} == set(HEAD_TENSOR_NAMES)
    for engine in ("sglang", "vllm"):
        errors = [p.what for p in check_head(head, path, engine) if p.is_error]
        assert not [e for e in errors if "bias" in e or "tensor" in e or "rope" in e], errors


def test_preflight_refuses_heads_with_biases(tmp_path, tiny_target_dir):
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_target_dir))
    draft = Eagle3Draft(draft_config_from_target(model.config, 200, (1, 2, 2)))
    init_draft_from_target(draft, model, torch.zeros(200, dtype=torch.long))
    head = save_head(draft, tmp_path / "head")
    assert not [p for p in check_head(head, tiny_target_dir) if p.is_error]
    cfg = json.loads((head / "config.json").read_text())
    (head / "config.json").write_text(json.dumps({**cfg, "attention_bias": True}))
    errors = [p.what for p in check_head(head, tiny_target_dir) if p.is_error]
    assert any("attention_bias true" in e and "vLLM" in e for e in errors), errors
    (head / "config.json").write_text(json.dumps(cfg))
    t = load_file(str(head / "model.safetensors"))
    t["midlayer.self_attn.q_proj.bias"] = torch.zeros(t["midlayer.self_attn.q_proj.weight"].shape[0])
    save_file(t, str(head / "model.safetensors"))
    errors = [p.what for p in check_head(head, tiny_target_dir) if p.is_error]
    assert any("bias tensors (midlayer.self_attn.q_proj.bias)" in e for e in errors), errors


# ---------------------------------------------------------------- engines
@pytest.mark.slow
def test_sglang_table_is_what_sglangs_source_says():
    from eagle3cli.head.engines import (
        SGLANG_EAGLE3_TARGETS,
        SGLANG_TABLE_VERSION,
        _installed_sglang_models,
        sglang_eagle3_architectures,
    )

    found = _installed_sglang_models()
    if found is None or found[0] != SGLANG_TABLE_VERSION:
        pytest.skip(f"SGLang {SGLANG_TABLE_VERSION} is not installed (make sglang-cpu)")
    assert sglang_eagle3_architectures(found[1]) == SGLANG_EAGLE3_TARGETS
    assert {
        "LlamaForCausalLM",
        "Qwen3MoeForCausalLM",
        "Gemma3ForCausalLM",
        "GptOssForCausalLM",
    } <= SGLANG_EAGLE3_TARGETS
    assert not {"Gemma2ForCausalLM", "MixtralForCausalLM"} & SGLANG_EAGLE3_TARGETS


def test_preflight_refuses_targets_the_engine_cannot_serve(family, tmp_path):
    name, path, model = family
    draft = Eagle3Draft(draft_config_from_target(model.config, 300, default_aux_layer_ids(6)))
    init_draft_from_target(draft, model, torch.zeros(300, dtype=torch.long))
    head = save_head(draft, tmp_path / "head", {"path": str(path), "num_hidden_layers": 6})
    arch = json.loads((path / "config.json").read_text())["architectures"]
    assert json.loads((head / "config.json").read_text())["eagle3"]["target_architectures"] == arch
    for engine, want in zip(("sglang", "vllm"), ENGINE_SUPPORT[name], strict=True):
        problems = [p for p in check_head(head, path, engine) if "EAGLE-3 head" in p.what]
        if want == "yes":
            assert not problems, problems
        elif want == "no":
            (p,) = problems
            assert p.is_error and f"cannot serve an EAGLE-3 head on a {arch[0]}" in p.what
            assert ("set_eagle3_layers_to_capture" if engine == "sglang" else "SupportsEagle3") in p.what
        else:
            (p,) = problems
            assert not p.is_error and "cannot tell" in p.what


def test_speculators_export_refuses_a_target_vllm_cannot_serve(tmp_path):
    from eagle3cli.errors import UsageError
    from eagle3cli.export.run import export_head

    for name in ("gemma2", "llama3.1"):
        path = build_family_target(name, tmp_path / name)
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(path))
        draft = Eagle3Draft(draft_config_from_target(model.config, 300, default_aux_layer_ids(6)))
        head = save_head(draft, tmp_path / f"{name}-head", {"path": str(path)})
        if name == "gemma2":
            with pytest.raises(UsageError, match="vLLM cannot serve an EAGLE-3 head on a Gemma2ForCausalLM"):
                export_head(head, "speculators", tmp_path / "spec-gemma2")
            assert not (tmp_path / "spec-gemma2").exists()
        else:
            out = export_head(head, "speculators", tmp_path / "spec-llama")
            cfg = json.loads((out / "config.json").read_text())
            assert cfg["speculators_config"]["verifier"]["architectures"] == ["LlamaForCausalLM"]
