"""Typed configs of `eagle3 serve` (recipe section `serve:`) and `eagle3 serve-bench` (flat, or
section `serve_bench:`).

Each field is one flag (eagle3cli/options.py): its docstring is the flag's help.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ..config import flag
from ..engines.serving import engines

# `--engine`'s choices: the engine registry's names (a new engine's module adds its own)
if TYPE_CHECKING:
    Engine = str
else:
    Engine = Literal[tuple(engines())]
Api = Literal["generate", "openai"]


@dataclass(frozen=True)
class ServeConfig:
    target: Path | None = flag(None, required=True)
    """The target model folder the head was trained for."""
    head: Path | None = flag(None, required=True)
    """The exported head folder (runs/NAME/head); llama.cpp: also a folder `export --format gguf` wrote, or a .gguf."""
    engine: Engine = "sglang"
    """The engine to launch (llama.cpp: llama-server with target and head as GGUF, converted once and cached)."""
    host: str = "127.0.0.1"
    """Interface the engine binds (0.0.0.0 for all)."""
    port: int = 30000
    """Port the engine binds."""
    steps: int | None = flag(None, "--depth", "--steps")
    """Draft depth (SGLang's --speculative-num-steps; --steps is the older name); give all three numbers or none (default: SGLang's, or --from-eval).
    llama.cpp: --spec-draft-n-max, the chain length, alone (default 3)."""
    topk: int | None = None
    """--speculative-eagle-topk: branches per step (1 = chain)."""
    draft_tokens: int | None = None
    """--speculative-num-draft-tokens: verified tree nodes, root included."""
    from_eval: Path | None = None
    """Take steps, topk and draft tokens from runs/NAME/eval/report.json `recommended`."""
    dry_run: bool = flag(False, "--dry-run")
    """Check everything and print the command (validated by SGLang's parser where importable); start nothing."""
    health_timeout: float = 900.0
    """Seconds to wait for the engine's /health before giving up."""
    extra_args: tuple[str, ...] = flag((), argument="[-- ENGINE_ARGS...]")
    """After `--`: passed to the engine unchanged."""
    engine_python: str | None = None
    """Python of the environment the engine is installed in (default: this one). SGLang and vLLM pin their
    own torch/transformers, so a separate virtualenv for the engine is the usual setup."""

    def validate(self) -> list[str]:
        errors = []
        if self.target is None:
            errors.append("--target is required (the model folder the head was trained for)")
        if self.head is None:
            errors.append("--head is required (e.g. runs/NAME/head)")
        if not isinstance(self.port, int) or not 1 <= self.port <= 65535:
            errors.append(f"--port {self.port!r}: expected 1..65535")
        if not isinstance(self.health_timeout, (int, float)) or self.health_timeout <= 0:
            errors.append(f"--health-timeout {self.health_timeout!r}: expected seconds > 0")
        for name, v in (("--depth", self.steps), ("--topk", self.topk), ("--draft-tokens", self.draft_tokens)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
                errors.append(f"{name} {v!r}: expected an integer")
        return errors


@dataclass(frozen=True)
class BenchConfig:
    spec_url: str | None = flag(None, required=True)
    """Base URL of the speculative server (e.g. http://127.0.0.1:30000)."""
    base_url: str | None = None
    """Base URL of the same target served without speculation (for the speed-up column)."""
    api: Api = "generate"
    """generate (SGLang native, per-request accept length) or openai (/v1/chat/completions)."""
    concurrency: tuple[int, ...] = (1, 8, 32, 64)
    """Requests in flight, comma-separated levels, one measurement each."""
    requests: int = 32
    """Requests per concurrency level (at least 2x the concurrency are sent)."""
    max_tokens: int = 128
    """Tokens generated per request (temperature 0)."""
    ignore_eos: bool = flag(False, "--ignore-eos")
    """Generate exactly max_tokens per request (SGLang's ignore_eos)."""
    target: str | None = None
    """The served target's folder (or hub id in the local cache): --api generate renders each
    prompt with its chat template and sends the token ids, as `eagle3 eval --endpoint` does."""
    prompts: str = "mt_bench"
    """Prompts: a named source (mt_bench, gsm8k, sharegpt = held-out, ...) or a file in any format gen-data reads."""
    out: Path = Path("runs/serve-bench")
    """Folder for bench.json, bench.png and manifest.json."""
    overwrite: bool = False
    """Replace a finished bench in --out made with other settings or servers (without it that is
    refused; the same command again reruns)."""
    timeout: float = 600.0
    """Seconds per request before it counts as failed."""

    def validate(self) -> list[str]:
        errors = []
        if not self.spec_url:
            errors.append("--spec-url is required (the speculative server, e.g. http://127.0.0.1:30000)")
        for name, u in (("--spec-url", self.spec_url), ("--base-url", self.base_url)):
            if u and not str(u).startswith(("http://", "https://")):
                errors.append(f"{name} {u!r}: expected http://HOST:PORT")
        if self.api == "generate" and not self.target:
            errors.append(
                "--api generate needs --target MODEL_DIR: prompts are rendered with the target's chat template "
                "(heads are trained on templated turns); or use --api openai, where the server applies it"
            )
        if not self.concurrency or any(not isinstance(c, int) or c < 1 for c in self.concurrency):
            errors.append(f"--concurrency {self.concurrency!r}: expected positive integers, e.g. 1,8,32,64")
        for name, v in (("--requests", self.requests), ("--max-tokens", self.max_tokens)):
            if not isinstance(v, int) or v < 1:
                errors.append(f"{name} {v!r}: expected an integer >= 1")
        if not isinstance(self.timeout, (int, float)) or self.timeout <= 0:
            errors.append(f"--timeout {self.timeout!r}: expected seconds > 0")
        return errors
