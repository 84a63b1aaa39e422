"""The typed config of `eagle3 eval` (recipe section `eval:`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MODES = ("chain", "tree", "both")


@dataclass(frozen=True)
class EvalConfig:
    target: str | None = None
    """Target model folder (default: the target recorded in the head's config.json)."""
    head: Path | None = None
    """Exported head folder (default: RUN/head)."""
    run: Path | None = None
    """Run folder; the report goes to RUN/eval."""
    out: Path | None = None
    """Where to write the report (default: RUN/eval, else beside the head)."""
    depth: int = 8
    """Draft depth D: chain length, or tree levels."""
    bench: str = "gsm8k"
    """A named source (gsm8k, mt_bench, humaneval, sharegpt = its held-out split, ...; test split) or a
    prompt/conversation file in any format gen-data reads."""
    num_prompts: int = 10
    max_new_tokens: int = 128
    temperature: float = 0.0
    """0 = greedy (outputs compared token for token); > 0 = lossless speculative sampling."""
    top_p: float = 1.0
    mode: str = "chain"
    """chain | tree | both."""
    topk: int = 4
    """Tree: children expanded per frontier node (SGLang --speculative-eagle-topk)."""
    num_draft_tokens: int = 16
    """Tree: tokens verified per target pass, the root (last committed token) included, as SGLang's
    --speculative-num-draft-tokens counts them: num_draft_tokens - 1 drafted nodes."""
    compare: tuple[str, ...] = ()
    """More head folders, evaluated on the same prompts and overlaid in the plot."""
    endpoint: str | None = None
    """URL of a running SGLang server: evaluate it through /generate instead."""
    generate_baseline: bool = True
    """Also time transformers' greedy `generate`."""
    seed: int = 0
    device: str | None = None
    threads: int | None = None
    """torch CPU threads (default: torch's). Small models on a busy machine run faster on 1."""

    def validate(self) -> list[str]:
        e = []
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            e.append(f"--threads must be an integer >= 1, got {self.threads!r}")
        for name in ("depth", "num_prompts", "max_new_tokens", "topk", "num_draft_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                e.append(f"--{name.replace('_', '-')} must be an integer >= 1, got {v!r}")
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            e.append(f"--temperature must be >= 0, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            e.append(f"--top-p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.num_draft_tokens, int) and self.num_draft_tokens < 2:
            e.append(f"--num-draft-tokens counts the root too: it must be >= 2, got {self.num_draft_tokens}")
        if self.mode not in MODES:
            e.append(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.endpoint is None and self.head is None and self.run is None:
            e.append("give --head HEAD_DIR or --run RUN (whose head/ is evaluated), or --endpoint URL")
        if self.endpoint is not None and not str(self.endpoint).startswith(("http://", "https://")):
            e.append(f"--endpoint must be an http(s) URL, got {self.endpoint!r}")
        return e
