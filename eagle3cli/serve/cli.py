"""`eagle3 serve` and `eagle3 serve-bench`: parse flags, build the config, call run_serve / run_bench."""

from __future__ import annotations

from pathlib import Path

import typer

from ..config import build_config

SERVE_EPILOG = (
    "Example: eagle3 serve --target models/tiny-target --head runs/demo/head --dry-run"
    "  |  eagle3 serve --target meta-llama/Llama-3.1-8B-Instruct --head runs/llama/head "
    "--from-eval runs/llama/eval --port 30000 -- --mem-fraction-static 0.8"
)
BENCH_EPILOG = (
    "Example: eagle3 serve-bench --spec-url http://127.0.0.1:30000 --base-url http://127.0.0.1:30001 "
    "--target meta-llama/Llama-3.1-8B-Instruct --concurrency 1,8,32,64 --out runs/llama/serve-bench"
)


def register(app: typer.Typer) -> None:
    @app.command(epilog=SERVE_EPILOG)
    def serve(
        target: Path = typer.Option(None, help="Target model folder the head was trained for."),
        head: Path = typer.Option(None, help="Exported head folder (runs/NAME/head)."),
        engine: str = typer.Option(None, help="sglang (default) or vllm."),
        host: str = typer.Option(None, help="Interface to bind \\[default: 127.0.0.1]."),
        port: int = typer.Option(None, help="Port to bind \\[default: 30000]."),
        steps: int = typer.Option(None, help="--speculative-num-steps: draft depth."),
        topk: int = typer.Option(None, help="--speculative-eagle-topk: branches per step (1 = chain)."),
        draft_tokens: int = typer.Option(None, help="--speculative-num-draft-tokens: verified nodes incl. root."),
        from_eval: Path = typer.Option(None, help="Take steps/topk/draft-tokens from runs/NAME/eval/report.json."),
        dry_run: bool = typer.Option(None, "--dry-run", help="Check everything and print the command; start nothing."),
        health_timeout: float = typer.Option(None, help="Seconds to wait for /health \\[default: 900]."),
        engine_python: str = typer.Option(
            None, help="Python of the engine's own virtualenv, e.g. /opt/sglang/bin/python \\[default: this one]."
        ),
        recipe: Path = typer.Option(None, help="YAML recipe (section `serve:`); flags override it."),
        extra_args: list[str] = typer.Argument(
            None, metavar="[-- ENGINE_ARGS...]", help="After `--`: passed to the engine unchanged."
        ),
    ) -> None:
        """Serve the target with the trained head on SGLang (or vLLM), after checking the head fits.

        Preflight refuses heads the engines would load silently wrong (missing d2t, aux layer ids in the wrong convention, draft_vocab_size missing or null, tied embeddings, unknown tensor names), bad speculation numbers, a busy port, a missing engine or GPU. The SGLang command is parsed by SGLang's own argument parser where sglang is importable.

        Without --dry-run the engine runs in its own process group until Ctrl-C; its exit code is ours.
        """
        from .config import ServeConfig
        from .run import run_serve

        cfg = build_config(
            ServeConfig,
            recipe,
            "serve",
            target=target,
            head=head,
            engine=engine,
            host=host,
            port=port,
            steps=steps,
            topk=topk,
            draft_tokens=draft_tokens,
            from_eval=from_eval,
            dry_run=dry_run,
            health_timeout=health_timeout,
            engine_python=engine_python,
            extra_args=tuple(extra_args) if extra_args else None,
        )
        raise typer.Exit(run_serve(cfg))

    @app.command("serve-bench", epilog=BENCH_EPILOG)
    def serve_bench(
        spec_url: str = typer.Option(None, help="Speculative server, e.g. http://127.0.0.1:30000."),
        base_url: str = typer.Option(None, help="Baseline server (same target, no speculation)."),
        api: str = typer.Option(None, help="generate (SGLang /generate, per-request accept length) or openai."),
        concurrency: str = typer.Option(None, help="Comma-separated levels \\[default: 1,8,32,64]."),
        requests: int = typer.Option(None, help="Requests per level (at least 2x concurrency) \\[default: 32]."),
        max_tokens: int = typer.Option(None, help="Tokens per request \\[default: 128]."),
        ignore_eos: bool = typer.Option(None, "--ignore-eos", help="Generate exactly --max-tokens per request."),
        target: str = typer.Option(None, help="Target folder: its chat template renders --api generate prompts."),
        prompts: str = typer.Option(
            None, help="Named source (mt_bench, gsm8k, sharegpt...) or a prompt file \\[default: mt_bench]."
        ),
        out: Path = typer.Option(None, help="Output folder \\[default: runs/serve-bench]."),
        timeout: float = typer.Option(None, help="Seconds per request \\[default: 600]."),
        recipe: Path = typer.Option(None, help="Flat YAML recipe of these keys; flags override it."),
    ) -> None:
        """Load a speculative and a baseline server at several concurrencies; find where speculation stops paying.

        Writes a table, OUT/bench.json, OUT/bench.png and OUT/manifest.json.
        """
        from .bench import run_bench
        from .config import BenchConfig

        cfg = build_config(
            BenchConfig,
            recipe,
            "serve_bench",
            spec_url=spec_url,
            base_url=base_url,
            api=api,
            concurrency=concurrency,
            requests=requests,
            max_tokens=max_tokens,
            ignore_eos=ignore_eos,
            target=target,
            prompts=prompts,
            out=out,
            timeout=timeout,
        )
        run_bench(cfg)
