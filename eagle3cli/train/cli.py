"""`eagle3 train`: parse flags, build the typed config, call run_train."""

from __future__ import annotations

import typer

from ..console import is_launched_rank, log
from ..options import Flags, examples, stage_command
from .config import TrainConfig

TRAIN_EPILOG = examples(
    "eagle3 train --run runs/demo --depth 7 --max-steps 600",
    "eagle3 train --run runs/demo --deepspeed zero2 --nproc 2   # DeepSpeed",
    "# a target bigger than one process: split over the 2 ranks",
    "eagle3 train --run runs/big --online --deepspeed zero2 --nproc 2 \\\n    --tensor-parallel-size 2",
    "# ablations: --depth 1; --aux-layers top (a cache with the top layer)",
    "# the next session of a long run: the head so far, on samples it has not seen",
    "eagle3 train --run runs/s2 --online --data DATA --init-head runs/s1/head \\\n"
    "    --skip-samples 1500 --train-samples 1500",
)


def register(app: typer.Typer) -> None:
    @stage_command(app, "train", TrainConfig, "train", epilog=TRAIN_EPILOG)
    def train(flags: Flags[TrainConfig]) -> None:
        """Train the EAGLE-3 draft head with training-time test; export it to RUN/head.

        Re-running the same command resumes from the last checkpoint (kill -9 safe). Metrics go to
        RUN/train/metrics.jsonl: loss and accuracy per TTT step, conditional acceptance, the
        simulated acceptance length a1 + a1*a2 + ..., tokens/s.
        """
        from .loop import run_train

        head = run_train(flags.config())
        if not is_launched_rank():  # a rank's launcher says it once for the run
            log(f"head in {head}", ("done:", "bold green"))
