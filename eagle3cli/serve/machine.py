"""Checks of the machine before a launch: the engine installed (here or in --engine-python's
environment), a CUDA device (or, for vLLM's CPU build, what it was measured to run here), a free
port. Each returns the problems it found."""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..engines.local_engine import VLLM_CPU_VENV, free_port, vllm_python

if TYPE_CHECKING:
    from ..head.check import Problem

__all__ = ["VLLM_CPU_VENV", "free_port"]  # re-exported: serve's callers and tests import them from here

INSTALL = {
    "sglang": 'pip install "sglang>=0.5,<0.6"   (on a CUDA node; or: pip install "eagle3cli[serve]")',
    "vllm": 'pip install "vllm>=0.10"   (on a CUDA node; or: pip install "eagle3cli[vllm]"; '
    "on CPU: make vllm-cpu, then --engine-python .venv-vllm/bin/python)",
}


def default_engine_python(engine: str) -> str | None:
    """vLLM not importable here: the python of `make vllm-cpu`'s venv, in the working directory or
    beside the eagle3cli checkout. None when there is none (then this environment is used)."""
    if engine != "vllm" or importlib.util.find_spec("vllm") is not None:
        return None
    return vllm_python()


@dataclass(frozen=True)
class VllmBuild:
    version: str
    cpu: bool  # the `vllm-cpu` distribution (serves on CPU; no CUDA needed)


_PROBE = """
import json, importlib.metadata as m
def v(n):
    try: return m.version(n)
    except m.PackageNotFoundError: return None
print(json.dumps({"vllm": v("vllm"), "vllm-cpu": v("vllm-cpu")}))
"""


def vllm_build(python: str | None) -> VllmBuild | None:
    """Which vLLM the engine's environment holds (package metadata only: importing vllm takes seconds)."""
    import sys

    try:
        r = subprocess.run([python or sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60)
        found = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {}
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
    if found.get("vllm-cpu"):
        return VllmBuild(found["vllm-cpu"], True)
    if found.get("vllm"):
        return VllmBuild(found["vllm"], False)
    return None


def cpu_flags() -> set[str]:
    """The CPU's flags (EAGLE3_CPU_FEATURES=avx2 hides AVX-512: see eagle3cli/node/cpu_features.py)."""
    from ..node.cpu_features import cpu_flags as flags

    return flags()


def served_dtype(extra_args: list[str]) -> str:
    """The dtype vLLM serves in, by vLLM's name: `--dtype` after `--`, else bfloat16 (the CPU build
    serves an fp32 checkpoint in bfloat16 unless told otherwise)."""
    given = "auto"
    for i, a in enumerate(extra_args):
        if a == "--dtype" and i + 1 < len(extra_args):
            given = extra_args[i + 1]
        elif a.startswith("--dtype="):
            given = a.split("=", 1)[1]
    names = {"float32": "float32", "float": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16"}
    return names.get(given, "bfloat16" if given == "auto" else given)


def check_vllm_cpu(python: str, version: str, dtype: str) -> list[Problem]:
    """What vllm-cpu was measured not to run on this machine (engines/vllm_probe.py: tried once per
    machine and kept in the venv), refused by name; nothing else is refused."""
    from ..console import log
    from ..engines.vllm_probe import probe, refusals
    from ..head.check import error  # lazily: the head check loads torch, and `eagle3 doctor` asks this too
    from ..node.cpu_features import native_flags

    result = probe(
        python,
        f"vllm-cpu=={version}",
        native_flags(),
        on_start=lambda: log("vllm-cpu: trying it once on this machine (float32, bfloat16; a few minutes, kept)"),
    )
    return [error(what, fix) for what, fix in refusals(result, dtype)]


def check_engine_installed(engine: str, python: str | None = None) -> list[Problem]:
    """The engine importable here, or in the environment of `python` (--engine-python)."""
    from ..head.check import error

    module = {"sglang": "sglang", "vllm": "vllm"}[engine]
    if python is not None:
        if not shutil.which(python) and not Path(python).is_file():
            return [error(f"--engine-python {python} does not exist", "the python of the engine's virtualenv")]
        probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
        if subprocess.run([python, "-c", probe], capture_output=True, timeout=120).returncode != 0:
            return [error(f"{engine} is not installed in the environment of {python}", INSTALL[engine])]
        return []
    if importlib.util.find_spec(module) is None and not (engine == "vllm" and shutil.which("vllm")):
        return [error(f"{engine} is not installed in this environment", INSTALL[engine])]
    return []


def check_gpu(engine: str) -> list[Problem]:
    import torch

    from ..head.check import error

    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        return [
            error(
                f"no CUDA device: {engine} serves on GPUs only (torch {torch.__version__} sees none)",
                "run on a GPU node, or add --dry-run to print and validate the command here",
            )
        ]
    return []


def check_port(host: str, port: int) -> list[Problem]:
    """The engine binds host:port; find out now rather than after minutes of weight loading."""
    from ..head.check import error

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        return [error(f"--host {host} does not resolve ({e})", "--host 127.0.0.1 (local) or 0.0.0.0 (all interfaces)")]
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind(addr)
        except OSError as e:
            return [error(f"port {port} on {host} is not free ({e.strerror})", f"--port {free_port(host)}")]
    return []
