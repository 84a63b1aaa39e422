"""Issue 52 (reliability round 5): a user's folder never overwritten by export or serve-bench, crafted
caches and manifests refused by one validating reader, the openai backend's permanent errors and odd
replies, absurd trees, user text in console markup, numbers in flags and variables, and llama.cpp's
build fallback on CPUs that advertise AMX they cannot run."""

from __future__ import annotations

import fcntl
import json
import os

import pytest
from head_fixtures import make_head

from eagle3cli.cli import main
from eagle3cli.manifest import write_manifest


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # rich would wrap long paths inside the messages we check


def err(capsys) -> str:
    cap = capsys.readouterr()
    text = " ".join((cap.out + cap.err).split())
    assert "Traceback" not in text
    return text


def snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def head(tmp_path_factory, tiny_target_dir):
    return make_head(tiny_target_dir, tmp_path_factory.mktemp("r5-head") / "head")


# ---------------------------------------------------------------- 1. nothing a user made is overwritten
@pytest.mark.parametrize("fmt", ["sglang", "vllm", "speculators"])
def test_export_refuses_a_users_head_folder(tmp_path, head, capsys, fmt):
    mine = tmp_path / "my-head"
    mine.mkdir()
    (mine / "config.json").write_text('{"my": "notes about this head"}\n')
    (mine / "model.safetensors").write_bytes(b"my weights")
    before = snapshot(mine)
    assert main(["export", "--head", str(head), "--format", fmt, "--out", str(mine)]) == 2
    text = err(capsys)
    assert "no manifest of `eagle3 export`" in text and "config.json" in text and "NEW_FOLDER" in text
    assert snapshot(mine) == before


def test_export_killed_before_its_manifest_is_still_its_own(tmp_path, head, capsys, monkeypatch):
    import eagle3cli.export.run as export_run

    out = tmp_path / "exp"

    def killed(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(export_run, "write_manifest", killed)
    with pytest.raises(KeyboardInterrupt):
        export_run.export_head(head, "sglang", out)
    assert (out / "config.json").exists() and not (out / "manifest.json").exists()
    monkeypatch.undo()
    assert main(["export", "--head", str(head), "--format", "sglang", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "manifest.json", "model.safetensors"]
    capsys.readouterr()


def test_export_gguf_refuses_a_users_folder(tmp_path, head, capsys, monkeypatch):
    import eagle3cli.gguf_export as ge

    monkeypatch.setattr(ge, "head_for_llama_cpp", lambda *a: None)  # no llama.cpp source needed to refuse
    monkeypatch.setattr(ge, "converter_source", lambda: tmp_path)
    mine = tmp_path / "gg"
    mine.mkdir()
    (mine / "head.gguf").write_bytes(b"my own conversion")
    assert main(["export", "--head", str(head), "--format", "gguf", "--out", str(mine)]) == 2
    assert "no manifest of `eagle3 export`" in err(capsys)
    assert (mine / "head.gguf").read_bytes() == b"my own conversion"


BENCH = ["serve-bench", "--spec-url", "http://127.0.0.1:9", "--api", "openai", "--concurrency", "1"]


def test_serve_bench_refuses_another_bench_a_users_file_and_a_second_writer(tmp_path, capsys):
    out = tmp_path / "bench"
    out.mkdir()
    (out / "bench.json").write_text('{"levels": "from another server"}')
    cfg = {"spec_url": "http://other-server:30000", "api": "openai", "concurrency": [1], "out": str(out)}
    write_manifest(out, "serve-bench", config=cfg)
    before = snapshot(out)
    assert main([*BENCH, "--out", str(out)]) == 2
    text = err(capsys)
    assert "other settings" in text and "spec-url" in text and "--overwrite" in text
    assert snapshot(out) == before
    # a bench.json of the user's own, no manifest: refused
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "bench.json").write_text("my numbers")
    assert main([*BENCH, "--out", str(mine)]) == 2
    assert "no manifest of `eagle3 serve-bench`" in err(capsys)
    assert (mine / "bench.json").read_text() == "my numbers"
    # a bench running on the folder holds its lock: a second one is refused before it sends anything
    busy = tmp_path / "busy"
    busy.mkdir()
    fd = os.open(busy / ".lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, json.dumps({"pid": 1, "host": "h", "stage": "serve-bench", "since": "now"}).encode())
        assert main([*BENCH, "--out", str(busy)]) == 2
        assert "being written by another eagle3 serve-bench" in err(capsys)
    finally:
        os.close(fd)
