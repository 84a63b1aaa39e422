"""`ExportConfig`: every knob of `eagle3 export` (recipe section `export:`; flags override).

Each field is one flag (eagle3cli/options.py): its docstring is the flag's help.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..config import flag

ExportFormat = Literal["sglang", "vllm", "speculators", "gguf"]
ExportDtype = Literal["keep", "bf16", "fp16", "fp32"]


@dataclass(frozen=True)
class ExportConfig:
    head: Path | None = None
    """An exported head folder (RUN/head), or a head of any layout eval reads (required but for --format gguf
    --target alone)."""
    format: ExportFormat = "sglang"
    """The layout to write: sglang, vllm (both load eagle3's own names), speculators (vLLM's speculators) or
    gguf (llama.cpp: OUT/head.gguf, and OUT/target.gguf with --target; both read back and checked)."""
    target: Path | None = None
    """gguf: the target folder; its tokenizer and layer count go into head.gguf, and it is written as
    OUT/target.gguf too (default without it: head.gguf only, with the target the head records)."""
    out: Path | None = flag(None, required=True)
    """Output folder (a new one; not the head folder)."""
    overwrite: bool = False
    """Replace a finished export in --out of another head or with other settings (without it that is
    refused; the same command again rewrites the same files)."""
    num_speculative_tokens: int = flag(7, "--depth", "--num-speculative-tokens")
    """speculators: the draft depth (proposal length) written in its config (--num-speculative-tokens
    is the older name)."""
    dtype: ExportDtype = "keep"
    """Weights as trained (keep), or cast to bf16 / fp16 / fp32 (bf16 halves a head trained in fp32;
    engines run it in their own dtype anyway). d2t and t2d keep their integer and bool types.
    gguf: the converter's --outtype (keep = the files' own precision: f32 or bf16)."""

    def validate(self) -> list[str]:
        e = []
        if self.head is None and not (self.format == "gguf" and self.target is not None):
            e.append(
                "--head is required (e.g. runs/NAME/head); --format gguf --target MODEL_DIR alone converts a target"
            )
        if self.target is not None and self.format != "gguf":
            e.append("--target is for --format gguf (the other layouts record the target the head names)")
        if self.out is None:
            e.append("--out is required (a new folder, e.g. runs/NAME/head-speculators)")
        if not isinstance(self.num_speculative_tokens, int) or self.num_speculative_tokens < 1:
            e.append(f"--depth {self.num_speculative_tokens!r}: expected an integer >= 1")
        return e
