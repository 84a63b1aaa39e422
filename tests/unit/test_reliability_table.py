"""Issue 35: a table of bad targets, heads, devices and inputs walked through every stage that reads
them. Each ends in exit 2 with `error:` and `next:`, never a traceback, and writes no output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from cli_helpers import err, wide_console  # noqa: F401  (wide_console: autouse here)
from head_fixtures import make_head
from http_fixtures import gzip_bomb

from eagle3cli.cli import main


def _edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


TARGET_CASES = {
    "heads-0": lambda d: _edit_json(d / "config.json", num_attention_heads=0),
    "vocab-negative": lambda d: _edit_json(d / "config.json", vocab_size=-1),
    "hidden-1e12": lambda d: _edit_json(d / "config.json", hidden_size=1e12),
    "eps-not-a-number": lambda d: _edit_json(d / "config.json", rms_norm_eps="abc"),
    "layers-0": lambda d: _edit_json(d / "config.json", num_hidden_layers=0),
    "heads-not-dividing": lambda d: _edit_json(d / "config.json", num_attention_heads=3, head_dim=None),
    "auto-map-config": lambda d: _edit_json(d / "config.json", auto_map={"AutoModelForCausalLM": "m.Evil"}),
    "auto-map-tokenizer": lambda d: _edit_json(d / "tokenizer_config.json", auto_map={"AutoTokenizer": ["t.Evil"]}),
    "tokenizer-truncated": lambda d: (d / "tokenizer.json").write_bytes((d / "tokenizer.json").read_bytes()[:500]),
    "config-not-json": lambda d: (d / "config.json").write_text('{"hidden_size": 64,'),
}


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_target_dir):
    """A good data folder and head for the tiny target, and one bad copy of the target per case."""
    root = tmp_path_factory.mktemp("table")
    data = root / "data"
    args = ["gen-data", "--target", str(tiny_target_dir), "--no-regenerate", "--input", "gsm8k"]
    assert main([*args, "--num-samples", "2", "--out", str(data)]) == 0
    head = make_head(tiny_target_dir, root / "head")
    targets = {}
    for name, spoil in TARGET_CASES.items():
        d = root / "targets" / name
        shutil.copytree(tiny_target_dir, d)
        spoil(d)
        targets[name] = d
    return {"root": root, "data": data, "head": head, "targets": targets, "good": tiny_target_dir}


def stage_args(stage: str, world: dict, out: Path, target: Path | None = None, head: Path | None = None) -> list[str]:
    t = str(target or world["good"])
    if stage == "gen-data":
        return [
            "gen-data",
            "--target",
            t,
            "--no-regenerate",
            "--input",
            "gsm8k",
            "--num-samples",
            "2",
            "--out",
            str(out),
        ]
    if stage == "cache":
        return ["cache", "--data", str(world["data"]), "--target", t, "--out", str(out)]
    if stage == "train":
        return ["train", "--online", "--run", str(out), "--data", str(world["data"]), "--target", t, "--max-steps", "1"]
    if stage == "eval":
        h = str(head or world["head"])
        return ["eval", "--head", h, "--target", t, "--bench", "mt_bench", "--num-prompts", "1", "--out", str(out)]
    raise AssertionError(stage)


def refused(capsys, out: Path, args: list[str]) -> str:
    rc = main(args)
    text = err(capsys)  # asserts no traceback
    assert rc == 2, (args, text[-800:])
    assert "error:" in text and "next:" in text, text[-800:]
    assert not out.exists() or not any(p.name != ".lock" for p in out.rglob("*")), sorted(out.rglob("*"))
    return text


STAGES = ["gen-data", "cache", "train", "eval"]


@pytest.mark.parametrize("case", sorted(TARGET_CASES))
@pytest.mark.parametrize("stage", STAGES)
def test_a_bad_target_is_refused_by_every_stage(world, capsys, stage, case, tmp_path):
    target = world["targets"][case]
    text = refused(capsys, tmp_path / "out", stage_args(stage, world, tmp_path / "out", target=target))
    assert str(target) in text  # the message names the folder or file
    if case.startswith("auto-map"):
        assert "never runs code from a model repository" in text
    elif case.startswith("tokenizer"):
        assert "tokenizer.json" in text
    elif case != "config-not-json":
        key = {"heads-0": "num_attention_heads = 0", "vocab-negative": "vocab_size = -1"}.get(case)
        assert key is None or key in text


def _spoil_head(head: Path, dest: Path, case: str) -> Path:
    shutil.copytree(head, dest)
    if case == "int32-weights":
        from safetensors.torch import load_file, save_file

        t = load_file(str(dest / "model.safetensors"))
        t = {k: (v.to(torch.int32) if v.is_floating_point() else v) for k, v in t.items()}
        save_file(t, str(dest / "model.safetensors"))
    else:
        change = {"heads-0": {"num_attention_heads": 0}, "vocab-negative": {"vocab_size": -5}}.get(case)
        _edit_json(dest / "config.json", **(change or {"rms_norm_eps": "abc"}))
    return dest


@pytest.mark.parametrize("case", ["heads-0", "vocab-negative", "eps-not-a-number", "int32-weights"])
def test_a_bad_head_is_refused_by_eval(world, capsys, case, tmp_path):
    head = _spoil_head(world["head"], tmp_path / "head", case)
    text = refused(capsys, tmp_path / "out", stage_args("eval", world, tmp_path / "out", head=head))
    assert str(head) in text


DEVICES = ["cuda:7", "mps", "banana", "cpu:0"] + ([] if torch.cuda.is_available() else ["cuda"])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("stage", STAGES)
def test_a_device_this_machine_lacks_is_refused_before_any_model_loads(world, capsys, stage, device, tmp_path):
    text = refused(capsys, tmp_path / "out", [*stage_args(stage, world, tmp_path / "out"), "--device", device])
    assert f"--device {device}" in text and "expected: one of: auto, cpu" in text


@pytest.mark.parametrize("kind", ["device", "gzip-bomb"])
@pytest.mark.parametrize("stage", ["gen-data", "eval", "serve-bench"])
def test_an_unbounded_input_is_refused_by_every_stage_that_reads_inputs(
    world, capsys, monkeypatch, stage, kind, tmp_path
):
    if kind == "device":
        src = "/dev/zero"
    else:
        src = str(tmp_path / "bomb.jsonl.gz")
        Path(src).write_bytes(gzip_bomb(1))
        monkeypatch.setenv("EAGLE3_MAX_INPUT_BYTES", str(32 << 20))
    out = tmp_path / "out"
    if stage == "gen-data":
        args = ["gen-data", "--target", str(world["good"]), "--no-regenerate", "--input", src, "--out", str(out)]
        flag = "--input"
    elif stage == "eval":
        args = [*stage_args("eval", world, out)[:-4], "--bench", src, "--out", str(out)]
        flag = "--bench"
    else:
        args = [
            "serve-bench",
            "--spec-url",
            "http://127.0.0.1:9",
            "--api",
            "openai",
            "--prompts",
            src,
            "--out",
            str(out),
        ]
        flag = "--prompts"
    text = refused(capsys, out, args)
    assert f"{flag} {src}" in text
    assert ("is a device" if kind == "device" else "decompresses to more than 32.0 MiB") in text
