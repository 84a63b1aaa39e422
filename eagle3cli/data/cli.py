"""`eagle3 gen-data`: flags -> GenDataConfig -> run_gen_data."""

from __future__ import annotations

from pathlib import Path

import typer

EPILOG = (
    "Example: eagle3 gen-data --target models/tiny-target --input gsm8k "
    "--num-samples 300 --run runs/demo  |  real chat data: eagle3 gen-data --recipe recipes/smollm2-135m/gen-data.yaml "
    "--run runs/smollm2  |  at scale: eagle3 gen-data --recipe recipes/llama3-8b/gen-data.yaml "
    "--backend openai --endpoint http://node1:30000 --endpoint http://node2:30000 --run runs/llama3"
)


def register(app: typer.Typer) -> None:
    @app.command("gen-data", epilog=EPILOG)
    def gen_data(
        target: str = typer.Option(
            None, help="Target model folder (tokenizer + chat template; hf backend generates with it)."
        ),
        inputs: list[str] = typer.Option(
            None,
            "--input",
            "-i",
            help="A named source (gsm8k, sharegpt, ultrachat, mt_bench, humaneval, sharegpt_sample; NAME:SPLIT), "
            "a file, or hf:NAME[:CONFIG]:SPLIT; optional :WEIGHT. Repeat for a mixture.",
        ),
        run: Path = typer.Option(None, help="Run folder runs/NAME; writes runs/NAME/data."),
        out: Path = typer.Option(None, help="Output folder (instead of --run)."),
        backend: str = typer.Option(
            None, help="hf (embedded transformers, default) or openai (SGLang/vLLM endpoints)."
        ),
        endpoints: list[str] = typer.Option(
            None, "--endpoint", help="OpenAI-compatible base URL; repeat for round-robin."
        ),
        concurrency: int = typer.Option(None, help="Requests in flight (openai backend). (default 32)"),
        timeout_s: float = typer.Option(None, "--timeout", help="Per-request timeout, seconds (openai). (default 300)"),
        retries: int = typer.Option(None, help="Retries per request on connect errors/timeouts/5xx. (default 4)"),
        served_model_name: str = typer.Option(None, help="Model name sent to the endpoint (default: from /v1/models)."),
        num_samples: int = typer.Option(None, help="Conversations to take over all inputs (default: all)."),
        max_turns: int = typer.Option(None, help="Keep the first N user turns of each conversation (default: all)."),
        max_prompt_tokens: int = typer.Option(
            None, help="Longest prompt accepted, tokens (hf backend; default: context - max-new-tokens)."
        ),
        max_new_tokens: int = typer.Option(None, help="Cap per assistant turn. (default 512)"),
        temperature: float = typer.Option(None, help="Sampling temperature, 0 = greedy. (default 0.8)"),
        top_p: float = typer.Option(None, help="Nucleus mass. (default 0.95)"),
        seed: int = typer.Option(None, help="Shuffle and sampling seed. (default 0)"),
        batch_size: int = typer.Option(None, help="Prompts per forward (hf backend). (default 32)"),
        shard_size: int = typer.Option(None, help="Conversations per output shard (unit of resume). (default 512)"),
        drop_truncated: bool = typer.Option(
            None,
            "--drop-truncated/--keep-truncated",
            help="Drop turns cut by max-new-tokens, or keep them flagged. (default keep)",
        ),
        no_regenerate: bool = typer.Option(
            None,
            "--no-regenerate/--regenerate",
            help="Keep the original assistant answers (manifest regenerated: false).",
        ),
        thinking: str = typer.Option(
            None,
            help="Reasoning models: on | off (the template's enable_thinking) | mix (seeded half-half) | default.",
        ),
        reasoning_effort: list[str] = typer.Option(
            None, help="Reasoning effort for templates that take one (gpt-oss: low/medium/high); repeat to mix."
        ),
        device: str = typer.Option(None, help="cpu / cuda / cuda:N (hf backend)."),
        dtype: str = typer.Option(None, help="fp32 / bf16 / fp16 (hf backend; default bf16 on GPU)."),
        dry_run: bool = typer.Option(
            None, "--dry-run", help="Show what would be read and one rendered prompt; write nothing."
        ),
        recipe: Path = typer.Option(None, help="YAML recipe (section gen_data: or flat); flags override it."),
    ) -> None:
        """Regenerate the assistant turns of prompt datasets with the target model.

        Reads ShareGPT, UltraChat, {messages}/{prompt} JSONL, GSM8K, MT-bench, Parquet or cached HF
        datasets; regenerates every assistant answer in order, each conditioned on the regenerated
        history (tool-calling turns and tool results are kept; reasoning is stored apart, with
        thinking on/off as --thinking says); writes sharded JSONL + rejects.jsonl + manifest.json.
        Conversations the target's template refuses are rejected. Re-running the same command
        resumes an interrupted run.
        """
        from ..config import build_config
        from .config import GenDataConfig
        from .run import run_gen_data

        cfg = build_config(
            GenDataConfig,
            recipe,
            "gen_data",
            target=target,
            inputs=tuple(inputs) if inputs else None,
            run=run,
            out=out,
            backend=backend,
            endpoints=tuple(endpoints) if endpoints else None,
            concurrency=concurrency,
            timeout_s=timeout_s,
            retries=retries,
            served_model_name=served_model_name,
            num_samples=num_samples,
            max_turns=max_turns,
            max_prompt_tokens=max_prompt_tokens,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            batch_size=batch_size,
            shard_size=shard_size,
            drop_truncated=drop_truncated,
            no_regenerate=no_regenerate,
            thinking=thinking,
            reasoning_effort=tuple(reasoning_effort) if reasoning_effort else None,
            device=device,
            dtype=dtype,
            dry_run=dry_run,
        )
        run_gen_data(cfg)
