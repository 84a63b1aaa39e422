"""`eagle3 gen-data`: flags (one per GenDataConfig field) -> GenDataConfig -> run_gen_data."""

from __future__ import annotations

import typer

from ..options import Flags, examples, stage_command
from .config import GenDataConfig

EPILOG = examples(
    ("eagle3 gen-data --target models/tiny-target --input gsm8k", "--num-samples 300 --run runs/demo"),
    "# real chat data:",
    ("eagle3 gen-data --recipe recipes/smollm2-135m/gen-data.yaml", "--run runs/smollm2"),
    "# at scale, against inference servers:",
    (
        "eagle3 gen-data --recipe recipes/llama3-8b/gen-data.yaml",
        "--backend openai --endpoint http://node1:30000",
        "--endpoint http://node2:30000 --run runs/llama3",
    ),
)


def register(app: typer.Typer) -> None:
    @stage_command(app, "gen-data", GenDataConfig, "gen_data", epilog=EPILOG)
    def gen_data(flags: Flags[GenDataConfig]) -> None:
        """Regenerate the assistant turns of prompt datasets with the target model.

        Reads ShareGPT, UltraChat, {messages}/{prompt} JSONL, GSM8K, MT-bench, Parquet or cached HF
        datasets; regenerates every assistant answer in order, each conditioned on the regenerated
        history (tool-calling turns and tool results are kept; reasoning is stored apart, with
        thinking on/off as --thinking says); writes sharded JSONL + rejects.jsonl + manifest.json.
        Conversations the target's template refuses are rejected. Re-running the same command
        resumes an interrupted run.
        """
        from .run import run_gen_data

        run_gen_data(flags.config())
