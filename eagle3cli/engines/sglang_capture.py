"""The target's hidden states from an SGLang server (`python -m sglang.launch_server`, GPUs with
`--tp-size N`), for `eagle3 cache --engine sglang`. What SGLang 0.5.23 returns, read from its code
(paths under `sglang/srt/`):

- A request with `"return_hidden_states": true` gets them in `meta_info["hidden_states"]`
  (`managers/tokenizer_manager.py:2598-2601`, the request's list: `scheduler_components/output_streamer.py:661-672`); the server must allow it (`--enable-return-hidden-states`,
  `arg_groups/serving_hook.py:712-730`). Prefill appends the prompt's rows as ONE element, a [T][W]
  list (`managers/scheduler_components/batch_result_processor.py:658-659`); each decode step would
  extend the list by single rows (`:699-701`); `max_new_tokens=1` ends the request at its prefill, so
  the answer is `[[T rows]]`, prompt positions only. `/health` answers 503 until the server is up
  (`entrypoints/http_server.py:735-736`). Radix (prefix) caching would prefill only a
  prompt's uncached suffix, and chunked prefill splits it: both are switched off.
- Without aux capture a row is the last decoder layer's output AFTER the final norm: Llama, Qwen and
  DeepSeek-V2 models apply the norm before the logits processor (`models/llama.py:498-500`), which
  stores a pre-norm state only where a model hands one over (`layers/logits_processor.py:899-902`).
- With `--enable-return-aux-hidden-states --speculative-algorithm EAGLE3` (capture only, no draft:
  `arg_groups/validation_hook.py:697-753`) a row is the aux states concatenated in layer order
  (`layers/aux_hidden_states.py:97-102`), `[T, n*H]`, *in place of* the final state; the final one
  is kept for in-process use only, "not copied into the response path" (`logits_processor.py:230-235`).
  No id captures the last layer's output (`logits_processor.py:928-929`). So a cache takes two
  passes, one server each: the final states (`mode="final"`), then the aux states (`mode="aux"`).
- Ids: `--return-aux-hidden-state-layer-ids` go to `set_eagle3_layers_to_capture`
  (`model_executor/model_runner_components/spec_aux_hidden_state.py:99-106`,
  `attention_backend_setup.py:61`): +1 on Llama/Qwen (`models/llama.py:941`), on the DeepSeek-V2
  family only when the first id is 1 (`models/deepseek_v2.py:3468-3473`) = `speculate.aux_layers.sglang_ids`;
  ids may not repeat (`validation_hook.py:743`), so repeated eagle3 ids are sent once and copied here.

What the code leaves open is checked on every answer: the rows must be T (`meta_info.prompt_tokens`
too) by layers x hidden, and the final states must give SGLang's own greedy next token through the
target's lm_head (a pre-norm or shifted state does not). A wrong answer exits 2, a server lost
mid-cache exits 3 (the same command resumes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from ..errors import StageError, UsageError
from ..head.engines import sglang_first_id_rule
from ..speculate.aux_layers import sglang_id_problems, sglang_ids
from .capture_common import HF_ROUTE, bad_answer, died
from .engine_api import Unreachable, hidden_states_body, run_sync
from .local_engine import EngineStartError, free_port, running

MODULE = "sglang.launch_server"
LAUNCH = ["-m", MODULE]  # after the python: the server (tests put a stand-in's path here)
START_TIMEOUT_S = 1800.0  # a 70B's weights load in minutes; CUDA graphs are captured after that
REQUEST_TIMEOUT_S = 3600.0  # one batch's prefill and its states as JSON
DTYPES = {"auto": "bfloat16", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # hf's rule on GPUs


def capture_ids(aux_layer_ids: Sequence[int], architectures) -> tuple[list[int], list[int]]:
    """(SGLang's ids for eagle3's aux ids, once each; for each eagle3 id, its column among them)."""
    rule = sglang_first_id_rule(architectures)
    unique = sorted(set(int(k) for k in aux_layer_ids))
    problems = sglang_id_problems(unique, rule)
    said = sglang_ids(unique, rule)
    if problems or said is None:
        raise UsageError(
            "--engine sglang: " + "; ".join(problems),
            "aux layer ids SGLang can be told to capture on this target",
            f"--aux-layers starting at 2 (as the default does), or {HF_ROUTE}",
        )
    return said, [unique.index(int(k)) for k in aux_layer_ids]


def server_args(target: Path, mode: str, layer_ids: Sequence[int], dtype: str, tp: int, port: int) -> list[str]:
    """`sglang.launch_server`'s arguments for one pass (`mode` "final" or "aux")."""
    args = [
        "--model-path", str(target), "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
        "--tp-size", str(tp),
        "--disable-radix-cache",  # every prompt prefilled whole: a cached prefix returns no rows
        "--chunked-prefill-size", "-1",  # one prefill per prompt: its rows in one element
    ]  # fmt: skip
    if mode == "final":
        return [*args, "--enable-return-hidden-states"]
    ids = [str(k) for k in layer_ids]
    return [*args, "--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3",
            "--return-aux-hidden-state-layer-ids", *ids]  # fmt: skip


def parser_problem(args: list[str]) -> str | None:
    """SGLang's own parser and its own checks of the capture flags (`handle_aux_hidden_state_capture`,
    `handle_return_hidden_states_mode`) on `args`; None when they pass, or where SGLang does not
    import here (the server's parser then checks them at start)."""
    try:
        from sglang.srt.arg_groups.overrides import resolving_view
        from sglang.srt.arg_groups.serving_hook import handle_return_hidden_states_mode
        from sglang.srt.arg_groups.validation_hook import handle_aux_hidden_state_capture
        from sglang.srt.server_args import ServerArgs
    except Exception:  # noqa: BLE001 — not installed, or a CUDA-only import: nothing to check with here
        return None

    class Strict(argparse.ArgumentParser):
        def error(self, message):
            raise ValueError(message)

    parser = Strict(prog=MODULE, allow_abbrev=False)
    ServerArgs.add_cli_args(parser)
    try:
        server = ServerArgs.from_cli_args(parser.parse_args(args))
        handle_aux_hidden_state_capture(server)
        handle_return_hidden_states_mode(server)
    except (ValueError, TypeError) as e:
        return str(e)
    view = resolving_view(server)
    if view.return_hidden_states_mode != "full":
        return f"return_hidden_states_mode resolved to {view.return_hidden_states_mode!r}, not 'full'"
    return None


def _loads(body: str):
    """SGLang's states come as JSON numbers (T x layers x H of them a prompt): orjson, which SGLang itself
    depends on, parses them several times faster than json where it is installed."""
    try:
        import orjson
    except ImportError:
        return json.loads(body)
    return orjson.loads(body)  # its JSONDecodeError is a ValueError, as json's is


def _version(python: str) -> str:
    from importlib import metadata

    if python != sys.executable:
        return "sglang (version of --engine-python not read)"
    try:
        return f"sglang {metadata.version('sglang')}"
    except metadata.PackageNotFoundError:
        return "sglang (not installed in this python)"


class SglangCapture:
    """An SGLang server on `target` for one pass (`mode`): final states [T, H] after the norm, or the
    aux states [T, n_aux, H] of eagle3's ids, from `__enter__` to `__exit__`."""

    def __init__(
        self,
        target: Path,
        aux_layer_ids: Sequence[int],
        hidden_size: int,
        mode: str,
        *,
        log_path: Path,
        architectures=None,
        dtype: str = "auto",
        tensor_parallel_size: int = 1,
        python: str | None = None,
        on_wait: Callable[[float], None] | None = None,
    ):
        self.target, self.mode, self.hidden_size = Path(target), mode, hidden_size
        self.log_path, self.on_wait = Path(log_path), on_wait
        self.layer_ids, self.columns = capture_ids(aux_layer_ids, architectures)
        self.width = hidden_size * (len(self.layer_ids) if mode == "aux" else 1)
        self.dtype = DTYPES[dtype]
        self.python = python or sys.executable
        self.version = _version(self.python)
        self.tensor_parallel_size = tensor_parallel_size
        self.port = 0  # chosen at start
        self.args = server_args(self.target, mode, self.layer_ids, self.dtype, tensor_parallel_size, self.port)
        # before minutes of start (and before the other pass's); another python's SGLang checks them itself
        problem = parser_problem(self.args) if self.python == sys.executable else None
        if problem is not None:
            raise UsageError(
                f"--engine sglang: SGLang's own parser rejects the server's arguments: {problem}",
                f"arguments SGLang takes: {' '.join(self.args)}",
                f"report it with the SGLang version; or {HF_ROUTE}",
            )
        self._ctx: contextlib.AbstractContextManager[subprocess.Popen] | None = None
        self._proc: subprocess.Popen | None = None

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> SglangCapture:
        self.port = free_port()  # free now, not when the other pass's server was built
        self.args = server_args(
            self.target, self.mode, self.layer_ids, self.dtype, self.tensor_parallel_size, self.port
        )
        argv = [self.python, *LAUNCH, *self.args]
        self._ctx = running(argv, dict(os.environ), self.log_path, f"{self.url}/health", START_TIMEOUT_S, self.on_wait)
        try:
            self._proc = self._ctx.__enter__()
        except EngineStartError as e:
            self._ctx = None
            needs = "SGLang starting on the target (a CUDA GPU; pip install sglang, or --engine-python PYTHON)"
            raise died("sglang", f"did not start: {e}", None, self.log_path, True, needs) from e
        return self

    def __exit__(self, *exc) -> None:
        if self._ctx is not None:
            ctx, self._ctx, self._proc = self._ctx, None, None
            ctx.__exit__(None, None, None)  # stops the server's process group

    def _lost(self, e: Exception) -> UsageError:
        code = None
        if self._proc is not None:  # a dying server drops its connections before it is reaped
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=10)
            code = self._proc.poll()
        if code is None:  # alive: it answered with something that is not an answer
            return self._bad(f"broke off its answer ({type(e).__name__}: {str(e)[:200]})")
        return died("sglang", "died while capturing", code, self.log_path, False, "")

    def _bad(self, what: str) -> StageError:
        kind = "the final states" if self.mode == "final" else f"layers {self.layer_ids} concatenated"
        expected = (
            f"per prompt, meta_info.hidden_states = [[T rows of {self.width}]] ({kind}), "
            "prompt_tokens = T, output_ids = [its greedy next token]"
        )
        return bad_answer("sglang", what, self.log_path, expected, self.version)

    def capture(self, token_ids: Sequence[Sequence[int]]) -> list[tuple[torch.Tensor, int]]:
        """Per prompt: (states [T, H] or [T, n_aux, H] as float32, SGLang's greedy next token)."""
        assert self._proc is not None, "use SglangCapture as a context manager"
        prompts = [[int(t) for t in ids] for ids in token_ids]
        # the states come as JSON numbers (at most ~25 characters each), far above a chat reply's limit
        limit = (64 << 20) + 32 * self.width * sum(map(len, prompts))
        try:
            reply = run_sync(
                lambda c: c.post(self.url, "/generate", hidden_states_body(prompts)), REQUEST_TIMEOUT_S, limit
            )
            if reply.status != 200:
                raise self._bad(f"answered HTTP {reply.status}: {reply.text[:300]}")
            answers = _loads(reply.text)
        except (Unreachable, ValueError) as e:
            raise self._lost(e) from e
        if not isinstance(answers, list) or len(answers) != len(prompts):
            raise self._bad(f"answered {len(prompts)} prompts with {type(answers).__name__} {str(answers)[:120]}")
        return [self._states(a, ids) for a, ids in zip(answers, prompts, strict=True)]

    def _states(self, answer, ids: list[int]) -> tuple[torch.Tensor, int]:
        try:
            meta = answer["meta_info"]
            rows, told, nxt = meta["hidden_states"][0], meta.get("prompt_tokens"), int(answer["output_ids"][0])
            states = torch.from_numpy(np.array(rows, dtype=np.float32))  # 3x torch.tensor's speed on lists
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise self._bad(f"answered without the expected fields ({type(e).__name__}: {e})") from e
        if told is not None and told != len(ids):
            raise self._bad(f"counted {told} prompt tokens for a {len(ids)}-token prompt")
        if tuple(states.shape) != (len(ids), self.width):
            raise self._bad(f"returned hidden states of shape {list(states.shape)} for a {len(ids)}-token prompt")
        if self.mode == "final":
            return states, nxt
        per_layer = states.reshape(len(ids), len(self.layer_ids), self.hidden_size)
        return per_layer[:, self.columns], nxt
