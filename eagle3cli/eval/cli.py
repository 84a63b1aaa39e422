"""`eagle3 eval`: flags (one per EvalConfig field) -> EvalConfig -> run_eval."""

from __future__ import annotations

import typer

from ..options import Flags, examples, stage_command
from .config import EvalConfig

EPILOG = examples(
    (
        "eagle3 eval --run runs/demo --target models/tiny-target --depth 8",
        "--bench gsm8k --num-prompts 10 --mode both --sweep",
    ),
    "eagle3 eval --run runs/demo --depth 4 --out runs/demo/eval-depth4",
)


def register(app: typer.Typer) -> None:
    @stage_command(app, "eval", EvalConfig, "eval", epilog=EPILOG)
    def eval_cmd(flags: Flags[EvalConfig]) -> None:
        """Speculative decoding with the head: acceptance by depth, tau, speedup, losslessness.

        Decodes benchmark prompts with the target alone (our KV-cache loop and transformers'
        generate) and with each head (chain and/or EAGLE-2 tree): per-depth acceptance, tau with
        a bootstrap interval, wall-clock speedup with its interval, greedy mismatches against
        plain decoding; --compare heads side by side with a paired significance test; --sweep
        measures every chain depth and a few trees and recommends the serving configuration
        (ties within noise go to the cheapest). Writes RUN/eval/report.json + acceptance.png.
        """
        from .run import run_eval

        run_eval(flags.config())
