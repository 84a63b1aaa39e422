"""`eagle3 train` and `eagle3 export`: parse flags, build the typed config, call run_train / export_head."""

from __future__ import annotations

from pathlib import Path

import typer

from ..config import build_config
from ..console import log

TRAIN_EPILOG = (
    "Example: eagle3 train --run runs/demo --ttt-steps 7 --max-steps 600   |   "
    "DeepSpeed: eagle3 train --run runs/demo --deepspeed zero2 --nproc 2   |   "
    "ablations: --ttt-steps 1, --aux-layers top (needs a cache built with the top layer)"
)


def register(app: typer.Typer) -> None:
    @app.command(epilog=TRAIN_EPILOG)
    def train(
        run: Path = typer.Option(None, help="Run folder: reads RUN/cache, writes RUN/train and RUN/head."),
        recipe: Path = typer.Option(None, help="YAML recipe (flat or with a `train:` section); flags override it."),
        cache: Path = typer.Option(None, help="Cache folder (default RUN/cache)."),
        online: bool = typer.Option(
            None, "--online/--offline", help="Run the target in-process on RUN/data instead of a cache."
        ),
        data: Path = typer.Option(None, help="gen-data folder for --online (default RUN/data)."),
        target: Path = typer.Option(None, help="Target model folder (default: the one recorded in the cache)."),
        ttt_steps: int = typer.Option(None, help="TTT unroll depth K (default 7; 1 = no TTT)."),
        step_weight: float = typer.Option(None, help="Loss weight of step k is W**k (default 0.8)."),
        aux_layers: str = typer.Option(None, help="cache | default | top | ids like 2,4,5 (must match the cache)."),
        draft_vocab_size: int = typer.Option(None, help="Draft vocab for --online (offline: the cache's)."),
        max_length: int = typer.Option(None, help="Tokens per sample at most (default 2048)."),
        epochs: int = typer.Option(None, help="Passes over the data (default 1)."),
        max_steps: int = typer.Option(None, help="Stop after this many optimizer steps."),
        lr: float = typer.Option(None, help="Peak learning rate (default 3e-4)."),
        min_lr_ratio: float = typer.Option(None, help="Cosine floor as a fraction of --lr (default 0)."),
        warmup_ratio: float = typer.Option(None, help="Share of steps in linear warmup (default 0.03)."),
        weight_decay: float = typer.Option(None, help="AdamW weight decay (default 0)."),
        grad_clip: float = typer.Option(None, help="Max gradient norm, 0 = off (default 0.5)."),
        grad_accum: int = typer.Option(None, help="Micro-batches per optimizer step (default 1)."),
        token_budget: int = typer.Option(None, help="Padded tokens per micro-batch (default 4096)."),
        max_batch_size: int = typer.Option(None, help="Samples per micro-batch at most (default 64)."),
        seed: int = typer.Option(None, help="Seed of data order and init (default 0)."),
        log_every: int = typer.Option(None, help="Steps per metrics line (default 10)."),
        save_every: int = typer.Option(None, help="Steps per checkpoint, a multiple of --log-every (default 100)."),
        keep_checkpoints: int = typer.Option(None, help="Checkpoints kept besides the best (default 2)."),
        resume: bool = typer.Option(
            None, "--resume/--no-resume", help="Resume from RUN/train/checkpoints/last (default on)."
        ),
        device: str = typer.Option(None, help="cpu, cuda, cuda:N (default: cuda if available)."),
        dtype: str = typer.Option(None, help="fp32 | bf16 (default: bf16 on GPU, fp32 on CPU)."),
        deepspeed: str = typer.Option(None, help="zero1 | zero2 | zero3 | CONFIG.json: launch with DeepSpeed."),
        nproc: int = typer.Option(
            None, help="Processes per node with --deepspeed (default 1; with --hostfile: each host's slots)."
        ),
        hostfile: Path = typer.Option(
            None, help="DeepSpeed hostfile (`HOST slots=N` lines) for multi-node runs (pdsh + ssh + shared storage)."
        ),
        master_addr: str = typer.Option(
            None, help="Multi-node: the first node's address as the others reach it (default: its hostname -I)."
        ),
        master_port: int = typer.Option(
            None, help="Rendezvous port on the master node (default: one found free there over ssh)."
        ),
        tensorboard: bool = typer.Option(
            None,
            "--tensorboard/--no-tensorboard",
            help="Also write TensorBoard scalars to RUN/train/tb (needs tensorboard).",
        ),
        compile: bool = typer.Option(
            None,
            "--compile/--no-compile",
            help="torch.compile the TTT step (~5x at SmolLM2's shape on CPU; a minute or two to compile first).",
        ),
    ) -> None:
        """Train the EAGLE-3 draft head with training-time test; export it to RUN/head.

        Re-running the same command resumes from the last checkpoint (kill -9 safe). Metrics go to
        RUN/train/metrics.jsonl: loss and accuracy per TTT step, conditional acceptance, the
        simulated acceptance length a1 + a1*a2 + ..., tokens/s.
        """
        from .config import TrainConfig
        from .loop import run_train

        flags = {k: v for k, v in locals().items() if k not in ("recipe", "TrainConfig", "run_train")}
        cfg = build_config(TrainConfig, recipe, "train", **flags)
        head = run_train(cfg)
        log(f"[bold green]done:[/] head in {head}")

    @app.command(
        epilog="Example: eagle3 export --head runs/demo/head --format speculators --out runs/demo/head-speculators"
    )
    def export(
        head: Path = typer.Option(..., help="An exported head folder (RUN/head)."),
        format: str = typer.Option("sglang", "--format", help="sglang | vllm | speculators."),
        out: Path = typer.Option(..., help="Output folder."),
        num_speculative_tokens: int = typer.Option(7, help="speculators: proposal length written in its config."),
    ) -> None:
        """Write a trained head in another engine's layout (checked by reloading it first)."""
        from ..console import warn
        from ..manifest import read_json
        from ..model.export import export_head, speculators_support

        path = export_head(head, format, out, num_speculative_tokens)  # refuses targets vLLM cannot serve
        if format == "speculators":
            s = speculators_support(read_json(path / "config.json"))
            if s.status == "unknown":
                warn(f"cannot tell whether vLLM serves EAGLE-3 heads on {s.architecture or 'this target'} ({s.source})")
        log(f"[bold green]done:[/] {format} head in {path}")
