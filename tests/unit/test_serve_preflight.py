"""`eagle3 serve` preflight: every silent-failure case the engines have, each caught with its fix."""

from __future__ import annotations

import importlib.util
import socket

import pytest
import serve_helpers as pf
import torch
from serve_helpers import copy_head, edit_config, edit_tensors, export_head

from eagle3cli.cli import main
from eagle3cli.errors import UsageError
from eagle3cli.head.check import Problem, raise_if_errors
from eagle3cli.serve import commands, machine


@pytest.fixture(scope="module")
def good_head(tiny_target_dir, tmp_path_factory):
    return export_head(tmp_path_factory.mktemp("serve-head") / "head", tiny_target_dir)


@pytest.fixture
def head(good_head, tmp_path):
    """A fresh copy of the good head to break."""
    return copy_head(good_head, tmp_path / "head")


def errors(problems):
    return [p for p in problems if p.is_error]


def only_error(problems, *needles):
    errs = errors(problems)
    assert len(errs) == 1, [p.what for p in errs]
    for n in needles:
        assert n in errs[0].what + " " + errs[0].fix, (n, errs[0])
    return errs[0]


# ---------------------------------------------------------------- the good head
@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_exported_head_passes(good_head, tiny_target_dir, engine):
    problems = pf.check_head(good_head, tiny_target_dir, engine)
    assert errors(problems) == [] and problems == []


def test_sglang_layer_names_are_accepted(head, tiny_target_dir):
    # SGLang maps `layers.0.` (its name) and `midlayer.` alike; the head is still loadable.
    edit_tensors(head, rename={"midlayer.mlp.up_proj.weight": "layers.0.mlp.up_proj.weight"})
    assert errors(pf.check_head(head, tiny_target_dir)) == []


# ---------------------------------------------------------------- config.json
def test_missing_d2t(head, tiny_target_dir):
    edit_tensors(head, drop=("d2t",))
    only_error(pf.check_head(head, tiny_target_dir), "no d2t", "acceptance collapses")


def test_full_vocab_head_needs_no_d2t(tmp_path, tiny_target_dir):
    vocab = int(__import__("json").loads((tiny_target_dir / "config.json").read_text())["vocab_size"])
    head = export_head(tmp_path / "full", tiny_target_dir, draft_vocab=vocab)
    edit_tensors(head, drop=("d2t", "t2d"))
    assert errors(pf.check_head(head, tiny_target_dir)) == []


def test_draft_vocab_size_missing(head, tiny_target_dir):
    edit_config(head, drop=("draft_vocab_size",))
    only_error(pf.check_head(head, tiny_target_dir), "draft_vocab_size is missing")


def test_draft_vocab_size_null(head, tiny_target_dir):
    edit_config(head, draft_vocab_size=None)
    only_error(pf.check_head(head, tiny_target_dir), "draft_vocab_size is null", "TARGET's lm_head")


def test_draft_vocab_size_disagrees_with_lm_head(head, tiny_target_dir):
    edit_config(head, draft_vocab_size=128)
    errs = errors(pf.check_head(head, tiny_target_dir))
    assert any("lm_head.weight has shape" in p.what for p in errs)
    assert any("d2t has shape" in p.what for p in errs)


def test_tie_word_embeddings_true(head, tiny_target_dir):
    edit_config(head, tie_word_embeddings=True)
    only_error(pf.check_head(head, tiny_target_dir), "tie_word_embeddings is true", "false")


def test_tie_word_embeddings_missing_is_a_warning(head, tiny_target_dir):
    edit_config(head, drop=("tie_word_embeddings",))
    problems = pf.check_head(head, tiny_target_dir)
    assert errors(problems) == [] and any("tie_word_embeddings" in p.what for p in problems)


def test_norm_output_true(head, tiny_target_dir):
    edit_config(head, norm_output=True)
    only_error(pf.check_head(head, tiny_target_dir), "norm_output")


def test_wrong_architecture(head, tiny_target_dir):
    edit_config(head, architectures=["LlamaForCausalLM"])
    only_error(pf.check_head(head, tiny_target_dir), "architectures", "LlamaForCausalLMEagle3")


def test_vocab_size_mismatch(head, tiny_target_dir):
    edit_config(head, vocab_size=999)
    errs = errors(pf.check_head(head, tiny_target_dir))
    assert any("vocab_size 999 != target vocab_size" in p.what for p in errs)


def test_hidden_size_mismatch(head, tiny_target_dir):
    edit_config(head, hidden_size=32)
    errs = errors(pf.check_head(head, tiny_target_dir))
    assert any("hidden_size 32 != target hidden_size 64" in p.what for p in errs)


def test_max_position_embeddings_too_small(head, tiny_target_dir):
    edit_config(head, max_position_embeddings=128)
    only_error(pf.check_head(head, tiny_target_dir), "max_position_embeddings 128 <", '"max_position_embeddings": 1024')


def test_head_for_another_target(head, deep_target_dir):
    # trained on the 4-layer target, served with the 8-layer one (same vocab and width)
    only_error(pf.check_head(head, deep_target_dir), "trained on a 4-layer target", "has 8 layers")


def test_missing_config_is_a_usage_error(tmp_path, tiny_target_dir, good_head):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="config.json does not exist"):
        pf.check_head(tmp_path / "empty", tiny_target_dir)
    copy_head(good_head, tmp_path / "run" / "head")
    with pytest.raises(UsageError) as e:  # the run folder instead of its head: say which folder
        pf.check_head(tmp_path / "run", tiny_target_dir)
    assert e.value.next_step == f"--head {tmp_path / 'run' / 'head'}"


# ---------------------------------------------------------------- aux layer ids
def test_sglang_ids_written_in_vllm_convention(head, tiny_target_dir):
    # the classic mistake: hidden_states indices written into eagle_config (SGLang adds 1). The fields
    # contradict each other: refused for both engines, as eval refuses the head (one reader, one rule)
    edit_config(head, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2, 2], "use_aux_hidden_state": True})
    for engine in ("sglang", "vllm"):
        e = only_error(pf.check_head(head, tiny_target_dir, engine), "contradict each other", "hidden_states[2, 3, 3]")
        assert "eagle_config.eagle_aux_hidden_state_layer_ids to [0, 1, 1]" in e.fix


def test_vllm_ids_written_in_sglang_convention(head, tiny_target_dir):
    edit_config(head, eagle_aux_hidden_state_layer_ids=[0, 1, 1])
    for engine in ("sglang", "vllm"):
        e = only_error(pf.check_head(head, tiny_target_dir, engine), "contradict each other", "hidden_states[0, 1, 1]")
        assert "eagle_aux_hidden_state_layer_ids to [1, 2, 2]" in e.fix


def test_an_engine_falling_back_to_its_default(head, tiny_target_dir):
    # no top-level ids: vLLM feeds its default, which is what the 4-layer head was trained on; drop
    # eagle_config on a head trained elsewhere and SGLang feeds its default instead
    edit_config(head, drop=("eagle_aux_hidden_state_layer_ids",))
    assert errors(pf.check_head(head, tiny_target_dir, "vllm")) == []
    edit_config(
        head, drop=("eagle_config",), eagle3={"aux_layer_ids": [1, 2, 3]}, eagle_aux_hidden_state_layer_ids=[1, 2, 3]
    )
    only_error(pf.check_head(head, tiny_target_dir, "sglang"), "sglang would feed hidden_states[1, 2, 2]")
    problems = pf.check_head(head, tiny_target_dir, "vllm")
    assert errors(problems) == [] and any("only matters for --engine sglang" in p.what for p in problems)


def test_non_default_aux_ids_need_both_fields(tmp_path, deep_target_dir):
    head = export_head(tmp_path / "h", deep_target_dir, aux=(1, 3, 6))
    assert errors(pf.check_head(head, deep_target_dir, "sglang")) == []
    edit_config(head, drop=("eagle_config",))  # SGLang falls back to its default [2, 4, 5]
    only_error(pf.check_head(head, deep_target_dir, "sglang"), "SGLang's default", "[0, 2, 5]")


def test_fc_width_disagrees_with_aux_ids(head, tiny_target_dir):
    edit_config(
        head,
        eagle3={"aux_layer_ids": [1, 2]},
        eagle_aux_hidden_state_layer_ids=[1, 2],
        eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1], "use_aux_hidden_state": True},
    )
    only_error(pf.check_head(head, tiny_target_dir), "fc.weight reads 3 aux features")


def test_use_aux_hidden_state_false(head, tiny_target_dir):
    edit_config(head, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 1, 0], "use_aux_hidden_state": False})
    only_error(pf.check_head(head, tiny_target_dir), "use_aux_hidden_state is false")


# ---------------------------------------------------------------- model.safetensors
def test_unknown_tensor_names(head, tiny_target_dir):
    edit_tensors(head, rename={"midlayer.hidden_norm.weight": "midlayer.hidden_layernorm.weight"})
    errs = errors(pf.check_head(head, tiny_target_dir))
    assert any("skips silently: midlayer.hidden_layernorm.weight" in p.what for p in errs)
    assert any("lacks midlayer.hidden_norm.weight" in p.what for p in errs)


def test_missing_tensor(head, tiny_target_dir):
    edit_tensors(head, drop=("lm_head.weight",))
    only_error(pf.check_head(head, tiny_target_dir), "lacks lm_head.weight")


def test_d2t_out_of_range(head, tiny_target_dir):
    edit_tensors(head, replace={"d2t": torch.full((256,), 10**6, dtype=torch.long)})
    only_error(pf.check_head(head, tiny_target_dir), "outside the target vocab")


def test_d2t_duplicates(head, tiny_target_dir):
    edit_tensors(head, replace={"d2t": -torch.arange(256, dtype=torch.long)})  # every draft id -> target 0
    only_error(pf.check_head(head, tiny_target_dir), "same target id")


def test_d2t_dtype_integer_only(head, tiny_target_dir):
    from safetensors.torch import load_file

    d2t = load_file(str(head / "model.safetensors"))["d2t"]
    edit_tensors(head, replace={"d2t": d2t.to(torch.int32)})  # the engines add it to an arange: any integer map
    assert errors(pf.check_head(head, tiny_target_dir)) == []
    edit_tensors(head, replace={"d2t": d2t.to(torch.float32)})  # eval truncated a float map; now refused everywhere
    only_error(pf.check_head(head, tiny_target_dir), "1-D integer tensor")


def test_d2t_all_zero_with_a_matching_t2d_is_fine(head, tiny_target_dir):
    # the demo's own head: its data used only ids below the draft vocab size, so d2t is all zeros
    vocab = int(__import__("json").loads((tiny_target_dir / "config.json").read_text())["vocab_size"])
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[:256] = True
    edit_tensors(head, replace={"d2t": torch.zeros(256, dtype=torch.long), "t2d": t2d})
    assert pf.check_head(head, tiny_target_dir) == []


def test_d2t_all_zero_without_t2d_is_a_warning(head, tiny_target_dir):
    edit_tensors(head, replace={"d2t": torch.zeros(256, dtype=torch.long)}, drop=("t2d",))
    problems = pf.check_head(head, tiny_target_dir)
    assert errors(problems) == [] and any("all zeros" in p.what for p in problems)


def test_d2t_all_zero_with_a_t2d_of_other_ids_is_an_error(head, tiny_target_dir):
    vocab = int(__import__("json").loads((tiny_target_dir / "config.json").read_text())["vocab_size"])
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[vocab - 256 :] = True
    edit_tensors(head, replace={"d2t": torch.zeros(256, dtype=torch.long), "t2d": t2d})
    only_error(pf.check_head(head, tiny_target_dir), "t2d disagrees")


def test_t2d_disagrees_with_d2t(head, tiny_target_dir):
    vocab = int(__import__("json").loads((tiny_target_dir / "config.json").read_text())["vocab_size"])
    edit_tensors(head, replace={"t2d": torch.zeros(vocab, dtype=torch.bool)})
    only_error(pf.check_head(head, tiny_target_dir), "t2d disagrees")


def test_truncated_safetensors(head, tiny_target_dir):
    data = (head / "model.safetensors").read_bytes()
    (head / "model.safetensors").write_bytes(data[:100])
    only_error(pf.check_head(head, tiny_target_dir), "not a readable safetensors")


# ---------------------------------------------------------------- speculation numbers
@pytest.mark.parametrize("flags", [(3, None, None), (None, 1, 4), (3, 1, None)])
def test_partial_spec_flags(flags):
    (p,) = commands.check_spec_flags(*flags)
    assert "give all three" in p.fix


@pytest.mark.parametrize(
    "steps,topk,draft,engine", [(3, 1, 4, "sglang"), (5, 4, 8, "sglang"), (5, 8, 41, "sglang"), (7, 1, 8, "vllm")]
)
def test_valid_spec_numbers(steps, topk, draft, engine):
    assert commands.check_spec_numbers(steps, topk, draft, engine) == []


@pytest.mark.parametrize(
    "steps,topk,draft,engine,needle",
    [
        (3, 2, 8, "sglang", "> steps*topk+1 = 7"),
        (3, 1, 3, "sglang", "verifies exactly steps+1 = 4"),
        (5, 4, 8, "vllm", "drafts a chain"),
        (0, 1, 1, "sglang", "--steps is 0"),
        (3, 1, 1, "sglang", "--draft-tokens is 1"),
    ],
)
def test_invalid_spec_numbers(steps, topk, draft, engine, needle):
    problems = commands.check_spec_numbers(steps, topk, draft, engine)
    assert problems and any(needle in p.what for p in problems), problems


# ---------------------------------------------------------------- the machine
def test_port_in_use():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        (p,) = machine.check_port("127.0.0.1", port)
        assert f"port {port}" in p.what and p.fix.startswith("--port ")
    assert machine.check_port("127.0.0.1", port) == []


def test_engine_not_installed(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    monkeypatch.setattr(machine.shutil, "which", lambda name: None)
    (p,) = machine.check_engine_installed("sglang")
    assert 'pip install "sglang>=0.5,<0.6"' in p.fix
    (p,) = machine.check_engine_installed("vllm")
    assert "pip install" in p.fix and "vllm" in p.fix


def test_no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    (p,) = machine.check_gpu("sglang")
    assert "no CUDA device" in p.what and "--dry-run" in p.fix


def test_raise_if_errors_lists_every_error():
    problems = [
        Problem("a broke", "fix a"),
        Problem("b is odd", "fix b", "warning"),
        Problem("c broke", "fix c"),
    ]
    with pytest.raises(UsageError) as e:
        raise_if_errors(problems, "next")
    assert "2 problem(s)" in e.value.what and "fix a" in e.value.what and "c broke" in e.value.what
    assert "b is odd" not in e.value.what


# ---------------------------------------------------------------- through the CLI: exit 2, a message
def _cli(capsys, *args):
    code = main(["serve", *args])
    cap = capsys.readouterr()
    return code, cap.out, " ".join(cap.err.split())  # rich wraps long lines


def test_cli_missing_d2t_exits_2(head, tiny_target_dir, capsys):
    edit_tensors(head, drop=("d2t",))
    code, _, err = _cli(capsys, "--target", str(tiny_target_dir), "--head", str(head), "--dry-run")
    assert code == 2 and "no d2t" in err and "fix:" in err


def test_cli_partial_flags_exit_2(good_head, tiny_target_dir, capsys):
    code, _, err = _cli(capsys, "--target", str(tiny_target_dir), "--head", str(good_head), "--steps", "3", "--dry-run")
    assert code == 2 and "--steps given without --topk, --draft-tokens" in err


def test_cli_missing_target_exits_2(good_head, capsys):
    code, _, err = _cli(capsys, "--head", str(good_head), "--dry-run")
    assert code == 2 and "--target is required" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_cli_launch_without_gpu_exits_2(good_head, tiny_target_dir, capsys):
    code, _, err = _cli(capsys, "--target", str(tiny_target_dir), "--head", str(good_head), "--port", "1")
    assert code == 2 and "no CUDA device" in err
    # nothing is wrong with the head or the flags: the next step does not say so
    assert "fix the head/flags" not in err and "passed every check" in " ".join(err.split())


def test_malformed_aux_ids(head, tiny_target_dir):
    edit_config(head, eagle_aux_hidden_state_layer_ids="2,2,1")
    only_error(pf.check_head(head, tiny_target_dir), "malformed", "'2,2,1' is not a list of integers")


def test_target_without_decoder_fields(head, tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(UsageError, match="no integer vocab_size, hidden_size, num_hidden_layers"):
        pf.check_head(head, tmp_path / "t")


def test_engine_in_its_own_virtualenv(tmp_path):
    """--engine-python: the engine is looked up in that interpreter's environment, and the command
    runs it (SGLang pins its own transformers, so it usually lives in a separate venv)."""
    import sys

    from eagle3cli.serve.commands import SpecNumbers, build_command

    (p,) = machine.check_engine_installed("sglang", str(tmp_path / "missing" / "python"))
    assert "does not exist" in p.what
    # this interpreter has no vllm: the probe runs in it and says so
    if importlib.util.find_spec("vllm") is None:
        (p,) = machine.check_engine_installed("vllm", sys.executable)
        assert f"environment of {sys.executable}" in p.what
    spec = SpecNumbers(3, 1, 4, "flags")
    argv = build_command("sglang", "T", "H", spec, "127.0.0.1", 30000, (), "/opt/sglang/bin/python")
    assert argv[:3] == ["/opt/sglang/bin/python", "-m", "sglang.launch_server"]
    argv = build_command("vllm", "T", "H", spec, "127.0.0.1", 30000, (), "/opt/vllm/bin/python")
    assert argv[:3] == ["/opt/vllm/bin/vllm", "serve", "T"]
