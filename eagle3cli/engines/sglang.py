"""SGLang as eagle3 serves with it: its launch command, its speculation defaults, the guard over the
arguments after `--` (its argparse dests; serve reads their spellings from SGLang's own parser where it
imports, `serve/engine_args.py`), and the lines to paste once it is up. What SGLang reads of a head
(`srt/models/llama_eagle3.py`) is its column of the head table (`head/table.py`, `head/engines.py`:
the targets it captures from, EAGLE-3.1's norms, its aux-id convention per target class).

SGLang 0.5.x: `python -m sglang.launch_server --model-path T --speculative-algorithm EAGLE3
--speculative-draft-model-path H --speculative-num-steps S --speculative-eagle-topk K
--speculative-num-draft-tokens N --host ... --port ...`.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from .serving import (
    ACCEPT,
    ADAPTIVE,
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

MODULE = "sglang.launch_server"
# What SGLang chooses for Llama-family targets when EAGLE/EAGLE3 is given no numbers
# (`auto_choose_speculative_params`): 5 steps, topk 4, 8 verified tokens.
DEFAULTS = SpecNumbers(steps=5, topk=4, draft_tokens=8, source="SGLang's defaults for Llama targets")

REFUSED: dict[str, Guard] = {
    **SHARED,
    "model_path": own("--target", "the target"),
    "tokenizer_path": TOKENIZER,
    "json_model_override_args": Guard("the target's config.json (overridden)", TARGET_CONFIG),
    "decrypted_config_file": Guard("the target's config (read from another file)", TARGET_CONFIG),
    "modelopt_checkpoint_restore_path": Guard(
        "the target's weights (a restored checkpoint)", "give that model as --target"
    ),
    "speculative_algorithm": own("(serve sets EAGLE3)", "the speculation method"),
    "speculative_draft_model_path": own("--head", "the draft head"),
    "speculative_draft_model_revision": Guard("the draft head (another revision of it)", "give that head as --head"),
    "speculative_draft_load_format": Guard(
        "how the draft's weights load (`dummy`: random weights)",
        "drop it: the engine then loads --head's checked weights",
        allowed=("auto",),
    ),
    "decrypted_draft_config_file": Guard(
        "the draft head's config (read from another file)", "give that head as --head"
    ),
    "speculative_token_map": Guard(
        "the head's vocab map (d2t/t2d), which serve checked",
        "drop it: the head carries its own map, the one eval measured",
    ),
    "speculative_num_steps": own("--steps", "the draft depth"),
    "speculative_eagle_topk": own("--topk", "the draft's branching"),
    "speculative_num_draft_tokens": own("--draft-tokens", "the tokens verified"),
    "speculative_accept_threshold_single": ACCEPT,
    "speculative_accept_threshold_acc": ACCEPT,
    "speculative_use_rejection_sampling": ACCEPT,
    "speculative_use_block_verification": ACCEPT,
}
WARNED: dict[str, str] = {
    "speculative_draft_model_quantization": QUANT_DRAFT,
    "speculative_adaptive": ADAPTIVE,
    "speculative_adaptive_config": ADAPTIVE,
    "speculative_draft_window_size": "the draft attends to a window of the context: acceptance can differ from eval's",
    "speculative_draft_sink_size": "the draft attends to a window of the context: acceptance can differ from eval's",
    "quantization": QUANT_TARGET,
    "modelopt_quant": QUANT_TARGET,
    "model_loader_extra_config": TARGET_LOADER,
}
# `--speculative-*` flags that choose kernels or backends, not what is drafted or accepted
SPEC_OK = frozenset(
    {
        "speculative_attention_mode",
        "speculative_draft_attention_backend",
        "speculative_moe_runner_backend",
        "speculative_moe_a2a_backend",
        "speculative_dsa_topk_backend",
        "speculative_draft_kv_cache_dtype",
    }
)
# the names SGLang 0.5 gives a dest besides `--dest-with-dashes` (for the static table)
ALIASES = {"--model": "model_path", "--speculative-draft-model": "speculative_draft_model_path"}


def command(target: Path | str, head: Path | str, spec: SpecNumbers, python: str | None = None) -> list[str]:
    """SGLang's launcher with the head and the speculation numbers (host, port and extra args follow)."""
    return [
        python or sys.executable, "-m", MODULE, "--model-path", str(target), "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", str(head), "--speculative-num-steps", str(spec.steps),
        "--speculative-eagle-topk", str(spec.topk), "--speculative-num-draft-tokens", str(spec.draft_tokens),
    ]  # fmt: skip


def ready(base: str, target: str) -> list[str]:
    gen = json.dumps({"text": "The capital of France is", "sampling_params": {"max_new_tokens": 32, "temperature": 0}})
    return [
        "# SGLang native API (meta_info.spec_verify_ct / spec_accept_length show speculation at work):",
        f"curl -s {base}/generate -H 'Content-Type: application/json' -d {shlex.quote(gen)}",
    ]


ENGINE = Engine(
    "sglang",
    REFUSED,
    WARNED,
    ALIASES,
    no_value=frozenset({"--speculative-use-rejection-sampling", "--speculative-use-block-verification"}),
    spec_ok=SPEC_OK,
    defaults=DEFAULTS,
    command=command,
    ready=ready,
)
