"""Heads of any origin through the one reader (head/read.py): the same trained head written in
every layout the engines and other tools use gives eval the same tau; contradictory aux layer
fields are refused with both readings; a speculators export resolves its target from anywhere."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from head_fixtures import init_draft_from_target
from safetensors.torch import load_file, save_file

from eagle3cli.cli import main
from eagle3cli.errors import UsageError
from eagle3cli.export.run import export_head
from eagle3cli.head.read import read_head
from eagle3cli.head.write import save_head
from eagle3cli.model.target import load_target, target_identity
from eagle3cli.speculate.aux_layers import default_aux_layer_ids
from eagle3cli.speculate.draft import Eagle3Draft, draft_config_from_target


@pytest.fixture(scope="module")
def ref_head(trained_target_dir, tmp_path_factory) -> Path:
    """A head whose every weight shapes its outputs (random midlayer and fc, the target's lm_head
    rows and norm), rounded to bf16 so that the bf16 copy is the same head."""
    model, tok, path = load_target(trained_target_dir)
    v = model.config.vocab_size
    vd = v - 96  # a draft vocab smaller than the target's: d2t matters
    cfg = draft_config_from_target(model.config, vd, default_aux_layer_ids(model.config.num_hidden_layers))
    torch.manual_seed(0)
    draft = Eagle3Draft(cfg)
    init_draft_from_target(draft, model, torch.arange(vd) % 7)
    with torch.no_grad():
        for p in draft.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return save_head(draft, tmp_path_factory.mktemp("ref") / "head", target_identity(path, tok, model.config).as_dict())


def _rewrite(src: Path, dst: Path, cfg_edit, tensor_edit=None) -> Path:
    dst.mkdir(parents=True)
    cfg = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(cfg_edit(cfg)))
    tensors = load_file(str(src / "model.safetensors"))
    save_file(tensor_edit(tensors) if tensor_edit else tensors, str(dst / "model.safetensors"))
    return dst


def _without(cfg: dict, *keys: str) -> dict:
    return {k: v for k, v in cfg.items() if k not in keys}


@pytest.fixture(scope="module")
def layouts(ref_head, trained_target_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("layouts")
    emb = torch.randn(load_file(str(trained_target_dir / "model.safetensors"))["model.embed_tokens.weight"].shape)
    spec = export_head(ref_head, "speculators", root / "spec-full")
    return {
        # SpecForge / SGLang: SGLang's own field (k - 1), no eagle3 block
        "sglang": _rewrite(
            ref_head, root / "sglang", lambda c: _without(c, "eagle3", "eagle_aux_hidden_state_layer_ids")
        ),
        # no ids at all: the engines' default [2, L//2, L-3] is what it was trained on
        "sglang-no-ids": _rewrite(
            ref_head, root / "bare", lambda c: _without(c, "eagle3", "eagle_config", "eagle_aux_hidden_state_layer_ids")
        ),
        "vllm": _rewrite(ref_head, root / "vllm", lambda c: _without(c, "eagle3", "eagle_config")),
        "speculators": _rewrite(spec, root / "speculators", lambda c: _without(c, "eagle3")),
        # a head that ships embed_tokens (ignored: engines use the target's) and `model.` names
        "embed+prefix": _rewrite(
            ref_head,
            root / "embed",
            lambda c: _without(c, "eagle3"),
            lambda t: {**{f"model.{n}": x for n, x in t.items()}, "embed_tokens.weight": emb},
        ),
        "bf16": _rewrite(
            ref_head,
            root / "bf16",
            lambda c: {**_without(c, "eagle3"), "torch_dtype": "bfloat16"},
            lambda t: {n: x.to(torch.bfloat16) if x.is_floating_point() else x for n, x in t.items()},
        ),
    }


def test_reader_resolves_every_layout_to_the_same_layers(layouts, ref_head):
    want = read_head(ref_head).aux_layer_ids
    assert want == (2, 6, 9)
    got = {name: read_head(p, num_target_layers=12) for name, p in layouts.items()}
    assert {n: s.aux_layer_ids for n, s in got.items()} == dict.fromkeys(layouts, want)
    assert got["sglang"].layout == "sglang" and "+1" in got["sglang"].aux_source + got["sglang"].readings[0].convention
    assert got["vllm"].layout == "vllm" and got["speculators"].layout == "speculators"
    assert any("names no aux layers" in n and "[2, 6, 9]" in n for n in got["sglang-no-ids"].notices)
    assert any("embed_tokens" in n for n in got["embed+prefix"].notices) and got["bf16"].dtype == "BF16"
    with pytest.raises(UsageError, match="no target is known"):
        read_head(layouts["sglang-no-ids"])  # the default needs the target's layer count


@torch.no_grad()
def test_every_layout_loads_the_same_draft_on_the_same_features(trained_target_dir, ref_head, layouts, tmp_path):
    from eagle3cli.head.read import load_any_head
    from eagle3cli.prompts import load_prompts, render
    from eagle3cli.speculate.target import AuxCapture

    target, tok, _ = load_target(trained_target_dir)
    ids = torch.tensor([render(tok, load_prompts("gsm8k", 1)[0][1])])

    def root_logits(head: Path) -> torch.Tensor:
        draft, spec = load_any_head(head, target, dtype=torch.float32)
        with AuxCapture(target, spec.aux_layer_ids) as cap:
            target.model(input_ids=ids)
        n = ids.shape[1]
        out = draft(ids[:, 1:], cap.concat()[:, :-1], draft.new_cache(n), 0, from_target=True)
        return draft.logits(out)

    ref = root_logits(ref_head)
    for name, head in layouts.items():
        assert torch.equal(root_logits(head), ref), name
    # the same numbers in SGLang's field alone mean other layers: the reader must not take them as ours
    wrong = _rewrite(
        ref_head,
        tmp_path / "wrong",
        lambda c: {
            **_without(c, "eagle3", "eagle_aux_hidden_state_layer_ids"),
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 6, 9]},
        },
    )
    assert read_head(wrong, 12).aux_layer_ids == (3, 7, 10)
    assert not torch.equal(root_logits(wrong), ref)


@pytest.mark.slow
def test_eval_gives_the_same_tau_for_every_layout(trained_target_dir, ref_head, layouts, tmp_path):
    out = tmp_path / "eval"
    args = ["eval", "--target", str(trained_target_dir), "--head", str(ref_head)]
    for p in layouts.values():
        args += ["--compare", str(p)]
    args += ["--bench", "gsm8k", "--num-prompts", "1", "--max-new-tokens", "16", "--depth", "4"]
    args += ["--out", str(out), "--no-generate-baseline", "--threads", "1"]
    assert main(args) == 0
    rep = json.loads((out / "report.json").read_text())
    heads = rep["heads"]
    assert len(heads) == 1 + len(layouts)
    ref_acc = heads[next(iter(heads))]["chain"]["acceptance"]
    for label, st in heads.items():
        acc = st["chain"]["acceptance"]
        assert acc["tau"] == ref_acc["tau"] and acc["per_depth"] == ref_acc["per_depth"], label
        assert st["chain"]["lossless"]["mismatches"] == 0
    assert {st["head"]["layout"] for st in heads.values()} == {"eagle3", "sglang", "vllm", "speculators"}
    rows = rep["comparison"]["modes"]["chain"]
    assert all(r["tau_ratio_vs_reference"] == 1.0 for r in rows)
    assert all(r["verdict"] == "no significant difference" for r in rows[1:])


def test_contradictory_ids_are_refused_with_both_readings(ref_head, trained_target_dir, tmp_path, capsys):
    # eagle3's ids written unchanged into SGLang's field: SGLang would read hidden_states[3, 7, 10]
    bad = _rewrite(
        ref_head, tmp_path / "bad", lambda c: {**c, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 6, 9]}}
    )
    rc = main(["eval", "--target", str(trained_target_dir), "--head", str(bad), "--out", str(tmp_path / "e")])
    assert rc == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "contradict each other" in err
    assert "eagle3.aux_layer_ids=[2, 6, 9] (hidden_states[k]) -> hidden_states[2, 6, 9]" in err
    assert "eagle_config.eagle_aux_hidden_state_layer_ids=[2, 6, 9] (SGLang: output of layer k, +1) -> " in err
    assert "hidden_states[3, 7, 10]" in err
    # SGLang's field and vLLM's, disagreeing on a head from another tool
    vl = _rewrite(
        ref_head,
        tmp_path / "bad2",
        lambda c: {**_without(c, "eagle3"), "eagle_aux_hidden_state_layer_ids": [1, 5, 8]},
    )
    with pytest.raises(UsageError, match=r"(?s)hidden_states\[2, 6, 9\].*hidden_states\[1, 5, 8\]"):
        read_head(vl, 12)


@pytest.mark.slow
def test_speculators_export_resolves_its_target_from_another_directory(
    trained_target_dir, ref_head, tmp_path, monkeypatch
):
    # a head that recorded its target relative to the directory it was trained in (older exports)
    rel = os.path.relpath(trained_target_dir, Path.cwd())
    old = _rewrite(
        ref_head,
        tmp_path / "old",
        lambda c: {**c, "eagle3": {**c["eagle3"], "target": {**c["eagle3"]["target"], "path": rel}}},
    )
    spec = export_head(old, "speculators", tmp_path / "spec")
    verifier = json.loads((spec / "config.json").read_text())["speculators_config"]["verifier"]["name_or_path"]
    assert verifier == str(Path(trained_target_dir).resolve())
    cfg = json.loads((spec / "config.json").read_text())
    (spec / "config.json").write_text(json.dumps(_without(cfg, "eagle3")))  # as speculators itself writes it
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # `from_pretrained(verifier)` from here must find the same folder
    rc = main(["eval", "--head", str(spec), "--bench", "gsm8k", "--num-prompts", "1", "--max-new-tokens", "8"])
    assert rc == 0
    # a head folder that is not a run's NAME/head: the report goes to runs/eval-NAME here (never beside it)
    rep = json.loads((elsewhere / "runs" / "eval-spec" / "report.json").read_text())
    assert rep["target"]["path"] == verifier and next(iter(rep["heads"].values()))["head"]["layout"] == "speculators"


def test_serve_preflight_reads_heads_through_the_same_reader(layouts, trained_target_dir, ref_head, tmp_path):
    import serve_helpers as pf

    def errors(head, engine="sglang"):
        return [p.what for p in pf.check_head(head, trained_target_dir, engine) if p.is_error]

    # a speculators checkpoint: vLLM reads it as it is; SGLang needs eagle3's layout, and says how
    assert errors(layouts["speculators"], "vllm") == []
    sg = pf.check_head(layouts["speculators"], trained_target_dir, "sglang")
    assert any("speculators layout" in p.what and "eagle3 export" in p.fix for p in sg if p.is_error)
    # a SpecForge-style head without ids: the engines' default, said as a warning, not refused
    bare = pf.check_head(layouts["sglang-no-ids"], trained_target_dir, "sglang")
    assert not [p for p in bare if p.is_error]
    assert any("names no aux layers" in p.what and "[2, 6, 9]" in p.what for p in bare)
    # SGLang's field alone, in SGLang's convention: what it was trained on, for both engines
    assert errors(layouts["sglang"]) == []
    bad = _rewrite(
        ref_head,
        tmp_path / "bad",
        lambda c: {**_without(c, "eagle3"), "eagle_aux_hidden_state_layer_ids": [1, 5, 8]},
    )
    assert any("contradict each other" in e for e in errors(bad))
