"""`eagle3 cache --engine sglang` without a GPU: the conventions read from SGLang 0.5.23's code, its
own parser on the server's arguments, and the cache written from a server's answers, good or bad.

The server here is `tests/fake_sglang_server.py`: eagle3's argv, `/generate` answered in SGLang's
layout with states computed by transformers in SGLang's conventions, and a broken server's faults."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cache_fixtures import conversations, write_data_folder
from cli_helpers import err, wide_console  # noqa: F401
from test_cache_engine import FLAGS, assert_same_cache, cache, differences

from eagle3cli.cli import main
from eagle3cli.engines import sglang_capture
from eagle3cli.engines.sglang_capture import capture_ids, parser_problem, server_args
from eagle3cli.errors import UsageError
from eagle3cli.speculate.aux_layers import from_sglang_ids

REPO = Path(__file__).resolve().parents[2]
SGLANG = next(iter(sorted((REPO / ".venv").glob("lib/python3*/site-packages/sglang/srt"))), None)
needs_sglang = pytest.mark.skipif(SGLANG is None, reason="sglang is not installed in .venv (make sglang-cpu)")
LLAMA, DEEPSEEK = ["LlamaForCausalLM"], ["DeepseekV3ForCausalLM"]


def source(rel: str) -> str:
    assert SGLANG is not None
    return " ".join((SGLANG / rel).read_text().split())


# ---------------------------------------------------------------- conventions
@pytest.mark.parametrize(
    ("ids", "archs", "told", "columns"),
    [
        ((2, 4, 5), LLAMA, [1, 3, 4], [0, 1, 2]),  # SGLang adds 1 on Llama / Qwen
        ((1, 2, 2), ["Qwen2ForCausalLM"], [0, 1], [0, 1, 1]),  # ids may not repeat there: sent once
        ((2, 30, 58), DEEPSEEK, [2, 30, 58], [0, 1, 2]),  # the first-id rule: as given
    ],
)
def test_sglang_is_told_eagle3_ids_in_its_convention(ids, archs, told, columns):
    said, cols = capture_ids(ids, archs)
    assert (said, cols) == (told, columns)
    first_rule = archs == DEEPSEEK
    assert [from_sglang_ids(said, first_rule)[c] for c in cols] == list(ids)  # the states captured are eagle3's


def test_a_deepseek_target_cannot_be_told_hidden_state_1():
    with pytest.raises(UsageError, match="start at hidden_states\\[1\\]"):
        capture_ids((1, 30, 58), DEEPSEEK)


@needs_sglang
def test_the_conventions_are_sglangs_own_code():
    """+1 on Llama, the first-id rule on DeepSeek-V2, the prompt's rows as one element of the answer,
    aux states in place of the final one, which stays out of the response."""
    assert "self.model.layers_to_capture = [val + 1 for val in layer_ids]" in source("models/llama.py")
    deepseek = source("models/deepseek_v2.py")
    assert re.search(
        r"if layer_ids and layer_ids\[0\] == 1: self\.model\.layers_to_capture = \[val \+ 1 for val in layer_ids\] "
        r"else: self\.model\.layers_to_capture = list\(layer_ids\)",
        deepseek,
    )
    results = source("managers/scheduler_components/batch_result_processor.py")
    assert "req.hidden_states.append(req_hidden_states.cpu().clone().tolist())" in results
    logits = source("layers/logits_processor.py")
    assert "hidden_states_to_store = pack_aux_hidden_states(aux_hidden_states)" in logits
    assert "not copied into the response path" in logits
    assert 'meta_info["hidden_states"] = hidden_states' in source("managers/tokenizer_manager.py")


@needs_sglang
@pytest.mark.parametrize("mode", ["final", "aux"])
def test_the_server_arguments_pass_sglangs_own_parser(mode):
    args = server_args(Path("models/tiny-target"), mode, [1, 3, 4], "bfloat16", 8, 30000)
    assert parser_problem(args) is None
    # the check is SGLang's: a repeated id (which capture_ids never sends) is refused by it
    assert "must not repeat" in parser_problem(server_args(Path("t"), "aux", [1, 1], "bfloat16", 1, 1))
    assert "unrecognized" in parser_problem([*args, "--no-such-flag"])


# ---------------------------------------------------------------- the cache from a server
@pytest.fixture
def fake_server(monkeypatch):
    monkeypatch.setattr(sglang_capture, "LAUNCH", [str(REPO / "tests" / "fake_sglang_server.py")])
    for name in ("FAKE_SGLANG_FAULT", "FAKE_SGLANG_FAULT_AT", "FAKE_SGLANG_FAULT_PASS"):
        monkeypatch.delenv(name, raising=False)


ENGINE = ["--engine", "sglang", "--engine-python", sys.executable]


@pytest.fixture(scope="module")
def data(tmp_path_factory, deep_target_dir):
    return write_data_folder(tmp_path_factory.mktemp("sglang") / "data", deep_target_dir, conversations(10))


@pytest.fixture(scope="module")
def hf_cache(tmp_path_factory, data, deep_target_dir):
    out = tmp_path_factory.mktemp("hf") / "cache"
    assert cache(data, out, deep_target_dir) == 0
    return out


def test_the_sglang_cache_is_the_hf_cache(tmp_path, data, deep_target_dir, hf_cache, fake_server):
    out = tmp_path / "engine"
    assert cache(data, out, deep_target_dir, *ENGINE) == 0
    assert_same_cache(hf_cache, out, "sglang")
    assert not list(out.glob(".final-*")), "stashed final states left behind"


@pytest.mark.slow  # four server starts
def test_shard_processes_each_run_both_passes(tmp_path, data, deep_target_dir, hf_cache, fake_server):
    out = tmp_path / "c"
    assert cache(data, out, deep_target_dir, *ENGINE, "--shard", "0/2") == 0
    assert not (out / "manifest.json").exists() and (out / "engine.shard-0-of-2.log").exists()
    assert cache(data, out, deep_target_dir, *ENGINE, "--shard", "1/2") == 0
    assert max(differences(hf_cache, out).values()) <= 0.01
    assert main(["cache", "--verify", str(out)]) == 0


@pytest.mark.parametrize(
    ("fault", "where", "said"),
    [
        ("layers", "aux", r"hidden states of shape \[\d+, 128\] for a \d+-token prompt"),
        ("positions", "final", r"hidden states of shape \[\d+, 64\] for a \d+-token prompt"),
        pytest.param("garbled", "aux", "broke off its answer", marks=pytest.mark.slow),  # two server starts each
        ("prenorm", "final", r"final states of RMS \d.* not the states after the final norm"),
        pytest.param(
            "shifted",
            "final",
            r"greedy token for \d of \d prompts of shard 0: not the last positions' states",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_a_wrong_answer_exits_2_and_loses_nothing(
    tmp_path, data, deep_target_dir, fake_server, monkeypatch, capsys, fault, where, said
):
    out = tmp_path / "c"
    monkeypatch.setenv("FAKE_SGLANG_FAULT", fault)
    monkeypatch.setenv("FAKE_SGLANG_FAULT_PASS", where)
    monkeypatch.setenv("FAKE_SGLANG_FAULT_AT", "0" if fault in ("prenorm", "shifted") else "1")
    assert cache(data, out, deep_target_dir, *ENGINE) == 2
    text = err(capsys)
    assert re.search(said, text) and "no shard was written from it" in text and "without --engine" in text, text
    assert not (out / "manifest.json").exists()
    if where == "aux":  # the first shard's answer was good: it is kept
        assert (out / ".shard-00000.json").exists() and not (out / "shard-00001.safetensors").exists()
    else:
        assert not list(out.glob("shard-*")) and len(list(out.glob(".final-*"))) == (fault == "positions")


@pytest.mark.parametrize("where", [pytest.param("final", marks=pytest.mark.slow), "aux"])
def test_a_server_that_dies_exits_3_and_the_rerun_resumes(
    tmp_path, data, deep_target_dir, hf_cache, fake_server, monkeypatch, capsys, where
):
    out = tmp_path / "c"
    monkeypatch.setenv("FAKE_SGLANG_FAULT", "die")
    monkeypatch.setenv("FAKE_SGLANG_FAULT_PASS", where)
    monkeypatch.setenv("FAKE_SGLANG_FAULT_AT", "2")
    assert cache(data, out, deep_target_dir, *ENGINE) == 3
    text = err(capsys)
    assert "the engine died while capturing (exit code 9)" in text and "rerun the same command" in text, text
    kept = sorted(p.name for p in out.glob(".shard-*.json" if where == "aux" else ".final-*"))
    assert len(kept) == 2, kept
    stashed = {p.name: p.stat().st_mtime_ns for p in out.glob(".final-*")}
    monkeypatch.delenv("FAKE_SGLANG_FAULT")
    assert cache(data, out, deep_target_dir, *ENGINE) == 0
    assert max(differences(hf_cache, out).values()) <= 0.01
    assert not list(out.glob(".final-*"))
    if where == "aux":  # the rerun did not start the final-states server again
        assert stashed and "pass 1 of 2" not in err(capsys)


def test_engine_flags_name_sglang(tmp_path, data, deep_target_dir, capsys):
    assert cache(data, tmp_path / "b", deep_target_dir, "--engine", "sglang", "--device", "cpu") == 2
    assert "with --engine sglang the engine places it" in err(capsys)


def test_a_server_that_cannot_start_exits_2_with_its_log(tmp_path, data, deep_target_dir, monkeypatch, capsys):
    monkeypatch.setattr(sglang_capture, "LAUNCH", ["-c", "import no_such_sglang_module"])
    assert cache(data, tmp_path / "c", deep_target_dir, *ENGINE) == 2
    text = err(capsys)
    assert "did not start" in text and "ModuleNotFoundError" in text and "without --engine" in text, text
    assert not list((tmp_path / "c").glob("shard-*"))


@pytest.mark.slow  # a process of its own, and three server starts
def test_killed_by_sigkill_in_the_second_pass_the_rerun_resumes(
    tmp_path, data, deep_target_dir, hf_cache, fake_server, capsys
):
    """eagle3 killed with SIGKILL once its first shard is written: the rerun starts no first pass (every
    shard left was stashed), finishes the cache equal to the hf route's and leaves no stash."""
    out = tmp_path / "c"
    argv = ["cache", "--data", str(data), "--out", str(out), "--target", str(deep_target_dir), *FLAGS, *ENGINE]
    fake = str(REPO / "tests" / "fake_sglang_server.py")
    code = (
        f"import sys; from eagle3cli.engines import sglang_capture as s; s.LAUNCH = [{fake!r}]; "
        f"from eagle3cli.cli import main; sys.exit(main({argv!r}))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 600
    while not (out / ".shard-00000.json").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    stashed = sorted(p.name for p in out.glob(".final-*"))
    assert stashed and ".final-00000.safetensors" not in stashed[1:], stashed
    assert not (out / "manifest.json").exists()
    assert cache(data, out, deep_target_dir, *ENGINE) == 0  # in this process: the fake_server fixture's launch
    assert "pass 1 of 2" not in err(capsys)
    assert max(differences(hf_cache, out).values()) <= 0.01
    assert not list(out.glob(".final-*"))
