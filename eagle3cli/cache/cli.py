"""`eagle3 cache`: flags (one per CacheConfig field) -> CacheConfig -> run_cache; or --verify / --merge."""

from __future__ import annotations

from pathlib import Path

import typer

from ..console import print_table
from ..options import Flags, examples, stage_command
from .config import CacheConfig

EPILOG = examples(
    "eagle3 cache --run runs/demo --storage compact --aux-layers 2,6,9",
    "eagle3 cache --run runs/demo --engine vllm   # the target runs in vLLM",
    "eagle3 cache --run runs/big --engine vllm --tensor-parallel-size 8   # 8 GPUs",
    "eagle3 cache --run runs/big --engine sglang --tensor-parallel-size 8",
    "eagle3 cache --run runs/big --tensor-parallel-size 2   # target split, 2 ranks",
    "eagle3 cache --verify runs/demo/cache",
    "eagle3 cache --run runs/demo --shard 0/2   # and --shard 1/2, then:",
    "eagle3 cache --merge runs/demo/cache",
)


def register(app: typer.Typer) -> None:
    @stage_command(app, "cache", CacheConfig, "cache", epilog=EPILOG)
    def cache(
        flags: Flags[CacheConfig],
        verify: Path = typer.Option(
            None, metavar="DIR", help="Verify a finished cache folder (checksums, target match) and exit."
        ),
        merge: Path = typer.Option(
            None, metavar="DIR", help="Write the manifest of a cache built with --shard i/N and exit."
        ),
    ) -> None:
        """Tokenise data with the target's chat template (assistant loss masks), build the draft vocab,
        and cache the target's aux + final hidden states as sharded, checksummed safetensors.

        Resumable: rerun the same command after a crash; finished shards are kept.
        """
        from .run import merge_cache, run_cache
        from .verify import verify_cache

        if verify is not None:
            info = verify_cache(verify, flags.given.get("target"))
            print_table(
                f"verified {verify}: all checksums and the target match",
                ["item", "value"],
                [[k, v] for k, v in info.items()],
            )
            return
        if merge is not None:
            merge_cache(merge)
            return
        run_cache(flags.config())
