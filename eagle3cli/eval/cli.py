"""`eagle3 eval`: parse flags, build the EvalConfig, call run_eval."""

from __future__ import annotations

from pathlib import Path

import typer

from ..config import build_config
from .config import EvalConfig


def register(app: typer.Typer) -> None:
    @app.command(
        "eval",
        epilog="Example: eagle3 eval --run runs/demo --target models/tiny-target --depth 8 --bench gsm8k "
        "--num-prompts 10 --mode both --sweep",
    )
    def eval_cmd(
        target: str = typer.Option(None, help="Target model folder (default: the one the head records)."),
        head: Path = typer.Option(
            None, help="Head folder, any layout: eagle3, SGLang/SpecForge, vLLM, speculators (default: RUN/head)."
        ),
        run: Path = typer.Option(None, help="Run folder; the report is written to RUN/eval."),
        out: Path = typer.Option(None, help="Report folder (default: RUN/eval)."),
        depth: int = typer.Option(None, help="Draft depth D (chain length / tree levels). [default: 8]"),
        bench: str = typer.Option(
            None,
            help="gsm8k | mt_bench | humaneval | sharegpt (held-out) | NAME:SPLIT | a prompt file. [default: gsm8k]",
        ),
        num_prompts: int = typer.Option(None, help="Prompts to decode. [default: 10]"),
        max_new_tokens: int = typer.Option(None, help="New tokens per prompt. [default: 128]"),
        temperature: float = typer.Option(None, help="0 = greedy; > 0 = lossless speculative sampling."),
        top_p: float = typer.Option(None, help="Nucleus sampling mass (with --temperature > 0)."),
        mode: str = typer.Option(None, help="chain | tree | both. [default: chain]"),
        topk: int = typer.Option(None, help="Tree: top-k children per frontier node. [default: 4]"),
        num_draft_tokens: int = typer.Option(
            None, help="Tree: tokens verified per pass, root included (SGLang's count). [default: 16]"
        ),
        compare: list[str] = typer.Option(
            None, help="Another head (any layout) on the same prompts: side-by-side + paired test (repeatable)."
        ),
        endpoint: str = typer.Option(None, help="Evaluate a running SGLang server (its /generate) instead."),
        generate_baseline: bool = typer.Option(
            None, "--generate-baseline/--no-generate-baseline", help="Also time transformers' generate. [default: on]"
        ),
        seed: int = typer.Option(None, help="Sampling seed."),
        device: str = typer.Option(None, help="cpu | cuda | auto."),
        dtype: str = typer.Option(
            None, help="Target weights: auto | fp32 | bf16 (bf16 speeds up CPU verification with AMX). [default: auto]"
        ),
        threads: int = typer.Option(None, help="torch CPU threads (small models on a busy CPU: 1)."),
        turns: str = typer.Option(None, help="first | all: every user turn, the decoder's answers fed back."),
        sweep: bool = typer.Option(
            None, "--sweep/--no-sweep", help="Measure chains 1..D and tree points; recommend from them."
        ),
        sweep_prompts: int = typer.Option(None, help="Sweep: prompts (first turns). [default: 8]"),
        sweep_max_new_tokens: int = typer.Option(None, help="Sweep: new tokens per prompt. [default: 64]"),
        sweep_repeats: int = typer.Option(None, help="Sweep: interleaved repeats (median time). [default: 3]"),
        sweep_tree: list[str] = typer.Option(
            None, help="Sweep tree point STEPS,TOPK,DRAFT_TOKENS (repeatable). [default: 5,4,8 and 8,4,16]"
        ),
        tie_tolerance: float = typer.Option(
            None, help="Speedups within this fraction of the best tie. [default: 0.03]"
        ),
        sampling_check: int = typer.Option(
            None, help="T > 0: speculative vs plain draws compared by chi-square (0 = off). [default: 200]"
        ),
        recipe: Path = typer.Option(None, help="YAML recipe (section `eval:`); flags override it."),
    ) -> None:
        """Speculative decoding with the head: acceptance by depth, tau, speedup, losslessness.

        Decodes benchmark prompts with the target alone (our KV-cache loop and transformers'
        generate) and with each head (chain and/or EAGLE-2 tree): per-depth acceptance, tau with
        a bootstrap interval, wall-clock speedup with its interval, greedy mismatches against
        plain decoding; --compare heads side by side with a paired significance test; --sweep
        measures every chain depth and a few trees and recommends the serving configuration
        (ties within noise go to the cheapest). Writes RUN/eval/report.json + acceptance.png.
        """
        from .run import run_eval

        cfg = build_config(
            EvalConfig,
            recipe,
            "eval",
            target=target,
            head=head,
            run=run,
            out=out,
            depth=depth,
            bench=bench,
            num_prompts=num_prompts,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            mode=mode,
            topk=topk,
            num_draft_tokens=num_draft_tokens,
            compare=tuple(compare) if compare else None,
            endpoint=endpoint,
            generate_baseline=generate_baseline,
            seed=seed,
            device=device,
            dtype=dtype,
            threads=threads,
            turns=turns,
            sweep=sweep,
            sweep_prompts=sweep_prompts,
            sweep_max_new_tokens=sweep_max_new_tokens,
            sweep_repeats=sweep_repeats,
            sweep_tree=tuple(sweep_tree) if sweep_tree else None,
            tie_tolerance=tie_tolerance,
            sampling_check=sampling_check,
        )
        run_eval(cfg)
