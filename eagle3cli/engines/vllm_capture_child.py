"""Runs in vLLM's own environment, never imported by eagle3 (vLLM pins its own torch and
transformers): `python vllm_capture_child.py SPEC_JSON PROTO_FD`, started by `vllm_capture.py`.

It holds one `vllm.LLM` for the whole capture, with vLLM's `extract_hidden_states` speculative
method (the layer ids in the draft config's `eagle_aux_hidden_state_layer_ids`) and its
hidden-states KV connector, which writes one safetensors file per request (`hidden_states [T,
layers, H]`, `token_ids [T]`). Requests come on stdin, one JSON line each: `{"id": n, "prompts":
[[token ids], ...]}`; each answer goes to PROTO_FD as one JSON line: `{"id": n, "paths": [...]}`,
the files complete (their write lock released). PROTO_FD, not stdout: vLLM logs to stdout.

On CPU the stock connector cannot run: it copies through a CUDA stream into pinned memory
(`pin_memory=True` needs CUDA). `CpuHiddenStatesConnector` below writes the same file
synchronously and is loaded through vLLM's supported plug-in setting
(`kv_connector_module_path`), on CPU only; a GPU uses the stock connector.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sys

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    extract_from_kv_cache,
)

MODULE = "vllm_capture_child"  # this file's module name in the engine's processes (its folder is on PYTHONPATH)


class _Written:
    """What the stock connector's `get_finished` polls: a copy that is complete (`query()`)."""

    def query(self) -> bool:
        return True


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    """The stock connector's file, written at once from host memory: no CUDA stream, no pinned copy."""

    def _submit_async_write(self, pending) -> None:
        if not self._is_tp_rank_zero:
            return
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (torch.arange(self._block_size).reshape(1, -1) + blocks.reshape(-1, 1) * self._block_size).flatten()
        states = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        try:
            save_file({"hidden_states": states, "token_ids": pending.token_ids.clone()}, pending.filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)  # releases LOCK_EX: a reader waiting on the lock goes on
        self._req_copy_events[pending.req_id] = _Written()


def _written(path: str) -> str:
    """Wait until the connector's writer released the file's lock (the stock connector writes in a
    thread after the request is reported finished)."""
    lock = path + ".lock"
    if os.path.exists(lock):
        with open(lock) as f:
            fcntl.flock(f, fcntl.LOCK_SH)
        os.remove(lock)
    return path


def main(spec: dict, proto_fd: int) -> None:
    # SIGTERM (eagle3 stopping us, or dying: PR_SET_PDEATHSIG) unwinds, so vLLM's shutdown stops the
    # engine-core and worker processes it started; Python's default would leave them running
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    proto = os.fdopen(proto_fd, "w", buffering=1)

    def send(obj: dict) -> None:
        proto.write(json.dumps(obj) + "\n")

    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    kv = {
        "kv_connector": "ExampleHiddenStatesConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": spec["states_dir"]},
    }
    if current_platform.is_cpu():
        kv.update(kv_connector="CpuHiddenStatesConnector", kv_connector_module_path=MODULE)
    llm = LLM(
        model=spec["model"],
        dtype=spec["dtype"],
        tensor_parallel_size=spec["tensor_parallel_size"],
        max_model_len=spec["max_model_len"],
        max_num_batched_tokens=spec["max_num_batched_tokens"],
        max_num_seqs=spec["max_num_seqs"],
        gpu_memory_utilization=spec["gpu_memory_utilization"],
        enforce_eager=True,
        # a prompt in one prefill, its states computed (not reused from another request's prefix)
        enable_chunked_prefill=False,
        enable_prefix_caching=False,
        speculative_config={
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": spec["layer_ids"]}},
        },
        kv_transfer_config=kv,
    )
    send({"ready": True, "platform": "cpu" if current_platform.is_cpu() else "gpu", "connector": kv["kv_connector"]})
    params = SamplingParams(max_tokens=1, temperature=0.0)
    for line in sys.stdin:
        req = json.loads(line)
        outs = llm.generate([{"prompt_token_ids": ids} for ids in req["prompts"]], params, use_tqdm=False)
        send({"id": req["id"], "paths": [_written(o.kv_transfer_params["hidden_states_path"]) for o in outs]})


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), int(sys.argv[2]))
