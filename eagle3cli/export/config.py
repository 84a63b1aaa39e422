"""`ExportConfig`: every knob of `eagle3 export` (recipe section `export:`; flags override).

Each field is one flag (eagle3cli/options.py): its docstring is the flag's help.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..config import flag

ExportFormat = Literal["sglang", "vllm", "speculators"]
ExportDtype = Literal["keep", "bf16", "fp16", "fp32"]


@dataclass(frozen=True)
class ExportConfig:
    head: Path | None = flag(None, required=True)
    """An exported head folder (RUN/head), or a head of any layout eval reads."""
    format: ExportFormat = "sglang"
    """The layout to write: sglang, vllm (both load eagle3's own names) or speculators (vLLM's speculators)."""
    out: Path | None = flag(None, required=True)
    """Output folder (a new one; not the head folder)."""
    num_speculative_tokens: int = 7
    """speculators: the proposal length written in its config."""
    dtype: ExportDtype = "keep"
    """Weights as trained (keep), or cast to bf16 / fp16 / fp32 (bf16 halves a head trained in fp32;
    engines run it in their own dtype anyway). d2t and t2d keep their integer and bool types."""

    def validate(self) -> list[str]:
        e = []
        if self.head is None:
            e.append("--head is required (e.g. runs/NAME/head)")
        if self.out is None:
            e.append("--out is required (a new folder, e.g. runs/NAME/head-speculators)")
        if not isinstance(self.num_speculative_tokens, int) or self.num_speculative_tokens < 1:
            e.append(f"--num-speculative-tokens {self.num_speculative_tokens!r}: expected an integer >= 1")
        return e
