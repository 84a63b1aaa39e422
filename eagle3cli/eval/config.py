"""The typed config of `eagle3 eval` (recipe section `eval:`; flags override).

Each field is one flag (eagle3cli/options.py): its docstring is the flag's help.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from ..config import CpuKernels, Panels

Mode = Literal["chain", "tree", "both"]
Turns = Literal["first", "all"]
EvalDtype = Literal["auto", "fp32", "bf16"]


# The largest EAGLE-2 tree eval drafts (depth x topk nodes per round): the draft's attention over the
# tree grows with its square; 1024 is two orders above SGLang's usual 5-8 steps x topk 1-10.
MAX_TREE_NODES = 1024


# torch makes a thread per --threads at its first op: 100000 was a MemoryError at import.
MAX_THREADS = 1024


@dataclass(frozen=True)
class EvalConfig:
    PANELS: ClassVar[Panels] = {
        "Heads and output": ("target", "head", "run", "out", "overwrite", "compare"),
        "Bench": ("bench", "num_prompts", "max_prompt_tokens", "max_new_tokens", "turns"),
        "Decoding": ("depth", "mode", "topk", "num_draft_tokens", "temperature", "top_p", "seed", "sampling_check"),
        "A running engine": ("endpoint", "base_endpoint"),
        "Speed": ("generate_baseline", "device", "dtype", "threads", "cpu_kernels"),
        "Sweep (the serving configuration)": (
            "sweep", "sweep_prompts", "sweep_max_new_tokens", "sweep_repeats", "sweep_tree", "tie_tolerance",
        ),
    }  # fmt: skip
    target: str | None = None
    """Target model folder (default: the target recorded in the head's config.json)."""
    head: Path | None = None
    """Head folder, any layout: eagle3, SGLang/SpecForge, vLLM, speculators (default: RUN/head)."""
    run: Path | None = None
    """Run folder; the report goes to RUN/eval."""
    out: Path | None = None
    """Where to write the report (default: RUN/eval; for a head folder NAME/head, NAME/eval; for
    any other head folder, runs/eval-HEADNAME)."""
    overwrite: bool = False
    """Replace a finished eval in --out made with other settings (without it that is refused; the
    same command again reruns)."""
    depth: int = 8
    """Draft depth D: chain length, or tree levels."""
    bench: str = "gsm8k"
    """A named source (gsm8k, mt_bench, humaneval, sharegpt = its held-out split, NAME:SPLIT; the test
    split by default) or a prompt/conversation file in any format gen-data reads."""
    num_prompts: int = 10
    """Prompts to decode (the first N of the bench)."""
    max_prompt_tokens: int | None = None
    """Skip prompts (first turns, rendered) longer than this, and take the next ones; the report lists
    the skipped. Default: none skipped (a prompt that leaves no room in the context is an error)."""
    max_new_tokens: int = 128
    """New tokens per prompt."""
    temperature: float = 0.0
    """0 = greedy (outputs compared token for token); > 0 = lossless speculative sampling."""
    top_p: float = 1.0
    """Nucleus sampling mass (with --temperature > 0)."""
    mode: Mode = "chain"
    """chain (EAGLE-3), tree (EAGLE-2 dynamic tree) or both."""
    topk: int = 4
    """Tree: children expanded per frontier node (SGLang --speculative-eagle-topk)."""
    num_draft_tokens: int = 16
    """Tree: tokens verified per target pass, the root (last committed token) included, as SGLang's
    --speculative-num-draft-tokens counts them: num_draft_tokens - 1 drafted nodes."""
    compare: tuple[str, ...] = ()
    """Another head (any layout) decoded on the same prompts: side by side, a paired test, overlaid in
    the plot (repeatable)."""
    endpoint: str | None = None
    """URL of a running SGLang, vLLM or llama.cpp server (target + head): evaluate the engine instead (SGLang's
    /generate meta_info, vLLM's spec-decode counters on /metrics, llama-server's timings and /metrics)."""
    base_endpoint: str | None = None
    """With --endpoint (vLLM, llama.cpp): the same target served without speculation, for tokens/s, speed-up,
    greedy outputs compared token for token and, at --temperature > 0, the engine's sampling check."""
    generate_baseline: bool = True
    """Also time transformers' greedy `generate`."""
    seed: int = 0
    """Sampling seed (with --temperature > 0)."""
    device: str | None = None
    """cpu, cuda, cuda:N or auto (default: cuda if available)."""
    dtype: EvalDtype = "auto"
    """Target weights: auto (bf16 on GPU, fp32 on CPU) | fp32 | bf16. On CPUs with AMX a bf16
    target verifies 9 tokens for about 1.2 one-token passes (fp32: about 2), so speculative rounds
    cost less; greedy output may then part from plain bf16 decoding at rounding ties. The head takes the
    target's dtype (with --cpu-kernels torch on CPU it stays fp32: there its one-row matmuls are
    faster)."""
    threads: int | None = None
    """torch CPU threads (default: torch's). Small models on a busy machine run faster on 1."""
    cpu_kernels: CpuKernels = "auto"
    """CPU matmuls of the target and the head, for every decoder timed (plain, generate, speculative):
    onednn = weights reordered once for oneDNN (a pass over 4 or 9 tokens costs about one over 1:
    SmolLM2-135M fp32 decoding 1.45x faster, and speculative rounds cheaper still; bf16 needs AVX-512
    or AVX-NE-CONVERT); torch = plain F.linear (MKL); auto = onednn where this CPU runs the dtype,
    else torch (the choice is logged). Ignored on GPU."""
    turns: Turns = "first"
    """first: each conversation's first user turn; all: every user turn (MT-bench's two), each
    answer generated by the decoder and fed back as history."""
    sweep: bool = False
    """Measure real runs of chains of depth 1..D and the --sweep-tree points, interleaved, and
    recommend the serving configuration from them."""
    sweep_prompts: int = 8
    """Sweep: the first N prompts (first turns) of the bench."""
    sweep_max_new_tokens: int = 64
    """Sweep: new tokens per prompt (short generations keep a CPU sweep to a minute or two)."""
    sweep_repeats: int = 3
    """Sweep: interleaved repeats; a prompt's time is the median over them."""
    sweep_tree: tuple[str, ...] = ("5,4,8", "8,4,16")
    """Sweep: tree points STEPS,TOPK,DRAFT_TOKENS (SGLang's --speculative-num-steps, -eagle-topk,
    -num-draft-tokens; 5,4,8 is SGLang's default for Llama targets)."""
    tie_tolerance: float = 0.03
    """Configurations whose speedup may be within this fraction of the best are tied; the
    cheapest tied one is recommended."""
    sampling_check: int = 200
    """With --temperature > 0: speculative vs plain sampling draws compared per output position
    (two-sample chi-square); 0 = off."""

    def tree_points(self) -> tuple[tuple[int, int, int], ...]:
        from .sweep import parse_tree_points

        return parse_tree_points(self.sweep_tree)

    def validate(self) -> list[str]:
        e = []
        if self.threads is not None and (not isinstance(self.threads, int) or not 1 <= self.threads <= MAX_THREADS):
            e.append(f"--threads must be an integer from 1 to {MAX_THREADS}, got {self.threads!r}")
        for name in ("depth", "num_prompts", "max_new_tokens", "topk", "num_draft_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                e.append(f"--{name.replace('_', '-')} must be an integer >= 1, got {v!r}")
        if self.max_prompt_tokens is not None and (
            not isinstance(self.max_prompt_tokens, int) or self.max_prompt_tokens < 1
        ):
            e.append(f"--max-prompt-tokens must be an integer >= 1, got {self.max_prompt_tokens!r}")
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            e.append(f"--temperature must be >= 0, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            e.append(f"--top-p must be in (0, 1], got {self.top_p!r}")
        nodes = self.depth * self.topk if isinstance(self.depth, int) and isinstance(self.topk, int) else 0
        if self.mode != "chain" and nodes > MAX_TREE_NODES:  # refused up front: it ran silently until killed
            e.append(
                f"--depth {self.depth} --topk {self.topk}: a tree of {nodes:,} drafted nodes per round (depth x topk), "
                f"{nodes * self.topk:,} candidates scored and ~{nodes * nodes // 2:,} draft attention pairs over the "
                f"tree per target pass: hours per prompt on this machine. Expected depth x topk <= {MAX_TREE_NODES:,} "
                "(SGLang's EAGLE trees: 5-8 steps x topk 1-10)"
            )
        if isinstance(self.num_draft_tokens, int) and self.num_draft_tokens < 2:
            e.append(f"--num-draft-tokens counts the root too: it must be >= 2, got {self.num_draft_tokens}")
        for name in ("sweep_prompts", "sweep_max_new_tokens", "sweep_repeats"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                e.append(f"--{name.replace('_', '-')} must be an integer >= 1, got {v!r}")
        if not isinstance(self.sampling_check, int) or self.sampling_check < 0:
            e.append(f"--sampling-check must be an integer >= 0, got {self.sampling_check!r}")
        if not isinstance(self.tie_tolerance, (int, float)) or not 0 <= self.tie_tolerance < 0.5:
            e.append(f"--tie-tolerance must be in [0, 0.5), got {self.tie_tolerance!r}")
        try:
            self.tree_points()
        except ValueError as err:
            e.append(str(err))
        if self.endpoint is None and self.head is None and self.run is None:
            e.append("give --head HEAD_DIR or --run RUN (whose head/ is evaluated), or --endpoint URL")
        if self.endpoint is not None and not str(self.endpoint).startswith(("http://", "https://")):
            e.append(f"--endpoint must be an http(s) URL, got {self.endpoint!r}")
        if self.base_endpoint is not None:
            if self.endpoint is None:
                e.append("--base-endpoint needs --endpoint (the speculative server it is compared with)")
            if not str(self.base_endpoint).startswith(("http://", "https://")):
                e.append(f"--base-endpoint must be an http(s) URL, got {self.base_endpoint!r}")
        return e
