"""Loading the target model and capturing its EAGLE-3 aux features.

eagle3's layer-id convention: an aux id k is an index into transformers'
`output_hidden_states`, i.e. the *input* of decoder layer k. The default `[2, L//2, L-3]`
is what SGLang and vLLM capture when a head names no layers. Capture uses forward
pre-hooks on exactly those layers, so no other layer's states are kept and the lm_head
(a 128k-wide matmul on real targets) is skipped unless logits are asked for.

Family facts live here too: `target_logits` (lm_head + the family's logit processing, e.g.
Gemma-2 softcapping), `final_norm_offset` (Gemma's (1 + w) norms).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import UsageError
from ..manifest import model_fingerprint, tokenizer_fingerprint


def default_aux_layer_ids(num_layers: int) -> tuple[int, int, int]:
    return (2, num_layers // 2, num_layers - 3)


def top_aux_layer_ids(num_layers: int) -> tuple[int]:
    """The top-only ablation: the input of the last decoder layer."""
    return (num_layers - 1,)


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
    from ..devices import check_device

    check_device(device)
    if device and device != "auto":
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_dtype(device: torch.device, dtype: str | None = None) -> torch.dtype:
    """bf16 on GPU, fp32 on CPU (CPU bf16 matmuls are slow and lossy)."""
    if dtype and dtype != "auto":
        return {
            "bf16": torch.bfloat16,
            "bfloat16": torch.bfloat16,
            "fp16": torch.float16,
            "float16": torch.float16,
            "fp32": torch.float32,
            "float32": torch.float32,
        }[dtype]
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def eos_token_ids(model, tokenizer=None) -> set[int]:
    """Every id that ends a turn: the generation config's, the model config's and the tokenizer's
    (instruct models often list several, e.g. Llama 3's <|eot_id|> and <|end_of_text|>)."""
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config, tokenizer):
        eos = getattr(src, "eos_token_id", None) if src is not None else None
        if eos is not None:
            ids.update(int(i) for i in (eos if isinstance(eos, (list, tuple)) else [eos]))
    return ids


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
    if not getattr(tok, "chat_template", None):
        raise UsageError(
            f"the tokenizer in {path} has no chat_template",
            "a chat model whose tokenizer_config.json (or chat_template.jinja) defines one",
            "use the instruct/chat variant of the model",
        )
    return tok


def load_target(name_or_path: str | Path, device: str | None = None, dtype: str | None = None):
    """(model, tokenizer, path) with the model in eval mode on the chosen device/dtype."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    # transformers' own "Loading weights" bar would interleave with our rich progress bars
    hf_logging.disable_progress_bar()
    path = resolve_model_path(name_or_path)
    dev = pick_device(device)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=pick_dtype(dev, dtype))
    # transformers types `to` through a decorator whose signature mypy reads as (model) -> model
    model = model.to(dev).eval()  # type: ignore[arg-type]
    for p in model.parameters():
        p.requires_grad_(False)
    return model, load_tokenizer(path), path


# ---------------------------------------------------------------- family facts
# Families whose RMSNorm multiplies by (1 + weight): their checkpoints store the weight
# zero-centred (Gemma initialises it to 0). Copied into a Llama RMSNorm (x * weight) as is, the
# draft's final norm would zero the logits; `final_norm_offset` says what to add (tests check it
# against the scale the loaded module applies).
ZERO_CENTRED_NORM_TYPES = frozenset(
    "gemma gemma2 gemma3 gemma3_text recurrent_gemma vaultgemma qwen3_next qwen3_5 qwen3_5_text "
    "qwen3_5_moe qwen3_5_moe_text".split()
)


def _field(config, key: str):
    """A field of a config object or config.json dict (the text config of multimodal targets)."""
    if isinstance(config, dict):
        text = config.get("text_config")
        return (text if isinstance(text, dict) and text else config).get(key)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, key, None)


def final_norm_offset(config) -> float:
    """What to add to the target's stored final-norm weight to get its effective scale."""
    return 1.0 if _field(config, "model_type") in ZERO_CENTRED_NORM_TYPES else 0.0


@dataclass(frozen=True)
class LogitSpec:
    """How a family turns lm_head outputs z into its logits: `softcap * tanh(scale * z / softcap)`."""

    scale: float = 1.0
    softcap: float | None = None

    @property
    def identity(self) -> bool:
        return self.scale == 1.0 and not self.softcap


def logit_spec(config) -> LogitSpec:
    """Gemma-2's `final_logit_softcapping`, Cohere's `logit_scale`, Granite's `logits_scaling`."""
    scale = 1.0
    if str(_field(config, "model_type") or "").startswith("cohere") and _field(config, "logit_scale"):
        scale *= float(_field(config, "logit_scale"))
    if _field(config, "logits_scaling"):
        scale /= float(_field(config, "logits_scaling"))
    cap = _field(config, "final_logit_softcapping")
    return LogitSpec(scale, float(cap) if cap else None)


def apply_logit_spec(logits: torch.Tensor, spec: LogitSpec | None) -> torch.Tensor:
    if spec is None or spec.identity:
        return logits
    if spec.scale != 1.0:
        logits = logits * spec.scale
    if spec.softcap:
        logits = torch.tanh(logits / spec.softcap) * spec.softcap
    return logits


def target_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """The target's next-token logits from its final-normed hidden states, exactly as its own
    forward computes them: lm_head, then the family's processing (softcapping, logit scale).
    Teachers, sampling at T > 0 and acceptance tests must use this, not `lm_head` alone."""
    return apply_logit_spec(model.lm_head(hidden), logit_spec(model.config))


def num_layers(model) -> int:
    return model.config.num_hidden_layers


def decoder_layers(model):
    return model.model.layers


def validate_aux_layer_ids(ids: tuple[int, ...], n_layers: int) -> list[str]:
    # Repeats are legal (engines allow them; a 4-layer target's default is [2, 2, 1]).
    errors = []
    bad = [i for i in ids if not 0 <= i < n_layers]
    if bad:
        errors.append(f"--aux-layers {bad} outside 0..{n_layers - 1} (the target has {n_layers} decoder layers)")
    return errors


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
    cfg = cfg.get("text_config", cfg)
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


class AuxCapture:
    """Context manager: records the inputs of the chosen decoder layers during a forward."""

    def __init__(self, model, aux_layer_ids: tuple[int, ...]):
        self.model, self.ids = model, tuple(aux_layer_ids)
        self.states: dict[int, torch.Tensor] = {}
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> AuxCapture:
        layers = decoder_layers(self.model)
        for i in self.ids:

            def hook(_mod, args, kwargs, i=i):
                self.states[i] = args[0] if args else kwargs["hidden_states"]

            self._handles.append(layers[i].register_forward_pre_hook(hook, with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def concat(self) -> torch.Tensor:
        """[B, T, n_aux*H], in the order of aux_layer_ids (the order fc was trained on)."""
        return torch.cat([self.states[i] for i in self.ids], dim=-1)


@torch.no_grad()
def capture_features(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, aux_layer_ids: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(aux [B,T,n_aux*H], last_hidden [B,T,H]) for a batch; last_hidden is after the final norm,
    so teacher logits are exactly `target_logits(model, last_hidden)`."""
    with AuxCapture(model, aux_layer_ids) as cap:
        out = model.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    return cap.concat(), out.last_hidden_state
