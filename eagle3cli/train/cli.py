"""`eagle3 train` and `eagle3 export`: parse flags, build the typed config, call run_train / export_head."""

from __future__ import annotations

import typer

from ..console import log
from ..options import Flags, examples, stage_command
from .config import ExportConfig, TrainConfig

TRAIN_EPILOG = examples(
    "eagle3 train --run runs/demo --ttt-steps 7 --max-steps 600",
    "eagle3 train --run runs/demo --deepspeed zero2 --nproc 2   # DeepSpeed",
    "# ablations: --ttt-steps 1; --aux-layers top (a cache with the top layer)",
)
EXPORT_EPILOG = examples(
    ("eagle3 export --head runs/demo/head --format speculators", "--out runs/demo/head-speculators"),
    ("eagle3 export --head runs/demo/head --format gguf", "--target models/tiny-target --out runs/demo/gguf"),
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
        log(f"[bold green]done:[/] head in {head}")

    @stage_command(app, "export", ExportConfig, "export", epilog=EXPORT_EPILOG)
    def export(flags: Flags[ExportConfig]) -> None:
        """Write a trained head in another engine's layout (checked by reloading it first)."""
        from ..console import warn
        from ..manifest import read_json
        from ..model.export import export_head, speculators_support

        cfg = flags.config()
        assert cfg.out is not None  # validate() requires it
        if cfg.format == "gguf":  # llama.cpp: converted by its own converter, then read back and checked
            from ..model.gguf_export import export_gguf

            path = export_gguf(cfg.head, cfg.target, cfg.out, cfg.dtype, overwrite=cfg.overwrite)
            log(f"[bold green]done:[/] GGUF for llama.cpp in {path} (checked tensor by tensor; see manifest.json)")
            return
        assert cfg.head is not None  # validate() requires it for the other formats
        path = export_head(
            cfg.head, cfg.format, cfg.out, cfg.num_speculative_tokens, cfg.dtype, overwrite=cfg.overwrite
        )  # refuses targets vLLM cannot serve
        if cfg.format == "speculators":
            s = speculators_support(read_json(path / "config.json"))
            if s.status == "unknown":
                warn(f"cannot tell whether vLLM serves EAGLE-3 heads on {s.architecture or 'this target'} ({s.source})")
        log(f"[bold green]done:[/] {cfg.format} head in {path}")
