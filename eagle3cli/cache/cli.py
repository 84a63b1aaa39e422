"""`eagle3 cache`: parse flags, build a CacheConfig, call run_cache / verify_cache / merge_cache."""

from __future__ import annotations

from pathlib import Path

import typer

from ..config import build_config
from ..console import print_table

EPILOG = (
    "Example: eagle3 cache --run runs/demo --storage compact --aux-layers 2,6,9  "
    "·  eagle3 cache --verify runs/demo/cache  ·  eagle3 cache --run runs/demo --shard 0/2 (and 1/2), "
    "then eagle3 cache --merge runs/demo/cache"
)


def register(app: typer.Typer) -> None:
    @app.command(epilog=EPILOG)
    def cache(
        run: Path = typer.Option(None, help="Run folder: reads RUN/data, writes RUN/cache."),
        data: Path = typer.Option(None, help="Data folder from `eagle3 gen-data` (default RUN/data)."),
        out: Path = typer.Option(None, help="Cache folder to write (default RUN/cache)."),
        target: str = typer.Option(None, help="Target model folder (default: the data manifest's target)."),
        max_length: int = typer.Option(None, help="Truncate samples to this many tokens (default 2048)."),
        draft_vocab_size: int = typer.Option(None, help="Draft vocab: most frequent assistant tokens (default 32000)."),
        aux_layers: str = typer.Option(
            None, help="Aux layer ids, inputs of these decoder layers, e.g. 2,6,9 (default 2,L//2,L-3 as SGLang/vLLM)."
        ),
        storage: str = typer.Option(None, help="bf16 | fp8 | compact (fp8 aux + top-k teacher) (default bf16)."),
        topk: int = typer.Option(None, help="Teacher log-probs per token with --storage compact (default 4)."),
        token_budget: int = typer.Option(None, help="Padded tokens per target forward (default 8192)."),
        shard_tokens: int = typer.Option(None, help="Tokens per shard file, the unit of resume (default 65536)."),
        shard: str = typer.Option(None, help="i/N: this process computes shards j % N == i (same --out)."),
        max_samples: int = typer.Option(None, help="Use only the first N data records."),
        device: str = typer.Option(None, help="cpu | cuda | cuda:1 (default cuda if available)."),
        dtype: str = typer.Option(None, help="Target dtype bf16 | fp16 | fp32 (default bf16 GPU, fp32 CPU)."),
        recipe: Path = typer.Option(None, help="YAML recipe (flat, or with a `cache:` section); flags override it."),
        verify: Path = typer.Option(None, help="Verify a finished cache folder (checksums, target match) and exit."),
        merge: Path = typer.Option(None, help="Write the manifest of a cache built with --shard i/N and exit."),
    ) -> None:
        """Tokenise data with the target's chat template (assistant loss masks), build the draft vocab,
        and cache the target's aux + final hidden states as sharded, checksummed safetensors.

        Resumable: rerun the same command after a crash; finished shards are kept.
        """
        from .run import CacheConfig, merge_cache, run_cache, verify_cache

        if verify is not None:
            info = verify_cache(verify, target)
            print_table(
                f"verified {verify}: all checksums and the target match",
                ["item", "value"],
                [[k, v] for k, v in info.items()],
            )
            return
        if merge is not None:
            merge_cache(merge)
            return
        cfg = build_config(
            CacheConfig,
            recipe,
            "cache",
            run=run,
            data=data,
            out=out,
            target=target,
            max_length=max_length,
            draft_vocab_size=draft_vocab_size,
            aux_layers=aux_layers,
            storage=storage,
            topk=topk,
            token_budget=token_budget,
            shard_tokens=shard_tokens,
            shard=shard,
            max_samples=max_samples,
            device=device,
            dtype=dtype,
        )
        run_cache(cfg)
