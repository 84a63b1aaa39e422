"""Run-folder contract and typed configs."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from eagle3cli.config import build_config
from eagle3cli.errors import StageError, UsageError
from eagle3cli.run_folder.manifest import (
    atomic_write,
    atomic_write_json,
    check_matches,
    read_manifest,
    remove_dead_temps,
    shard_record,
    verify_shards,
    write_manifest,
)


def test_atomic_write_leaves_no_temp_files(tmp_path):
    atomic_write_json(tmp_path / "a.json", {"x": 1})
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_a_failed_atomic_write_keeps_the_old_file_and_no_temp(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"old")

    def half_then_fail(tmp: Path) -> None:
        tmp.write_bytes(b"ne")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        atomic_write(tmp_path / "a.bin", half_then_fail)
    assert [p.name for p in tmp_path.iterdir()] == ["a.bin"] and (tmp_path / "a.bin").read_bytes() == b"old"


def test_only_temps_of_dead_processes_on_this_host_are_removed(tmp_path):
    import socket
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = socket.gethostname()
    names = {
        "dead": f".shard-00001.safetensors.{host}.{int(dead.stdout)}.ab_cd.tmp",
        "alive": f".shard-00002.safetensors.{host}.{os.getpid()}.x1y2.tmp",
        "other host": f".shard-00003.safetensors.node-elsewhere.{int(dead.stdout)}.q.tmp",
    }
    for n in names.values():
        (tmp_path / n).write_bytes(b"partial")
    remove_dead_temps(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([names["alive"], names["other host"]])


def test_verify_shards_detects_corruption_and_missing(tmp_path):
    p = tmp_path / "shard-0.bin"
    p.write_bytes(b"abcdef")
    rec = shard_record(p, records=3)
    assert verify_shards(tmp_path, [rec]) == []
    p.write_bytes(b"abcdeX")
    assert "checksum mismatch" in verify_shards(tmp_path, [rec])[0]
    p.write_bytes(b"abc")
    assert "bytes" in verify_shards(tmp_path, [rec])[0]
    p.unlink()
    assert "missing" in verify_shards(tmp_path, [rec])[0]


def test_read_manifest_errors_name_the_command(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        read_manifest(tmp_path / "nope", "cache", "eagle3 cache --run runs/x")
    (tmp_path / "d").mkdir()
    with pytest.raises(UsageError) as e:
        read_manifest(tmp_path / "d", "cache", "eagle3 cache --run runs/x")
    assert e.value.next_step == "eagle3 cache --run runs/x"
    write_manifest(tmp_path / "d", "gen-data", counts={}, shards=[])
    with pytest.raises(UsageError, match="written by stage 'gen-data'"):
        read_manifest(tmp_path / "d", "cache", "eagle3 cache")
    assert read_manifest(tmp_path / "d", "gen-data", "x")["versions"]["torch"]


def test_check_matches_lists_every_difference():
    with pytest.raises(StageError) as e:
        check_matches("cache", {"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 5, "c": 4}, "eagle3 cache")
    assert "b: cache has 2, expected 5" in str(e.value) and "c:" in str(e.value)
    check_matches("cache", {"a": 1}, {"a": 1, "z": None}, "x")


@dataclass(frozen=True)
class _Cfg:
    run: Path = Path("runs/x")
    depth: int = 8
    layers: tuple[int, ...] = (2, 6, 9)

    def validate(self) -> list[str]:
        return [f"--depth must be >= 1, got {self.depth}"] if not isinstance(self.depth, int) or self.depth < 1 else []


def test_build_config_recipe_then_flags(tmp_path):
    r = tmp_path / "r.yaml"
    r.write_text("eval:\n  depth: 5\n  layers: 1,2,3\n")
    cfg = build_config(_Cfg, r, "eval", depth=None)
    assert cfg.depth == 5 and cfg.layers == (1, 2, 3)
    assert build_config(_Cfg, r, "eval", depth=7).depth == 7


def test_build_config_unknown_key_and_validation(tmp_path):
    r = tmp_path / "r.yaml"
    r.write_text("depht: 5\n")
    with pytest.raises(UsageError, match="unknown key"):
        build_config(_Cfg, r, "eval")
    with pytest.raises(UsageError, match="--depth must be >= 1"):
        build_config(_Cfg, None, "eval", depth=0)
    with pytest.raises(UsageError, match="does not exist"):
        build_config(_Cfg, tmp_path / "missing.yaml", "eval")


def test_every_manifest_names_the_machine_its_timings_were_measured_on(tmp_path):
    """CPU seconds compare only on one machine (the recipe levers' equal-CPU arms): each stage's manifest
    records the CPU's model and logical CPUs."""
    import os

    write_manifest(tmp_path, "gen-data", counts={}, shards=[])
    m = read_manifest(tmp_path, "gen-data", "x")["machine"]
    assert m["logical_cpus"] == os.cpu_count() and isinstance(m["cpu"], str) and m["cpu"]
