"""EAGLE-3.1 heads (`norm_before_fc`, `norm_before_residual`) through every layout eagle3 writes and
reads: the flags and `input_norm.weight` survive each round trip in the spelling each engine's
loader reads; heads of other toolkits that spell them their way load; what cannot be served right
is refused (fc_norm; SGLang, which reads neither flag), exit 2 with `error:` and `next:`.

The engines' own readings, checked where they are cheap: vLLM's speculators config transform
(`transformers_utils/configs/speculators/algos.py`, a file without imports, run by vLLM's Python)
and llama.cpp's converter (read back from the GGUF it writes)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import serve_helpers as pf
import torch
from cli_helpers import err, wide_console  # noqa: F401 — autouse fixture
from head_fixtures import make_head
from safetensors.torch import load_file, save_file

from eagle3cli.cli import main
from eagle3cli.engines.gguf_export import HEAD_GGUF, check_head_gguf, llama_cpp_source, read_gguf
from eagle3cli.export.run import export_head
from eagle3cli.head.engines import sglang_norm_flags
from eagle3cli.head.read import load_any_head, load_head_weights, read_head
from eagle3cli.model.target import load_target
from eagle3cli.speculate.decoder import SpeculativeDecoder, plain_decode

FLAGS = [(True, False), (False, True), (True, True)]
IDS = ["fc", "residual", "both"]
VLLM_PY = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
VLLM_ALGOS = "lib/python3.11/site-packages/vllm/transformers_utils/configs/speculators/algos.py"


@pytest.fixture(scope="module", params=FLAGS, ids=IDS)
def flagged(request, deep_target_dir, tmp_path_factory):
    fc, residual = request.param
    out = tmp_path_factory.mktemp("eagle31") / "head"
    return make_head(deep_target_dir, out, norm_before_fc=fc, norm_before_residual=residual), fc, residual


def weights(head: Path) -> dict[str, torch.Tensor]:
    draft, _ = load_any_head(head)
    return {k: v for k, v in draft.state_dict().items() if k != "embed_tokens.weight"}


def same_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert list(wa) == list(wb)
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


def edit(src: Path, dst: Path, config=None, tensors=None) -> Path:
    shutil.copytree(src, dst)
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    if tensors is not None:
        t = load_file(str(dst / "model.safetensors"))
        tensors(t)
        save_file(t, str(dst / "model.safetensors"), {"format": "pt"})
    return dst


# ---------------------------------------------------------------- round trips
def test_every_layout_carries_the_flags_in_its_engines_spelling(flagged, tmp_path):
    head, fc, residual = flagged
    spec = read_head(head)
    assert (spec.layout, spec.norm_before_fc, spec.norm_before_residual) == ("eagle3", fc, residual)
    cfg = json.loads((head / "config.json").read_text())
    assert (cfg["norm_before_fc"], cfg["norm_before_residual"]) == (fc, residual)
    assert ("input_norm.weight" in load_file(str(head / "model.safetensors"))) == fc

    vllm = export_head(head, "vllm", tmp_path / "vllm")
    cfg = json.loads((vllm / "config.json").read_text())
    # vLLM: norm_before_residual at the top level; norm_before_fc in eagle_config, else the top level
    assert (cfg["norm_before_fc"], cfg["norm_before_residual"]) == (fc, residual)
    assert "norm_before_fc" not in cfg["eagle_config"]
    assert ("input_norm.weight" in load_file(str(vllm / "model.safetensors"))) == fc

    spec_dir = export_head(head, "speculators", tmp_path / "spec")
    cfg = json.loads((spec_dir / "config.json").read_text())
    assert (cfg["norm_before_fc"], cfg["norm_before_residual"]) == (fc, residual)
    assert not {"norm_before_fc", "norm_before_residual"} & set(cfg["transformer_layer_config"])
    names = load_file(str(spec_dir / "model.safetensors"))
    assert ("input_norm.weight" in names) == fc and "layers.0.hidden_norm.weight" in names

    back = export_head(spec_dir, "vllm", tmp_path / "back")  # and out of speculators again
    for d in (vllm, spec_dir, back):
        s = read_head(d)
        assert (s.norm_before_fc, s.norm_before_residual) == (fc, residual), d
        same_weights(head, d)


def test_sglang_export_and_serve_refuse_the_flags_sglang_does_not_read(flagged, deep_target_dir, tmp_path, capsys):
    """Refused: each flag the SGLang here does not read (none without SGLang; 0.5.23 reads
    norm_before_fc and its input_norm.weight, no SGLang reads norm_before_residual). A head whose
    flags it reads all is exported with the flag and the tensor its loader takes."""
    head, fc, residual = flagged
    supported, _ = sglang_norm_flags()
    unread = {f for f, on in (("norm_before_fc", fc), ("norm_before_residual", residual)) if on} - supported
    code = main(["export", "--head", str(head), "--format", "sglang", "--out", str(tmp_path / "sg")])
    text = err(capsys)
    if unread:
        assert code == 2 and "error:" in text and "next:" in text, text
        assert "SGLang's LlamaForCausalLMEagle3 does not read" in text and "--format vllm" in text
        assert not (tmp_path / "sg" / "model.safetensors").exists()
    else:
        assert code == 0, text
        cfg = json.loads((tmp_path / "sg" / "config.json").read_text())
        assert (cfg["norm_before_fc"], cfg["norm_before_residual"]) == (fc, residual)
        assert ("input_norm.weight" in load_file(str(tmp_path / "sg" / "model.safetensors"))) == fc

    args = ["serve", "--engine", "sglang", "--target", str(deep_target_dir), "--head", str(head), "--dry-run"]
    main(args)
    text = err(capsys)
    assert ("LlamaForCausalLMEagle3 does not read" in text) == bool(unread), text
    if unread:
        assert "error:" in text and "next:" in text and "--engine vllm" in text, text
    for flag in ("norm_before_fc", "norm_before_residual"):
        assert (f"EAGLE-3.1 head ({flag}" in text or f"and {flag})" in text) == (flag in unread), (flag, text)
    # vLLM reads both: nothing about them is wrong there
    vllm_errors = [p.what for p in pf.check_head(head, deep_target_dir, "vllm") if p.is_error]
    assert not [w for w in vllm_errors if "norm" in w], vllm_errors


def test_sglang_norm_flags_reads_what_the_loader_names(tmp_path, monkeypatch):
    """The installed SGLang is taken at its word: the flags its llama_eagle3.py names as strings."""
    from eagle3cli.head import engines

    (tmp_path / "llama_eagle3.py").write_text('x = eagle_config.get("norm_before_fc", False)\n', encoding="utf-8")
    monkeypatch.setattr(engines, "_installed_sglang_models", lambda: ("9.9", tmp_path))
    assert engines.sglang_norm_flags()[0] == {"norm_before_fc"}
    problem = engines.sglang_norm_problem(True, True)
    assert problem and "(norm_before_residual)" in problem and "SGLang 9.9" in problem
    assert engines.sglang_norm_problem(True, False) is None
    monkeypatch.setattr(engines, "_installed_sglang_models", lambda: None)
    assert engines.sglang_norm_flags()[0] == frozenset()
    assert "(norm_before_fc)" in (engines.sglang_norm_problem(True, False) or "")


# ---------------------------------------------------------------- heads of other toolkits
def test_other_spellings_load(deep_target_dir, tmp_path):
    base = make_head(deep_target_dir, tmp_path / "base", norm_before_fc=True, norm_before_residual=True)

    def nvidia(cfg):  # norm_before_fc only in eagle_config (vLLM reads it there first)
        cfg.pop("norm_before_fc")
        cfg["eagle_config"]["norm_before_fc"] = True

    spec = read_head(edit(base, tmp_path / "nvidia", nvidia))
    assert spec.norm_before_fc and spec.norm_before_residual

    spec_dir = export_head(base, "speculators", tmp_path / "spec")

    def silent(cfg):  # speculators' own default (and vLLM's reading of it) is true
        cfg.pop("norm_before_residual")

    spec = read_head(edit(spec_dir, tmp_path / "silent", silent))
    assert spec.norm_before_residual and any("reading it as true" in n for n in spec.notices)
    same_weights(base, tmp_path / "silent")


@pytest.mark.parametrize(
    "case, needle",
    [
        ("fc_norm", "fc_norm is set"),
        ("disagree", "eagle_config.norm_before_fc is False but norm_before_fc is True"),
        ("not_bool", "norm_before_residual is 'yes', not true or false"),
        ("no_weight", "lacks input_norm.weight (norm_before_fc is set)"),
        ("stray_weight", "input_norm.weight is in model.safetensors but norm_before_fc is not set"),
    ],
)
def test_heads_engines_would_read_differently_are_refused(case, needle, deep_target_dir, tmp_path, capsys):
    base = make_head(deep_target_dir, tmp_path / "base", norm_before_fc=True)
    config = {
        "fc_norm": lambda c: c.update(fc_norm=True),
        "disagree": lambda c: c["eagle_config"].update(norm_before_fc=False),
        "not_bool": lambda c: c.update(norm_before_residual="yes"),
        "stray_weight": lambda c: c.update(norm_before_fc=False),
    }.get(case)
    tensors = (lambda t: t.pop("input_norm.weight")) if case == "no_weight" else None
    bad = edit(base, tmp_path / "bad", config, tensors)
    code = main(["export", "--head", str(bad), "--format", "vllm", "--out", str(tmp_path / "out")])
    text = err(capsys)
    assert code == 2 and "error:" in text and "next:" in text and needle in text, text
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- eval decodes it
def test_eval_decoder_runs_an_eagle31_head_losslessly(tiny_target_dir, tmp_path):
    head = make_head(tiny_target_dir, tmp_path / "head", norm_before_fc=True, norm_before_residual=True)
    model, tok, _ = load_target(tiny_target_dir)
    draft, spec = load_any_head(head, model, torch.float32)
    assert draft.input_norm is not None and draft.midlayer.norm_before_residual
    prompt = tok("The rain in Spain")["input_ids"]
    ref = plain_decode(model, prompt, 12, set())
    for mode in ("chain", "tree"):
        dec = SpeculativeDecoder(model, draft, spec.aux_layer_ids, mode=mode, depth=3, topk=2, num_draft_tokens=6)
        assert dec.generate(prompt, 12).tokens == ref.tokens, mode


# ---------------------------------------------------------------- the engines' own readings
@pytest.mark.skipif(not (VLLM_PY.parent.parent / VLLM_ALGOS).is_file(), reason="no vLLM virtualenv here")
def test_vllm_reads_the_speculators_export_as_written(flagged, tmp_path):
    """vLLM's `update_eagle3` (speculators config -> the draft's config) on our export gives our flags."""
    head, fc, residual = flagged
    spec_dir = export_head(head, "speculators", tmp_path / "spec")
    script = (
        "import json, runpy, sys\n"
        "algos = runpy.run_path(sys.argv[1])\n"
        "cfg = json.load(open(sys.argv[2]))\n"
        "out = dict(cfg['transformer_layer_config'])\n"
        "algos['SUPPORTED_SPECULATORS_TYPES'][cfg['speculators_model_type']](cfg, out)\n"
        "print(json.dumps(out))\n"
    )
    algos = str(VLLM_PY.parent.parent / VLLM_ALGOS)
    r = subprocess.run(
        [str(VLLM_PY), "-I", "-c", script, algos, str(spec_dir / "config.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert (got["norm_before_fc"], got["norm_before_residual"], got["fc_norm"]) == (fc, residual, False)
    assert got["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]


@pytest.mark.slow  # llama.cpp's converter in a subprocess: ~8 s
@pytest.mark.skipif(llama_cpp_source() is None, reason="llama.cpp's converter is not here: run `make llama-cpp`")
def test_gguf_export_hands_both_flags_to_llama_cpp(deep_target_dir, tmp_path):
    """llama.cpp's converter writes eagle3.norm_before_fc/_residual and input_norm as
    enc.output_norm.weight (what its eagle3 graph reads); the export's read-back checked them."""
    head = make_head(deep_target_dir, tmp_path / "head", norm_before_fc=True, norm_before_residual=True)
    assert main(["export", "--head", str(head), "--format", "gguf", "--out", str(tmp_path / "gguf")]) == 0
    g = read_gguf(tmp_path / "gguf" / HEAD_GGUF)
    assert g.get("{arch}.norm_before_fc") is True and g.get("{arch}.norm_before_residual") is True
    draft = load_head_weights(read_head(head, 8), None, torch.float32)
    assert draft.input_norm is not None
    assert g.tensors["enc.output_norm.weight"].tolist() == draft.input_norm.weight.tolist()
    assert check_head_gguf(g, draft, (2, 4, 5), 8, 4096) == []
    plain = load_head_weights(read_head(make_head(deep_target_dir, tmp_path / "plain"), 8), None, torch.float32)
    found = " ".join(check_head_gguf(g, plain, (2, 4, 5), 8, 4096))
    assert "eagle3.norm_before_fc is True, expected False" in found and "enc.output_norm.weight" in found
