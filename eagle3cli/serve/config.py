"""Typed configs of `eagle3 serve` (recipe section `serve:`) and `eagle3 serve-bench` (flat recipe)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .preflight import ENGINES

APIS = ("generate", "openai")


@dataclass(frozen=True)
class ServeConfig:
    target: Path | None = None
    """The target model folder the head was trained for."""
    head: Path | None = None
    """The exported head folder (runs/NAME/head)."""
    engine: str = "sglang"
    """sglang or vllm."""
    host: str = "127.0.0.1"
    """Interface the engine binds (0.0.0.0 for all)."""
    port: int = 30000
    """Port the engine binds."""
    steps: int | None = None
    """--speculative-num-steps (draft depth); give all three numbers or none."""
    topk: int | None = None
    """--speculative-eagle-topk (branching per step)."""
    draft_tokens: int | None = None
    """--speculative-num-draft-tokens (verified tree nodes, root included)."""
    from_eval: Path | None = None
    """Take the three numbers from runs/NAME/eval/report.json `recommended`."""
    dry_run: bool = False
    """Print (and validate) the command instead of running it; no GPU needed."""
    health_timeout: float = 900.0
    """Seconds to wait for the engine's /health before giving up."""
    extra_args: tuple[str, ...] = ()
    """Passed to the engine unchanged (after `--`)."""
    engine_python: str | None = None
    """Python of the environment the engine is installed in (default: this one). SGLang and vLLM pin their
    own torch/transformers, so a separate virtualenv for the engine is the usual setup."""

    def validate(self) -> list[str]:
        errors = []
        if self.target is None:
            errors.append("--target is required (the model folder the head was trained for)")
        if self.head is None:
            errors.append("--head is required (e.g. runs/NAME/head)")
        if self.engine not in ENGINES:
            errors.append(f"--engine {self.engine!r}: expected one of {', '.join(ENGINES)}")
        if not isinstance(self.port, int) or not 1 <= self.port <= 65535:
            errors.append(f"--port {self.port!r}: expected 1..65535")
        if not isinstance(self.health_timeout, (int, float)) or self.health_timeout <= 0:
            errors.append(f"--health-timeout {self.health_timeout!r}: expected seconds > 0")
        for flag, v in (("--steps", self.steps), ("--topk", self.topk), ("--draft-tokens", self.draft_tokens)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
                errors.append(f"{flag} {v!r}: expected an integer")
        return errors


@dataclass(frozen=True)
class BenchConfig:
    spec_url: str | None = None
    """Base URL of the speculative server (e.g. http://127.0.0.1:30000)."""
    base_url: str | None = None
    """Base URL of the same target served without speculation (for the speed-up column)."""
    api: str = "generate"
    """generate (SGLang native, per-request accept length) or openai (/v1/chat/completions)."""
    concurrency: tuple[int, ...] = (1, 8, 32, 64)
    """Requests in flight, one measurement each."""
    requests: int = 32
    """Requests per concurrency level (at least 2x the concurrency are sent)."""
    max_tokens: int = 128
    """Tokens generated per request (temperature 0)."""
    ignore_eos: bool = False
    """Generate exactly max_tokens per request (SGLang's ignore_eos)."""
    target: str | None = None
    """The served target's folder (or hub id in the local cache): --api generate renders each
    prompt with its chat template and sends the token ids, as `eagle3 eval --endpoint` does."""
    prompts: str = "mt_bench"
    """Prompts: a named source (mt_bench, gsm8k, sharegpt = held-out, ...) or a file in any format gen-data reads."""
    out: Path = Path("runs/serve-bench")
    """Folder for bench.json, bench.png and manifest.json."""
    timeout: float = 600.0
    """Seconds per request before it counts as failed."""

    def validate(self) -> list[str]:
        errors = []
        if not self.spec_url:
            errors.append("--spec-url is required (the speculative server, e.g. http://127.0.0.1:30000)")
        for flag, u in (("--spec-url", self.spec_url), ("--base-url", self.base_url)):
            if u and not str(u).startswith(("http://", "https://")):
                errors.append(f"{flag} {u!r}: expected http://HOST:PORT")
        if self.api not in APIS:
            errors.append(f"--api {self.api!r}: expected one of {', '.join(APIS)}")
        elif self.api == "generate" and not self.target:
            errors.append(
                "--api generate needs --target MODEL_DIR: prompts are rendered with the target's chat template "
                "(heads are trained on templated turns); or use --api openai, where the server applies it"
            )
        if not self.concurrency or any(not isinstance(c, int) or c < 1 for c in self.concurrency):
            errors.append(f"--concurrency {self.concurrency!r}: expected positive integers, e.g. 1,8,32,64")
        for flag, v in (("--requests", self.requests), ("--max-tokens", self.max_tokens)):
            if not isinstance(v, int) or v < 1:
                errors.append(f"{flag} {v!r}: expected an integer >= 1")
        if not isinstance(self.timeout, (int, float)) or self.timeout <= 0:
            errors.append(f"--timeout {self.timeout!r}: expected seconds > 0")
        return errors
