"""`eagle3 cache --engine vllm` without vLLM: the conventions it relies on (layer ids, the final norm
applied from the target's own tensors) and the cache it writes from an engine's answers, good or bad.

The engine here is `tests/fake_vllm_child.py`: the real child's argv and protocol, the states computed
by transformers in vLLM's conventions, and the faults a broken engine could show. The real vLLM is
the slow tier's (tests/integration/test_cache_vllm.py)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import torch
from cache_fixtures import conversations, write_data_folder
from cli_helpers import err, wide_console  # noqa: F401
from family_fixtures import build_family_target

from eagle3cli.cache.reader import CacheReader
from eagle3cli.cli import main
from eagle3cli.engines import vllm_capture
from eagle3cli.model.target_tail import final_norm, load_tail
from eagle3cli.run_folder.manifest import read_json
from eagle3cli.speculate.aux_layers import (
    default_aux_layer_ids,
    from_sglang_ids,
    sglang_ids,
    vllm_capture_ids,
    vllm_ids,
)
from eagle3cli.speculate.target import target_logits

REPO = Path(__file__).resolve().parents[2]
VLLM_MODELS = next(
    iter(sorted((REPO / ".venv-vllm").glob("lib/python3*/site-packages/vllm/model_executor/models"))), None
)
# one engine request per shard (a budget above a shard's tokens): a fault "at request N" hits shard N
FLAGS = ["--shard-tokens", "700", "--token-budget", "4096", "--max-length", "256", "--dtype", "fp32"]


# ---------------------------------------------------------------- the layer-id convention
@pytest.mark.parametrize(("ids", "layers"), [((2, 6, 9), 12), ((1, 2, 2), 4), ((2, 15, 27), 30), ((5,), 8)])
def test_vllm_is_told_eagle3_ids_then_the_last_layer(ids, layers):
    assert vllm_capture_ids(ids, layers) == [*vllm_ids(ids), layers] == [*ids, layers]
    assert vllm_capture_ids(default_aux_layer_ids(layers), layers)[:-1] == list(default_aux_layer_ids(layers))


@pytest.mark.skipif(VLLM_MODELS is None, reason="vLLM is not installed in .venv-vllm (make vllm-cpu)")
def test_the_convention_is_vllms_own_code():
    """Read from vLLM's source (not imported: its own venv): the state after decoder layer idx is
    appended as id idx + 1 with the residual added, and the final norm runs after the loop (so id L is
    the last layer's output before that norm)."""
    assert VLLM_MODELS is not None
    llama = " ".join((VLLM_MODELS / "llama.py").read_text().split())
    helper = " ".join((VLLM_MODELS / "interfaces.py").read_text().split())
    loop = llama.index("self._maybe_add_hidden_state( aux_hidden_states, idx + 1, hidden_states, residual )")
    assert llama.index("hidden_states, _ = self.norm(hidden_states, residual)", loop) > loop
    assert re.search(r"if layer_idx in self\.aux_hidden_state_layers: value = hidden_states \+ residual", helper)


SGLANG_MODELS = next(iter(sorted((REPO / ".venv").glob("lib/python3*/site-packages/sglang/srt/models"))), None)


@pytest.mark.skipif(SGLANG_MODELS is None, reason="sglang is not installed in .venv (make sglang-cpu)")
@pytest.mark.parametrize("family", ["llama.py", "qwen2.py", "qwen3.py"])
def test_sglangs_plus_one_is_read_from_its_own_code(family):
    """SGLang 0.5.23 captures `layers_to_capture = [id + 1 ...]` of its config ids, each the input of
    that layer: eagle3 writes k - 1 (`sglang_ids`), so SGLang captures eagle3's own k."""
    assert SGLANG_MODELS is not None
    source = " ".join((SGLANG_MODELS / family).read_text().split())
    assert "self.model.layers_to_capture = [val + 1 for val in layer_ids]" in source
    for ids in ((2, 6, 9), (1, 2, 2), (2, 15, 27)):
        assert [k + 1 for k in sglang_ids(ids)] == list(ids) == from_sglang_ids(sglang_ids(ids))


# ---------------------------------------------------------------- the pre-norm convention
@pytest.mark.parametrize("family", ["llama3.1", "qwen2.5", "gemma2", "qwen3"])
def test_the_norm_from_loaded_tensors_is_the_models_own(tmp_path, family):
    """Gemma's (1 + w) norm, tied and untied lm_heads, softcapped logits: the tail is the family's code
    on the target's own tensors, and nothing else of the target is loaded."""
    from transformers import AutoModelForCausalLM

    target = build_family_target(family, tmp_path / family)
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    tail = load_tail(target, torch.float32, lm_head=True)
    x = torch.randn(7, model.config.hidden_size) * 4
    with torch.no_grad():
        assert torch.equal(final_norm(tail)(x), model.model.norm(x))
        h = model.model.norm(x)
        assert torch.equal(target_logits(tail, h), target_logits(model, h))
    real = {n for n, p in tail.named_parameters() if not p.is_meta}
    assert real and all(n.startswith(("model.norm.", "lm_head.")) for n in real), real


def test_the_tail_reads_a_sharded_checkpoint_and_names_a_missing_tensor(tmp_path, deep_target_dir):
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(deep_target_dir), dtype=torch.float32)
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").exists()
    tail = load_tail(sharded, torch.float32, lm_head=False)
    assert torch.equal(final_norm(tail).weight, model.model.norm.weight)
    assert all(p.is_meta for n, p in tail.named_parameters() if n.startswith("lm_head."))

    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "config.json").write_text((deep_target_dir / "config.json").read_text())
    tensors = load_file(deep_target_dir / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if k != "model.norm.weight"}, cut / "model.safetensors")
    with pytest.raises(Exception, match=r"no tensor model\.norm\.weight"):
        load_tail(cut, torch.float32, lm_head=False)


# ---------------------------------------------------------------- the cache from an engine
@pytest.fixture
def fake_engine(monkeypatch):
    monkeypatch.setattr(vllm_capture, "CHILD", REPO / "tests" / "fake_vllm_child.py")
    monkeypatch.delenv("FAKE_ENGINE_FAULT", raising=False)


def test_capture_returns_aux_and_the_pre_norm_state_per_sequence(tmp_path, deep_target_dir, fake_engine):
    """The interface the engine adapters build on: per sequence, aux [T, n_aux, H] and the last layer's
    output before the final norm [T, H]; the target's own norm (from its tensors) finishes it."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(deep_target_dir), dtype=torch.float32).eval()
    batches = [[[1, 5, 9, 13, 2], [7, 7, 8]], [[3, 4]]]
    got = list(
        vllm_capture.capture(
            deep_target_dir, batches, (2, 4, 5), 8, 64, log_path=tmp_path / "engine.log", dtype="fp32",
            python=sys.executable,
        )
    )  # fmt: skip
    assert [len(b) for b in got] == [2, 1]
    tail = load_tail(deep_target_dir, torch.float32, lm_head=False)
    for batch, answers in zip(batches, got, strict=True):
        for ids, (aux, pre) in zip(batch, answers, strict=True):
            assert aux.shape == (len(ids), 3, 64) and pre.shape == (len(ids), 64)
            with torch.no_grad():
                out = model.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
            assert torch.allclose(aux[:, 1], out.hidden_states[4][0], atol=1e-5)
            assert not torch.allclose(pre, out.last_hidden_state[0], atol=1e-3)  # not normed yet
            assert torch.allclose(final_norm(tail)(pre), out.last_hidden_state[0], atol=1e-5)


@pytest.fixture(scope="module")
def data(tmp_path_factory, deep_target_dir):
    return write_data_folder(tmp_path_factory.mktemp("engine") / "data", deep_target_dir, conversations(10))


def cache(data, out, target, *flags) -> int:
    return main(["cache", "--data", str(data), "--out", str(out), "--target", str(target), *FLAGS, *flags])


def engine_flags(*more) -> list[str]:
    return ["--engine", "vllm", "--engine-python", sys.executable, *more]


@pytest.fixture(scope="module")
def hf_cache(tmp_path_factory, data, deep_target_dir):
    out = tmp_path_factory.mktemp("hf") / "cache"
    assert cache(data, out, deep_target_dir) == 0
    return out


def differences(a: Path, b: Path) -> dict[str, float]:
    """Every tensor the reader gives, cache b against cache a: float ones as the largest per-token
    relative error (a NaN counts as inf), integer ones as the share of tokens that differ. Token ids and
    masks must be equal."""
    ra, rb = CacheReader(a), CacheReader(b)
    assert len(ra) == len(rb)
    worst: dict[str, float] = {}
    for i in range(len(ra)):
        x, y = ra[i], rb[i]
        assert x.keys() == y.keys()
        assert torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["loss_mask"], y["loss_mask"])
        for k in x.keys() - {"input_ids", "loss_mask"}:
            if x[k].is_floating_point():
                rel = ((x[k] - y[k]).norm(dim=-1) / x[k].norm(dim=-1).clamp_min(1e-30)).nan_to_num(float("inf"))
                d = rel.max().item()
            else:
                d = (x[k] != y[k]).float().mean().item()
            worst[k] = max(worst.get(k, 0.0), d)
    return worst


def assert_same_cache(hf: Path, out: Path, engine: str) -> None:
    """`out`, written by `engine`, is the hf route's cache: the same plan and counts, every tensor within
    bf16 rounding, and it verifies."""
    a, b = read_json(hf / "manifest.json"), read_json(out / "manifest.json")
    for key in ("settings_hash", "counts", "aux_layer_ids", "coverage", "storage", "target"):
        assert a[key] == b[key], key
    assert b["config"]["engine"] == engine
    worst = differences(hf, out)
    assert set(worst) == {"aux_hidden", "last_hidden", "target_argmax"}, worst
    # bf16 rounding of values; an argmax may flip at a near-tie of two logits
    assert worst["aux_hidden"] <= 0.01 and worst["last_hidden"] <= 0.01 and worst["target_argmax"] <= 0.01, worst
    assert main(["cache", "--verify", str(out)]) == 0


def test_the_engine_cache_is_the_hf_cache(tmp_path, data, deep_target_dir, hf_cache, fake_engine):
    out = tmp_path / "engine"
    assert cache(data, out, deep_target_dir, *engine_flags()) == 0
    assert_same_cache(hf_cache, out, "vllm")
    assert not list(Path(vllm_capture.tempfile.gettempdir()).glob("eagle3-engine-states-*")), "states left behind"


def test_shard_processes_each_start_an_engine_and_the_last_writes_the_manifest(
    tmp_path, data, deep_target_dir, hf_cache, fake_engine
):
    out = tmp_path / "c"
    assert cache(data, out, deep_target_dir, *engine_flags("--shard", "0/2")) == 0
    assert not (out / "manifest.json").exists() and (out / "engine.shard-0-of-2.log").exists()
    assert cache(data, out, deep_target_dir, *engine_flags("--shard", "1/2")) == 0
    assert (out / "engine.shard-1-of-2.log").exists()
    assert read_json(out / "manifest.json")["settings_hash"] == read_json(hf_cache / "manifest.json")["settings_hash"]
    assert max(differences(hf_cache, out).values()) <= 0.01
    assert main(["cache", "--verify", str(out)]) == 0


@pytest.mark.slow
def test_the_topk_teacher_comes_from_the_tails_lm_head(tmp_path, data, deep_target_dir, fake_engine):
    flags = ["--storage", "compact", "--topk", "4"]
    assert cache(data, tmp_path / "hf", deep_target_dir, *flags) == 0
    assert cache(data, tmp_path / "engine", deep_target_dir, *flags, *engine_flags()) == 0
    worst = differences(tmp_path / "hf", tmp_path / "engine")
    assert set(worst) == {"aux_hidden", "topk_ids", "topk_logprobs"}, worst
    assert worst["topk_ids"] <= 0.02 and worst["topk_logprobs"] <= 0.02 and worst["aux_hidden"] <= 0.1, worst  # fp8


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        ("layers", r"hidden_states of shape \[\d+, 3, 64\]"),
        ("positions", r"hidden_states of shape \[\d+, 4, 64\] for a \d+-token sequence"),
        ("truncate", "unreadable states file"),
        # the rest of the class in the slow tier (an engine start each)
        pytest.param("tokens", "states of other tokens than were sent", marks=pytest.mark.slow),
        pytest.param("keys", r"with tensors \['hidden_states'\]", marks=pytest.mark.slow),
    ],
)
def test_a_wrong_answer_exits_2_and_loses_nothing(
    tmp_path, data, deep_target_dir, fake_engine, monkeypatch, capsys, fault, said
):
    out = tmp_path / "c"
    monkeypatch.setenv("FAKE_ENGINE_FAULT", fault)
    monkeypatch.setenv("FAKE_ENGINE_FAULT_AT", "1")  # the first shard's request is answered well
    assert cache(data, out, deep_target_dir, *engine_flags()) == 2
    text = err(capsys)
    assert re.search(said, text) and "no shard was written from it" in text and "without --engine" in text, text
    assert (out / ".shard-00000.json").exists() and (out / "shard-00000.safetensors").exists()
    assert not (out / "manifest.json").exists() and not (out / "shard-00001.safetensors").exists()
    if fault == "truncate":  # one case of the class rerun (each costs an engine start)
        first = (out / "shard-00000.safetensors").read_bytes()
        monkeypatch.delenv("FAKE_ENGINE_FAULT")
        assert cache(data, out, deep_target_dir, *engine_flags()) == 0  # the same command finishes it
        assert (out / "shard-00000.safetensors").read_bytes() == first


def test_an_engine_that_dies_mid_cache_exits_3_and_the_rerun_resumes(
    tmp_path, data, deep_target_dir, hf_cache, fake_engine, monkeypatch, capsys
):
    out = tmp_path / "c"
    monkeypatch.setenv("FAKE_ENGINE_FAULT", "die")
    monkeypatch.setenv("FAKE_ENGINE_FAULT_AT", "2")
    assert cache(data, out, deep_target_dir, *engine_flags()) == 3
    text = err(capsys)
    assert "the engine died while capturing (exit code 9)" in text and "rerun the same command" in text, text
    kept = sorted(p.name for p in out.glob(".shard-*.json"))
    assert kept == [".shard-00000.json", ".shard-00001.json"]
    monkeypatch.delenv("FAKE_ENGINE_FAULT")
    assert cache(data, out, deep_target_dir, *engine_flags()) == 0
    assert max(differences(hf_cache, out).values()) <= 0.01


def test_engine_flags_are_checked_before_anything_runs(tmp_path, data, deep_target_dir, capsys):
    assert cache(data, tmp_path / "a", deep_target_dir, "--engine-python", "/no/python") == 2
    assert "--engine-python is for --engine vllm" in err(capsys)
    assert cache(data, tmp_path / "b", deep_target_dir, "--engine", "vllm", "--device", "cpu") == 2
    assert "with --engine vllm the engine places it" in err(capsys)
    assert cache(data, tmp_path / "c", deep_target_dir, "--engine", "vllm", "--engine-python", "/no/python") == 2
    text = err(capsys)
    assert "could not start /no/python" in text and "make vllm-cpu" in text
    assert not list((tmp_path / "c").glob("shard-*"))


def test_an_engine_that_cannot_start_exits_2_with_its_log(tmp_path, data, deep_target_dir, monkeypatch, capsys):
    """A python without vLLM: the real child dies importing it; the user reads the log's end."""
    assert cache(data, tmp_path / "c", deep_target_dir, *engine_flags()) == 2
    text = err(capsys)
    assert "exited before it was ready" in text and "ModuleNotFoundError" in text and "without --engine" in text


def test_a_killed_runs_states_folder_is_removed_by_the_next_capture(tmp_path, monkeypatch):
    import subprocess

    monkeypatch.setattr(vllm_capture.tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = tmp_path / f"{vllm_capture.STATES_PREFIX}{int(dead.stdout)}-abc"
    live = tmp_path / f"{vllm_capture.STATES_PREFIX}{os.getpid()}-def"
    other = tmp_path / "eagle3-engine-states-notapid-x"
    for d in (gone, live, other):
        d.mkdir()
        (d / "0-1.safetensors").write_bytes(b"x")
    vllm_capture._remove_dead_states()
    assert not gone.exists() and live.exists() and other.exists()
