"""`eagle3 export`: parse flags, build the typed config, call run_export."""

from __future__ import annotations

import typer

from ..console import log
from ..options import Flags, examples, stage_command
from .config import ExportConfig

EPILOG = examples(
    ("eagle3 export --head runs/demo/head --format speculators", "--out runs/demo/head-speculators"),
    ("eagle3 export --head runs/demo/head --format gguf", "--target models/tiny-target --out runs/demo/gguf"),
)


def register(app: typer.Typer) -> None:
    @stage_command(app, "export", ExportConfig, "export", epilog=EPILOG)
    def export(flags: Flags[ExportConfig]) -> None:
        """Write a trained head in another engine's layout (checked by reloading it first)."""
        from .run import run_export

        cfg = flags.config()
        path = run_export(cfg)  # refuses targets vLLM cannot serve
        if cfg.format == "gguf":
            log(f"GGUF for llama.cpp in {path} (checked tensor by tensor; see manifest.json)", ("done:", "bold green"))
        else:
            log(f"{cfg.format} head in {path}", ("done:", "bold green"))
