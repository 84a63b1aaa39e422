"""`eagle3 cache --engine vllm|sglang`: the target runs in an engine, and the cache is written through
the same writer, records and manifest as the hf route (`run.py`).

vLLM returns the aux states and the last layer's output before the final norm in one pass
(`engines/vllm_capture.py`). SGLang returns either the final states (after the norm) or the aux
states, never both from one server (`engines/sglang_capture.py`), so its route takes two passes: a
server that writes each shard's final states to a stash file beside the shard (`.final-NNNNN`,
atomically: a killed run keeps what it stashed), then a server for the aux states, which the writer
joins with the stash; a shard's stash is removed once the shard is done. Only one server runs at a
time, so a target that fits the GPUs once is enough.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import parse_shard
from ..console import log
from ..model.target_tail import load_tail, normed_rms
from ..speculate.target import target_logits
from .features import EngineFeatures
from .plan import shard_done
from .writer import batches_by_budget, save_atomic

STASH = ".final-*.safetensors"


def stash_path(out: Path, j: int) -> Path:
    return Path(out) / f".final-{j:05d}.safetensors"


def remove_stash(out: Path, j: int) -> None:
    """Shard j is done: its stashed final states are not needed again."""
    stash_path(out, j).unlink(missing_ok=True)


def engine_features(cfg, target_path: Path, ident, aux_ids, cp, todo, stack: contextlib.ExitStack) -> EngineFeatures:
    """The features of `cfg.engine`, its server(s) living as long as `stack`."""
    i, n = parse_shard(cfg.shard)  # one engine per `--shard i/N` process, each with its own log
    log_path = cfg.out_dir / ("engine.log" if n == 1 else f"engine.shard-{i}-of-{n}.log")
    common = {"log_path": log_path, "dtype": cfg.dtype, "tensor_parallel_size": cfg.tensor_parallel_size}
    if cfg.engine == "sglang":
        return _sglang(cfg, target_path, ident, aux_ids, cp, todo, stack, common)
    from ..engines.vllm_capture import VllmCapture

    engine = VllmCapture(
        target_path, aux_ids, ident.num_hidden_layers, ident.hidden_size,
        max_model_len=max(cp.lengths[k] for j in todo for k in range(*cp.ranges[j])),
        token_budget=cfg.token_budget, python=cfg.engine_python,
        on_wait=lambda s: log(f"cache: waiting for vLLM to load the target ({s:.0f} s)"), **common,
    )  # fmt: skip
    # the engine returns the last layer's output before the final norm: the target's own norm finishes it,
    # and its lm_head gives the teacher every storage keeps (compact's top-k, bf16/fp8's target_argmax).
    # Read first: a target without them is refused before minutes of engine start.
    tail = load_tail(target_path, engine.torch_dtype, lm_head=True)
    log(f"cache: starting {engine.version} ({engine.dtype}) on {target_path}; its log: {log_path}")
    stack.enter_context(engine)
    log(f"cache: vLLM is capturing layers {engine.layer_ids} on {engine.platform}")
    return EngineFeatures(engine, tail)


def _sglang(cfg, target_path: Path, ident, aux_ids, cp, todo, stack, common) -> EngineFeatures:
    from ..engines.local_engine import vllm_loadable
    from ..engines.sglang_capture import SglangCapture

    # a config naming no architecture (SmolLM2 from GGUF) is served from a copy that names one, as for vLLM
    served = vllm_loadable(Path(target_path))
    archs = json.loads((served / "config.json").read_text(encoding="utf-8")).get("architectures")
    kw = {**common, "architectures": archs, "python": cfg.engine_python}
    wait = lambda s: log(f"cache: waiting for SGLang to load the target ({s:.0f} s)")  # noqa: E731
    # both servers' arguments are checked (SGLang's parser) before either starts
    final = SglangCapture(served, aux_ids, ident.hidden_size, "final", on_wait=wait, **kw)
    aux = SglangCapture(served, aux_ids, ident.hidden_size, "aux", on_wait=wait, **kw)
    # SGLang's final states are after the norm; the tail's lm_head gives the teacher and checks them
    tail = load_tail(target_path, final.torch_dtype, lm_head=True)
    for j in range(len(cp.ranges)):  # a run killed between a shard's record and its stash's removal
        if shard_done(cfg.out_dir, j) is not None:
            remove_stash(cfg.out_dir, j)
    need = [j for j in todo if not stash_path(cfg.out_dir, j).exists()]
    if need:
        log(f"cache: SGLang pass 1 of 2 (final states, {len(need)} shards): {final.version}; log {final.log_path}")
        with final:
            for j in need:
                stash_finals(final, tail, cp, j, cfg.out_dir, cfg.token_budget)
    log(f"cache: SGLang pass 2 of 2 (aux states, SGLang ids {aux.layer_ids}): log {aux.log_path}")
    stack.enter_context(aux)
    return EngineFeatures(Stashed(aux, cfg.out_dir, todo), tail, normed=True)


def _key(ids: Sequence[int]) -> bytes:
    return hashlib.sha1(np.asarray(ids, dtype=np.int64).tobytes()).digest()


@torch.no_grad()
def stash_finals(engine, tail, cp, j: int, out: Path, token_budget: int) -> None:
    """Shard j's final states from `engine` (mode "final"), checked and written to its stash file."""
    a, b = cp.ranges[j]
    samples = cp.samples[a:b]
    lengths = [len(s.input_ids) for s in samples]
    finals: list[torch.Tensor] = [torch.empty(0)] * len(samples)
    agree = 0
    for group in batches_by_budget(lengths, token_budget):
        got = engine.capture([samples[i].input_ids.tolist() for i in group])
        for i, (states, nxt) in zip(group, got, strict=True):
            finals[i] = states.to(engine.torch_dtype)
            agree += int(target_logits(tail, finals[i][-1:]).argmax(-1).item() == nxt)
    # SGLang's code leaves the norm to each model (engines/sglang_capture.py): the rows must be the norm's
    # output, and the last one must give SGLang's own greedy token (a shifted row rarely does; a near-tie may)
    rms = normed_rms(tail, torch.cat(finals)).median().item()
    if abs(rms - 1) > 0.02:
        raise engine._bad(
            f"returned final states of RMS {rms:.3g} over the final norm's gain (1 after the norm) in shard {j}: "
            "not the states after the final norm"
        )
    if 2 * agree < len(samples):
        raise engine._bad(
            f"returned final states whose next token (the target's lm_head) is SGLang's own greedy token for "
            f"{agree} of {len(samples)} prompts of shard {j}: not the last positions' states"
        )
    ids = np.concatenate([s.input_ids for s in samples]).astype(np.int64)
    tensors = {
        "final": torch.cat(finals).contiguous(),
        "input_ids": torch.from_numpy(ids),
        "offsets": torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int64),
    }
    save_atomic(stash_path(out, j), tensors, {})


class Stashed:
    """The aux server's capture joined with the stashed final states of the same token ids (one stash
    file open at a time: a 70B corpus has thousands of shards)."""

    def __init__(self, engine, out: Path, shards: Sequence[int]):
        from safetensors import safe_open

        self.engine, self.out, self.where = engine, Path(out), {}
        self._open: tuple[int, Any] | None = None
        for j in shards:
            with safe_open(str(stash_path(out, j)), "pt") as f:
                ids, offsets = f.get_tensor("input_ids").numpy(), f.get_tensor("offsets").tolist()
            for s, e in zip(offsets[:-1], offsets[1:], strict=True):
                self.where[_key(ids[s:e])] = (j, s, e)

    def _final(self, j: int, s: int, e: int) -> torch.Tensor:
        from safetensors import safe_open

        if self._open is None or self._open[0] != j:
            self._open = (j, safe_open(str(stash_path(self.out, j)), "pt"))
        return self._open[1].get_slice("final")[s:e]

    def capture(self, token_ids: Sequence[Sequence[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per sequence: (aux [T, n_aux, H], final [T, H] after the norm)."""
        out = []
        for ids, (aux, _next) in zip(token_ids, self.engine.capture(token_ids), strict=True):
            # every sample of the shards left was stashed by pass 1 (the plan fixes them)
            out.append((aux, self._final(*self.where[_key(ids)])))
        return out
