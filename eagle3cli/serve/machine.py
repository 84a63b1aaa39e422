"""Checks of the machine before a launch: the engine installed (here or in --engine-python's
environment), a CUDA device, a free port. Each returns the problems it found."""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
from pathlib import Path

from .problems import Problem, error

INSTALL = {
    "sglang": 'pip install "sglang>=0.5,<0.6"   (on a CUDA node; or: pip install "eagle3cli[serve]")',
    "vllm": 'pip install "vllm>=0.10"   (on a CUDA node; or: pip install "eagle3cli[vllm]")',
}


def check_engine_installed(engine: str, python: str | None = None) -> list[Problem]:
    """The engine importable here, or in the environment of `python` (--engine-python)."""
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


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host if host not in ("0.0.0.0", "") else "127.0.0.1", 0))
        return int(s.getsockname()[1])
