"""llama.cpp's llama-server as eagle3 serves with it: the launch command (flags as `common/arg.cpp` of
the pinned llama.cpp names them), its draft length default, and the guard over the arguments after
`--`. The GGUF files it loads are written and read back by `gguf_export.py`; what its converter and
loader read of a head is its column of the head table (`head/table.py`: `gguf`); serve's preflight
of the pair and the tokenizer check are `serve/llama_cpp.py`.

    llama-server -m target.gguf -md head.gguf --spec-type draft-eagle3 --spec-draft-n-max K
"""

from __future__ import annotations

from pathlib import Path

from .serving import SHARED, Engine, Guard, SpecNumbers, own

# llama.cpp drafts a chain of up to K tokens per round: its own default --spec-draft-n-max
DEFAULTS = SpecNumbers(steps=3, topk=1, draft_tokens=4, source="llama.cpp's default --spec-draft-n-max")
REFUSED = {
    "model": own("--target", "the target"),
    "model_draft": own("--head", "the draft head"),
    "spec_type": own("(serve sets draft-eagle3)", "the speculation method"),
    "spec_draft_n_max": own("--steps", "the draft length"),
    "host": SHARED["host"],
    "port": SHARED["port"],
}
# llama-server flags (llama.cpp's common/arg.cpp) that load another model or draft than the GGUF files
# serve checked, or add adapters over them: refused after `--`, with no serve flag to use instead.
_SWAP_FIX = (
    "serve the head with the GGUF files serve converts and checks: --target and --head, no model flags after `--`"
)
_MODEL = Guard("loads another target than the one serve checked", _SWAP_FIX)
_DRAFT = Guard("loads another draft than the head serve checked", _SWAP_FIX)
_ADAPTER = Guard("adds adapters over the target the head was trained for", _SWAP_FIX)
REFUSED |= {
    **dict.fromkeys(("hf_repo", "hf_file", "model_url", "docker_repo", "models_dir", "models_preset"), _MODEL),
    **dict.fromkeys(("hf_repo_draft", "spec_draft_hf"), _DRAFT),
    **dict.fromkeys(("lora", "lora_scaled", "lora_init_without_apply", "control_vector"), _ADAPTER),
    **dict.fromkeys(("control_vector_scaled", "control_vector_layer_range", "mmproj", "mmproj_url"), _ADAPTER),
    "override_kv": Guard("changes the target's metadata, so it is no longer the model serve checked", _SWAP_FIX),
}
ALIASES = {
    "-hf": "hf_repo",
    "-hfr": "hf_repo",
    "-hff": "hf_file",
    "-mu": "model_url",
    "-dr": "docker_repo",
    "-hfd": "hf_repo_draft",
    "-hfrd": "hf_repo_draft",
    "-mm": "mmproj",
    "-mmu": "mmproj_url",
    "-m": "model",
    "-md": "model_draft",
    "--spec-draft-model": "model_draft",
    "--draft-max": "spec_draft_n_max",
    "--draft": "spec_draft_n_max",
}


def command(target: Path | str, head: Path | str, spec: SpecNumbers, binary: str | None = None) -> list[str]:
    """llama-server with the target and head GGUF files, a chain of up to `spec.steps` draft tokens."""
    return [
        binary or "llama-server", "-m", str(target), "-md", str(head),
        "--spec-type", "draft-eagle3", "--spec-draft-n-max", str(spec.steps),
        "--metrics",  # the spec-decode counters eval --endpoint reads tau from
    ]  # fmt: skip


def ready(base: str, target: str) -> list[str]:
    return ["# `timings.draft_n` / `draft_n_accepted` in each reply show speculation at work"]


ENGINE = Engine(
    "llama.cpp",
    REFUSED,
    aliases=ALIASES,
    no_value=frozenset({"--lora-init-without-apply"}),
    defaults=DEFAULTS,
    command=command,
    ready=ready,
)
