"""`eagle3 train` and `eagle3 export`: parse flags, build the typed config, call run_train / export_head."""

from __future__ import annotations

import typer

from ..console import log
from ..options import Flags, stage_command
from .config import ExportConfig, TrainConfig

TRAIN_EPILOG = (
    "Example: eagle3 train --run runs/demo --ttt-steps 7 --max-steps 600   |   "
    "DeepSpeed: eagle3 train --run runs/demo --deepspeed zero2 --nproc 2   |   "
    "ablations: --ttt-steps 1, --aux-layers top (needs a cache built with the top layer)"
)
EXPORT_EPILOG = "Example: eagle3 export --head runs/demo/head --format speculators --out runs/demo/head-speculators"


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
        log(f"[bold green]done:[/] head in {head}")

    @stage_command(app, "export", ExportConfig, "export", epilog=EXPORT_EPILOG)
    def export(flags: Flags[ExportConfig]) -> None:
        """Write a trained head in another engine's layout (checked by reloading it first)."""
        from ..console import warn
        from ..head_files import export_head, speculators_support
        from ..manifest import read_json

        cfg = flags.config()
        assert cfg.head is not None and cfg.out is not None  # validate() requires both
        path = export_head(
            cfg.head, cfg.format, cfg.out, cfg.num_speculative_tokens, cfg.dtype
        )  # refuses targets vLLM cannot serve
        if cfg.format == "speculators":
            s = speculators_support(read_json(path / "config.json"))
            if s.status == "unknown":
                warn(f"cannot tell whether vLLM serves EAGLE-3 heads on {s.architecture or 'this target'} ({s.source})")
        log(f"[bold green]done:[/] {cfg.format} head in {path}")
