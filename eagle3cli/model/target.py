"""Opening a target: where its folder is, its tokenizer, the loaded model on a device and dtype, and
the identity later stages compare (`open_target` and `target_identity`). Every stage opens its
target through here; what the method does with a loaded target (logits, aux-feature capture,
family quirks) is `speculate/target.py`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from ..errors import UsageError
from ..run_folder.manifest import model_fingerprint, tokenizer_fingerprint
from ..speculate.target import text_config


def resolve_model_path(name_or_path: str | Path) -> Path:
    """A local folder, or a hub id already in the local cache (nothing is downloaded here)."""
    from .config_check import check_model_folder

    p = Path(name_or_path).expanduser()
    if p.is_dir():
        if not (p / "config.json").exists():
            raise UsageError(
                f"{p} has no config.json",
                "a transformers model folder (config.json + *.safetensors)",
                "pass the folder that contains config.json",
            )
        check_model_folder(p)  # before transformers makes a tensor from it
        return p
    try:
        from huggingface_hub import snapshot_download

        snap = Path(snapshot_download(str(name_or_path), local_files_only=os.environ.get("HF_HUB_OFFLINE") == "1"))
    except Exception as e:  # hub unreachable, unknown id, gated repo...
        raise UsageError(
            f"target '{name_or_path}' is neither a local folder nor a reachable hub model ({type(e).__name__})",
            "a local model folder, e.g. models/tiny-target",
            build_hint(str(name_or_path)) or "pass a model folder that exists, e.g. --target models/tiny-target",
        ) from e
    check_model_folder(snap)
    return snap


# The targets this repository builds itself, and the command that builds each (git-ignored or
# rebuilt: a clone may not have them yet).
BUILT_TARGETS = {"smollm2-135m": "make smollm2", "tiny-target": "make tiny-target"}


def build_hint(ref: str) -> str | None:
    """`make smollm2` for a missing models/smollm2-135m (any checkout's), and so on; None otherwise."""
    p = Path(ref)
    if p.parent.name == "models" and p.name in BUILT_TARGETS:
        return f"{BUILT_TARGETS[p.name]}   (builds models/{p.name} in the repository), then rerun"
    return None


def hub_id_of(path: Path) -> str | None:
    """`org/name` for a snapshot folder of the Hugging Face cache (models--org--name/snapshots/REV)."""
    for part in Path(path).parts:
        if part.startswith("models--"):
            return part[len("models--") :].replace("--", "/")
    return None


def model_reference(path: Path) -> str:
    """What a manifest or head records about a model folder: a hub id when it came from the hub
    cache (portable between machines), else the absolute path; never a cwd-relative one, which
    `from_pretrained` elsewhere would take for a hub id."""
    return hub_id_of(path) or str(Path(path).expanduser().resolve())


def repo_relative(path: str | Path) -> str:
    """What a published file (an export, which may be committed) records about a local path: the
    path relative to the working directory (the repository) when it lies inside it, so no file
    names the folder of the machine that wrote it; else as given. `resolvable_reference` finds it
    again from the working directory or any folder above the head."""
    p = Path(path).expanduser()
    if not p.is_absolute() and not p.exists():
        return str(path)  # a hub id
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p.resolve())


def resolvable_reference(ref: str | None, base: Path | None = None) -> str | None:
    """A recorded target reference made usable from any directory: absolute paths and hub ids are
    kept; a relative path (a published head's, relative to its repository) is resolved against the
    cwd, else against `base` and each folder above it."""
    if not ref:
        return None
    p = Path(ref).expanduser()
    if p.is_absolute():
        return str(p)
    roots = [Path.cwd()]
    if base is not None:
        b = Path(base).resolve()
        roots += [b, *b.parents]
    for root in roots:
        if (root / p / "config.json").exists():
            return str((root / p).resolve())
    return ref  # a hub id (org/name), or a folder that is not here


def pick_device(device: str | None = None) -> torch.device:
    from ..node.devices import check_device

    check_device(device)
    if device and device != "auto":
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_dtype(device: torch.device, dtype: str | None = None) -> torch.dtype:
    """bf16 on a GPU that supports it (else fp16, said once), fp32 on CPU (CPU bf16 matmuls are slow and lossy)."""
    if dtype and dtype != "auto":
        return {
            "bf16": torch.bfloat16,
            "bfloat16": torch.bfloat16,
            "fp16": torch.float16,
            "float16": torch.float16,
            "fp32": torch.float32,
            "float32": torch.float32,
        }[dtype]
    if device.type == "cuda":
        from ..node.devices import gpu_auto_dtype

        return gpu_auto_dtype(device)  # type: ignore[return-value]
    return torch.float32


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    from .config_check import refuse_custom_code

    refuse_custom_code(Path(path))
    try:
        tok = AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # noqa: BLE001 — a cut tokenizer.json, merges naming tokens not in the vocab...
        files = [n for n in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model") if (Path(path) / n).exists()]
        raise UsageError(
            f"the tokenizer in {path} ({', '.join(files) or 'no tokenizer files'}) cannot be loaded: "
            f"{type(e).__name__}: {str(e)[:300]}",
            "the model's own tokenizer files, complete and unedited",
            f"restore {files[0] if files else 'tokenizer.json'} in {path} from the model's source (a cut download "
            "or an edited vocab?)",
        ) from e
    refuse_ids_past_vocab(Path(path), tok)
    if not getattr(tok, "chat_template", None):
        raise UsageError(
            f"the tokenizer in {path} has no chat_template",
            "a chat model whose tokenizer_config.json (or chat_template.jinja) defines one",
            "use the instruct/chat variant of the model",
        )
    return tok


def refuse_ids_past_vocab(path: Path, tok) -> None:
    """Every id the tokenizer can produce (its vocab and added tokens) must have a row in the model's
    embedding (config.json's vocab_size): an added token with id 5000 over a 4,096-token model was an
    IndexError in the embedding in the middle of gen-data. Fewer tokens than rows is normal (padding)."""
    cfg = text_config(json.loads((path / "config.json").read_bytes()))
    rows = cfg.get("vocab_size")
    if not isinstance(rows, int) or isinstance(rows, bool):
        return  # config_check refused it already where a model is made from it
    past = sorted((i, t) for t, i in tok.get_vocab().items() if not 0 <= i < rows)
    if past:
        shown = ", ".join(f"{t!r} = {i}" for i, t in past[:5]) + (f" (+{len(past) - 5} more)" if len(past) > 5 else "")
        added = (path / "tokenizer.json").is_file() and any(t in tok.get_added_vocab() for _, t in past)
        where = "tokenizer.json's added_tokens" if added else "the tokenizer's vocab"
        raise UsageError(
            f"the tokenizer and the target disagree: {where} in {path} hold ids at or past the model's vocab_size "
            f"{rows} ({path / 'config.json'}): {shown}",
            f"a tokenizer whose every id is below vocab_size {rows} (the embedding has {rows} rows)",
            f"restore the tokenizer files in {path} from the model's source, or remove the added token(s)",
        )


def load_target(
    name_or_path: str | Path, device: str | None = None, dtype: str | None = None, tensor_parallel: int = 1
):
    """(model, tokenizer, path) with the model in eval mode on the chosen device/dtype; with
    `tensor_parallel` N > 1, split over the N ranks of this launch (`model/sharded.py`)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    # transformers' own "Loading weights" bar would interleave with our rich progress bars
    hf_logging.disable_progress_bar()
    path = resolve_model_path(name_or_path)
    dev = pick_device(device)
    if tensor_parallel > 1:
        from .sharded import check_shardable, load_sharded

        check_shardable(path, tensor_parallel)
        return load_sharded(path, tensor_parallel, pick_dtype(dev, dtype), dev.type), load_tokenizer(path), path
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=pick_dtype(dev, dtype))
    # transformers types `to` through a decorator whose signature mypy reads as (model) -> model
    model = model.to(dev).eval()  # type: ignore[arg-type]
    for p in model.parameters():
        p.requires_grad_(False)
    return model, load_tokenizer(path), path


@dataclass(frozen=True)
class TargetIdentity:
    """What later stages compare to refuse inputs made with another target."""

    fingerprint: str
    path: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    vocab_hash: str
    chat_template_hash: str
    max_position_embeddings: int

    def as_dict(self) -> dict:
        return dict(self.__dict__)

    def comparable(self) -> dict:
        """Fields that must match (path may differ between machines)."""
        d = self.as_dict()
        d.pop("path")
        return d


def target_identity(path: Path, tokenizer, config=None) -> TargetIdentity:
    path = Path(path)
    cfg = config.to_dict() if config is not None else json.loads((path / "config.json").read_text())
    cfg = text_config(cfg)
    tf = tokenizer_fingerprint(tokenizer)
    return TargetIdentity(
        fingerprint=model_fingerprint(path),
        path=model_reference(path),
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        num_hidden_layers=int(cfg["num_hidden_layers"]),
        vocab_hash=tf["vocab_hash"],
        chat_template_hash=tf["chat_template_hash"],
        max_position_embeddings=int(cfg.get("max_position_embeddings", 0)),
    )


class Target:
    """A target as a stage opens it: its folder, its tokenizer (with a chat template), the identity
    manifests record (computed on first use: it hashes the weight files), and the model when it
    was loaded."""

    def __init__(self, path: Path, tokenizer, model: Any = None):
        self.path, self.tokenizer, self.model = Path(path), tokenizer, model

    @cached_property
    def identity(self) -> TargetIdentity:
        # from config.json, as every manifest records it (not the loaded config's defaults)
        return target_identity(self.path, self.tokenizer)


def open_target(
    name_or_path: str | Path,
    load: bool = False,
    device: str | None = None,
    dtype: str | None = None,
    tensor_parallel: int = 1,
) -> Target:
    """The one way a stage opens its target: the folder (a local one, or a hub id already in the
    local cache), its tokenizer, its identity, and with `load` the model in eval mode on `device` /
    `dtype` (`load_target`; split over `tensor_parallel` ranks when that is above 1). Each refusal
    (no config.json, no chat template, an unknown id) exits 2 with the same words in every stage."""
    if load:
        model, tok, path = load_target(name_or_path, device, dtype, tensor_parallel)
        return Target(path, tok, model)
    path = resolve_model_path(name_or_path)
    return Target(path, load_tokenizer(path))
