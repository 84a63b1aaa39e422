"""tools/gpu_check.py, the GPU smoke check: its CPU subset passes here (slow), its hooks and refusals
(fast), and on a CUDA machine (`gpu`) the whole chain on the tiny target, step by step, plus
DeepSpeed ZeRO-2/3 over two GPUs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "gpu_check.py"
CPU_STEPS = [
    "doctor",
    "gen-data",
    "cache-bf16",
    "train-kill-9",
    "train-resume-fewer-gpus",
    "eval-greedy",
    "cache-two-shards",
]
GPU_STEPS = [
    "doctor", "gen-data", "cache-bf16", "cache-fp8", "cache-compact", "train-kill-9", "train-resume-fewer-gpus",
    "train-online", "train-compile", "eval-greedy", "eval-sampled", "cache-two-shards",
]  # fmt: skip


def with_engine(steps: list[str]) -> list[str]:
    """`steps` with the engine route's step after the caches where a vLLM is found (the script adds it there)."""
    from eagle3cli.engines.local_engine import vllm_python

    i = steps.index("train-kill-9")
    return [*steps[:i], "cache-engine-vllm", *steps[i:]] if vllm_python() else list(steps)


def gpu_check(*args, timeout=1500) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


def test_steps_listed_and_extra_steps_appended(tmp_path):
    r = gpu_check(
        "--device", "cpu", "--work", tmp_path, "--list", "--extra-step", "capture={python} -c pass --device {device}"
    )
    assert r.returncode == 0, r.stderr
    names = [line[:-1] for line in r.stdout.splitlines() if not line.startswith(" ")]
    assert names == [*with_engine(CPU_STEPS), "capture"]
    assert f"{sys.executable} -c pass --device cpu" in r.stdout
    full = gpu_check("--device", "cpu", "--work", tmp_path, "--list", "--full")
    assert [line[:-1] for line in full.stdout.splitlines() if not line.startswith(" ")] == with_engine(GPU_STEPS)


@pytest.mark.parametrize(
    "args,said",
    [(["--only", "nonsense"], "no such step"), (["--extra-step", "no-equals-sign"], "expected NAME=COMMAND")],
)
def test_bad_arguments_are_refused(tmp_path, args, said):
    r = gpu_check("--device", "cpu", "--work", tmp_path, *args)
    assert r.returncode != 0 and said in r.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU machine's refusal")
def test_cuda_without_a_gpu_exits_2(tmp_path):
    r = gpu_check("--device", "cuda", "--work", tmp_path)
    assert r.returncode == 2 and "sees no CUDA device" in r.stderr


@pytest.mark.slow
def test_cpu_subset_passes(tmp_path):
    """The dry run on CPU: every step of the CPU subset passes and the JSON records each one."""
    out = tmp_path / "cpu.json"
    r = gpu_check("--device", "cpu", "--work", tmp_path / "work", "--out", out)
    report = json.loads(out.read_text())
    assert r.returncode == 0 and report["passed"], [s for s in report["steps"] if not s["passed"]]
    assert [s["name"] for s in report["steps"]] == with_engine(CPU_STEPS)
    for s in report["steps"]:
        assert set(s) >= {"name", "command", "rc", "seconds", "passed"} and s["seconds"] > 0
    (kill,) = [s for s in report["steps"] if s["name"] == "train-kill-9"]
    (resume,) = [s for s in report["steps"] if s["name"] == "train-resume-fewer-gpus"]
    assert kill["rc"] == [-9] and resume["rc"] == [0]
    assert report["device"] == "cpu" and report["subset"] == "cpu"


@pytest.fixture(scope="module")
def gpu_report(tmp_path_factory):
    work = tmp_path_factory.mktemp("gpu-check")
    gpu_check("--device", "cuda", "--work", work / "runs", "--out", work / "gpu.json", timeout=3000)
    return json.loads((work / "gpu.json").read_text())


@pytest.mark.gpu
@pytest.mark.parametrize("step", GPU_STEPS)
def test_gpu_chain_step(gpu_report, step):
    """Each step of the chain on a GPU: cache in every storage, train killed and resumed under fewer
    visible GPUs, online and --compile, eval greedy and sampled, two cache shards."""
    (found,) = [s for s in gpu_report["steps"] if s["name"] == step]
    assert found["passed"], found


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("stage", ["zero2", "zero3"])
def test_deepspeed_on_two_gpus(tmp_path, tiny_target_dir, stage):
    """DeepSpeed over two GPUs in bf16 (where they support it): the run ends with an exported head."""
    sys.path.insert(0, str(REPO / "tests"))
    from train_fixtures import eagle3, make_run

    run = make_run(tmp_path / "run", tiny_target_dir, n=24)
    r = eagle3("train", "--run", run, "--deepspeed", stage, "--nproc", "2", "--device", "cuda", "--token-budget", "640",
               "--max-length", "160", "--max-steps", "4", "--save-every", "2", "--log-every", "2", timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert (run / "head" / "model.safetensors").is_file()
