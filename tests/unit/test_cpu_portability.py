"""Every CPU path works on an AVX2-only CPU: instruction sets read from /proc/cpuinfo (or hidden
by EAGLE3_CPU_FEATURES=avx2), --cpu-kernels auto picking a kernel the CPU runs and saying so,
an explicit onednn the CPU cannot run for bf16 refused with exit 2 (never oneDNN's traceback)."""

from __future__ import annotations

import json

import pytest
import torch
from head_fixtures import make_head

from eagle3cli.cli import main
from eagle3cli.errors import UsageError
from eagle3cli.model import cpu_kernels
from eagle3cli.model.cpu_kernels import choose_cpu_kernels, onednn_cannot_run, onednn_linear_available
from eagle3cli.node import cpu_features

AVX512 = frozenset("sse4_2 avx avx2 fma avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512_vnni".split())
EPYC_ZEN2 = frozenset("sse4_2 avx avx2 fma f16c avx_vnni".split())  # AVX2 only: no AVX-512


@pytest.fixture
def cpu(monkeypatch):
    """Pretend to be a given CPU: set its /proc/cpuinfo flags."""

    def use(flags: frozenset[str]) -> None:
        monkeypatch.setattr(cpu_features, "_proc_flags", lambda: flags)

    return use


def test_flags_and_the_forcing_variable(cpu, monkeypatch):
    cpu(AVX512)
    monkeypatch.delenv(cpu_features.FORCE_ENV, raising=False)
    assert cpu_features.onednn_bf16_missing() == []
    assert "AVX-512 (f, bw, vl, dq)" in cpu_features.describe() and "no AVX-NE-CONVERT" in cpu_features.describe()
    monkeypatch.setenv(cpu_features.FORCE_ENV, "avx2")
    assert cpu_features.cpu_flags() == {"sse4_2", "avx", "avx2", "fma"}
    assert cpu_features.onednn_bf16_missing() == ["avx512bw", "avx512vl", "avx512dq"]
    assert "EAGLE3_CPU_FEATURES=avx2" in cpu_features.describe()
    monkeypatch.setenv(cpu_features.FORCE_ENV, "avx9")
    with pytest.raises(UsageError, match="avx9.*is not a CPU level") as e:
        cpu_features.cpu_flags()
    assert "native, avx2" in e.value.render()
    cpu(EPYC_ZEN2)
    monkeypatch.setenv(cpu_features.FORCE_ENV, "native")
    assert cpu_features.onednn_bf16_missing() == ["avx512bw", "avx512vl", "avx512dq"]
    assert cpu_features.onednn_bf16_missing({"avx_ne_convert"}) == []  # Intel's AVX-NE-CONVERT suffices


@pytest.mark.skipif(not onednn_linear_available(), reason="this torch build has no oneDNN")
def test_kernel_choice_follows_the_cpu(cpu, monkeypatch):
    monkeypatch.delenv(cpu_features.FORCE_ENV, raising=False)
    cpu(EPYC_ZEN2)
    # fp32: oneDNN runs on any x86-64 CPU
    assert choose_cpu_kernels("auto", "cpu", torch.float32).kernels == "onednn"
    assert choose_cpu_kernels("onednn", "cpu", torch.float32).kernels == "onednn"
    # bf16 without AVX-512: auto takes F.linear and says why; an explicit onednn is exit 2
    auto = choose_cpu_kernels("auto", "cpu", torch.bfloat16)
    assert auto.kernels == "torch" and "avx512bw + avx512vl + avx512dq" in auto.why
    with pytest.raises(UsageError) as e:
        choose_cpu_kernels("onednn", "cpu", torch.bfloat16)
    msg = e.value.render()
    assert "avx512bw + avx512vl + avx512dq" in msg and "next: rerun with --cpu-kernels torch" in msg
    assert choose_cpu_kernels("torch", "cpu", torch.bfloat16).kernels == "torch"
    assert not cpu_kernels.packable(torch.zeros(1024, 1024, dtype=torch.bfloat16))  # never packed either
    assert cpu_kernels.packable(torch.zeros(1024, 1024))
    cpu(AVX512)
    if cpu_kernels._bf16_probe() is None:  # this machine runs it
        assert choose_cpu_kernels("auto", "cpu", torch.bfloat16).kernels == "onednn"
    assert choose_cpu_kernels("onednn", "cuda", torch.bfloat16).why == "device default (not CPU)"


@pytest.fixture(scope="module")
def head(tiny_target_dir, tmp_path_factory):
    return make_head(tiny_target_dir, tmp_path_factory.mktemp("portable") / "run" / "head")


@pytest.fixture
def avx2_only(monkeypatch):
    monkeypatch.setenv(cpu_features.FORCE_ENV, "avx2")
    assert onednn_cannot_run(torch.bfloat16)


def test_eval_bf16_on_an_avx2_cpu_runs_on_f_linear_or_exits_2(tiny_target_dir, head, tmp_path, capsys, avx2_only):
    args = ["eval", "--target", str(tiny_target_dir), "--head", str(head), "--bench", "gsm8k", "--num-prompts", "1"]
    args += ["--max-new-tokens", "6", "--depth", "2", "--dtype", "bf16", "--no-generate-baseline"]
    refused = tmp_path / "refused"
    assert main([*args, "--cpu-kernels", "onednn", "--out", str(refused)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "error:" in err and "avx512bw + avx512vl + avx512dq" in err and "next: rerun with --cpu-kernels torch" in err
    assert "Traceback" not in err and not refused.exists()  # refused before anything is written
    out = tmp_path / "eval"
    assert main([*args, "--out", str(out)]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert err.count("eval: CPU matmuls on torch F.linear (--cpu-kernels auto: oneDNN's bf16 linear needs") == 1
    assert json.loads((out / "report.json").read_text())["kernels"].startswith("torch")
    assert json.loads((out / "manifest.json").read_text())["config"]["cpu_kernels"] == "torch"


def test_gen_data_bf16_on_an_avx2_cpu_runs_on_f_linear_or_exits_2(tiny_target_dir, tmp_path, capsys, avx2_only):
    args = ["gen-data", "--target", str(tiny_target_dir), "--input", "gsm8k", "--num-samples", "2"]
    args += ["--max-new-tokens", "4", "--dtype", "bf16"]
    assert main([*args, "--cpu-kernels", "onednn", "--out", str(tmp_path / "refused")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "error:" in err and "avx512bw" in err and "next: rerun with --cpu-kernels torch" in err
    assert "Traceback" not in err
    assert main([*args, "--out", str(tmp_path / "data")]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "gen-data: target matmuls on torch F.linear (--cpu-kernels auto" in err
    assert (tmp_path / "data" / "manifest.json").is_file()


def test_doctor_reports_instruction_sets_and_what_each_fast_path_needs(monkeypatch, avx2_only):
    from eagle3cli import doctor

    rows = {c.name: c for c in doctor.check_cpu_features()}
    assert "AVX2" in rows["cpu instruction sets"].detail and "no AVX-512" in rows["cpu instruction sets"].detail
    bf16 = rows["oneDNN bf16"]
    assert not bf16.ok and not bf16.required and "avx512bw" in bf16.detail and "F.linear" in bf16.detail
    assert "GGML_NATIVE" in rows["llama.cpp"].detail
    assert "avx512f" not in __import__("eagle3cli.serve.machine", fromlist=["x"]).cpu_flags()


def test_doctor_does_not_import_sglangs_parser_unless_asked(monkeypatch):
    """Importing sglang.srt.server_args took 32 s: the first command the README runs must not."""
    from eagle3cli import doctor

    monkeypatch.setattr(doctor, "_version", lambda pkg: "0.5.0")
    imported = []
    monkeypatch.setattr(doctor.importlib, "import_module", lambda name: imported.append(name))
    monkeypatch.setattr(doctor.importlib.util, "find_spec", lambda name: object())
    row = doctor.check_sglang()
    assert row.ok and "--check-sglang" in row.detail and imported == []
    assert doctor.check_sglang(import_parser=True).ok and imported == ["sglang.srt.server_args"]


def test_ci_runs_the_fast_tier_as_on_an_avx2_cpu():
    """`make test` hides AVX-512 (so CI on an AVX-512 machine proves AVX2 machines), test-all runs
    the native fast paths, and CI runs both."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    make = (root / "Makefile").read_text()
    recipe = {t: make.split(f"\n{t}:", 1)[1].split("\n\n", 1)[0] for t in ("test", "test-all")}
    assert "EAGLE3_CPU_FEATURES=avx2" in recipe["test"] and '-m "not slow"' in recipe["test"]
    assert "EAGLE3_CPU_FEATURES" not in recipe["test-all"]
    ci = [ln.strip() for ln in (root / ".ci" / "run").read_text().splitlines()]
    assert "make test-all" in ci and "make test" in ci and "make demo" in ci
