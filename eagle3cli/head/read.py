"""The one reader of EAGLE-3 heads of any origin: eagle3's export, SGLang's layout (SpecForge heads,
with or without `eagle_config`), vLLM's (top-level ids), and vLLM `speculators` checkpoints.

`read_head` parses the folder (`folder.py`: config.json and the safetensors header), refuses it when
`check.judge` finds an error for engine "eagle3" (what eval's decoder, export and
`--init-head` need: so every reader refuses the same heads), and resolves the one thing that decides
whether a head is evaluated on the features it was trained on: which target hidden states it reads.

`load_head_weights` builds the `Eagle3Draft` from a `HeadSpec`: names are mapped to eagle3's
(`model.` prefix dropped, `layers.0.` = `midlayer.`), weights are cast to the compute dtype
(bf16 files evaluate in fp32 on CPU), and the embeddings are always the target's, as SGLang
and vLLM do (a head's own `embed_tokens` is ignored by both engines).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..errors import UsageError
from ..speculate.vocab import t2d_of, target_ids
from .check import TargetFacts, judge, refuse, refuse_nonfinite
from .folder import NEXT, AuxReading, TensorInfo, read_folder
from .table import HEAD_ARCH, HEAD_WEIGHTS, NOT_LLAMA_KEYS, head_tensor_names

if TYPE_CHECKING:
    from ..speculate.draft import Eagle3Draft


# ---------------------------------------------------------------- the head folder
@dataclass(frozen=True)
class HeadSpec:
    """A head folder, understood: its layout, its draft config, the layers it reads, its tensors."""

    path: Path
    layout: str
    llama: dict  # the Llama fields of the draft layer (hidden size, heads, rope, ...)
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: tuple[int, ...]
    aux_source: str
    names: dict[str, str]  # eagle3 name -> name in model.safetensors
    index: dict[str, TensorInfo]
    target: dict  # what the head records about its target (eagle3.target, or the speculators verifier)
    notices: tuple[str, ...] = field(default=())
    readings: tuple[AuxReading, ...] = field(default=())
    norm_before_fc: bool = False  # EAGLE-3.1's norms, as `head_norms` reads them
    norm_before_residual: bool = False

    @property
    def dtype(self) -> str:
        return self.index[self.names["fc.weight"]].dtype

    def summary(self) -> dict:
        return {
            "path": str(self.path.resolve()),
            "layout": self.layout,
            "aux_layer_ids": list(self.aux_layer_ids),
            "aux_source": self.aux_source,
            "draft_vocab_size": self.draft_vocab_size,
            "dtype": self.dtype,
            "has_embed_tokens": "embed_tokens.weight" in self.names,
            "norm_before_fc": self.norm_before_fc,
            "norm_before_residual": self.norm_before_residual,
            "notices": list(self.notices),
        }


def read_head(head_dir: Path, num_target_layers: int | None = None, target: TargetFacts | None = None) -> HeadSpec:
    """Understand a head folder from its config and safetensors header; refuse what we cannot run
    (every error `check.judge` finds for engine "eagle3", at once: with `target`, the
    head against it too, by the rules every engine shares)."""
    f = read_folder(head_dir)
    judged = judge(f, target, "eagle3", num_target_layers, finite=False)  # finite: load_head_weights
    found = judged.problems
    expected = "a one-layer EAGLE-3 head (eagle3, SGLang/SpecForge, vLLM or speculators layout)"
    refuse(found, f"{f.where} ({f.layout} layout) cannot be used as it is", expected, NEXT)
    llama, index = f.llama, f.index
    assert index is not None and judged.draft_vocab is not None  # an unreadable file is an error above
    notices = [p.what for p in found if not p.is_error]  # the aux default's notice among them
    if "embed_tokens.weight" in f.names:
        notices.append(
            f"{f.where} carries embed_tokens: ignored, the target's embeddings are used (as SGLang and vLLM do)"
        )
    return HeadSpec(
        path=f.path,
        layout=f.layout,
        llama=llama,
        vocab_size=int(llama["vocab_size"]),
        draft_vocab_size=judged.draft_vocab,
        target_hidden_size=int(f.target_hidden or llama["hidden_size"]),
        aux_layer_ids=judged.aux_ids,
        aux_source=judged.aux_source,
        names=f.names,
        index=index,
        target=f.target,
        notices=tuple(notices),
        readings=judged.readings,
        norm_before_fc=judged.norms.norm_before_fc,
        norm_before_residual=judged.norms.norm_before_residual,
    )


# ---------------------------------------------------------------- weights
def draft_config(spec: HeadSpec):
    """The LlamaConfig `Eagle3Draft` is built from."""
    from transformers import LlamaConfig

    llama = LlamaConfig(**{k: v for k, v in spec.llama.items() if k not in NOT_LLAMA_KEYS})
    llama.num_hidden_layers = 1
    llama.tie_word_embeddings = False
    llama.draft_vocab_size = spec.draft_vocab_size
    llama.target_hidden_size = spec.target_hidden_size
    llama.aux_layer_ids = list(spec.aux_layer_ids)
    llama.norm_before_fc = spec.norm_before_fc
    llama.norm_before_residual = spec.norm_before_residual
    llama.architectures = [HEAD_ARCH]
    return llama


def load_head_weights(spec: HeadSpec, target_model=None, dtype: torch.dtype | None = None) -> Eagle3Draft:
    """The `Eagle3Draft` of a read head, in `dtype` (default: the file's), with the target's embeddings."""
    from safetensors import safe_open

    from ..speculate.draft import Eagle3Draft

    draft = Eagle3Draft(draft_config(spec))
    with safe_open(str(spec.path / HEAD_WEIGHTS), framework="pt") as f:
        wanted = head_tensor_names(spec.norm_before_fc)
        tensors = {n: f.get_tensor(file_name) for n, file_name in spec.names.items() if n in wanted}
    refuse_nonfinite(tensors, spec.path / HEAD_WEIGHTS)  # a NaN head drafts garbage and engines load it silently
    file_dtype = tensors["fc.weight"].dtype
    if "d2t" not in tensors:  # full-vocab head: draft id = target id
        tensors["d2t"] = torch.zeros(spec.draft_vocab_size, dtype=torch.long)
    d2t = tensors["d2t"].to(torch.long)  # an integer map in range, one target id each (read_head)
    if "t2d" not in tensors:
        tensors["t2d"] = t2d_of(d2t, spec.vocab_size)
    expected = {n: t for n, t in draft.state_dict().items() if n != "embed_tokens.weight"}
    bad = [
        f"{n}: {tuple(tensors[n].shape)}, expected {tuple(t.shape)}"
        for n, t in expected.items()
        if tuple(tensors[n].shape) != tuple(t.shape)
    ]
    if bad:
        raise UsageError(
            f"head {spec.path}: tensor shapes do not match its config:\n  " + "\n  ".join(bad[:12]), None, NEXT
        )
    dtype = dtype or file_dtype
    draft = draft.to(dtype)
    state = {n: (t if n in ("d2t", "t2d") else t.to(dtype)) for n, t in tensors.items()}
    state["d2t"], state["t2d"] = d2t, tensors["t2d"].to(torch.bool)
    draft.load_state_dict({**state, "embed_tokens.weight": torch.zeros_like(draft.embed_tokens.weight)})
    if target_model is not None:  # the target's input embeddings, frozen (a head never stores its own)
        copy_embeddings(draft, target_model.get_input_embeddings().weight)
    return draft.eval()


def load_any_head(
    head_dir: Path, target_model=None, dtype: torch.dtype | None = None, target: TargetFacts | None = None
) -> tuple[Eagle3Draft, HeadSpec]:
    """(draft, spec) for a head of any layout; with a target model, its layer count and embeddings;
    with `target`, the head checked against it first (`read_head`)."""
    n_layers = target_model.config.num_hidden_layers if target_model is not None else None
    spec = read_head(head_dir, n_layers, target)
    return load_head_weights(spec, target_model, dtype), spec


# ---------------------------------------------------------------- the target's embeddings
# Here, with the loader, not in the draft: the shape refusal is a UsageError, which the method
# wing (speculate/) does not know.
def copy_embeddings(draft: Eagle3Draft, emb: torch.Tensor) -> None:
    """`emb` (vocab_size, hidden_size) into the draft's frozen embedding table; a wrong shape exits 2."""
    if tuple(emb.shape) != tuple(draft.embed_tokens.weight.shape):
        raise UsageError(
            f"the target's embeddings are {tuple(emb.shape)}, the head expects "
            f"{tuple(draft.embed_tokens.weight.shape)} (vocab_size, hidden_size)",
            "the target model the head was trained for",
            "check --target; the head's config.json `eagle3.target` names it",
        )
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(emb.to(draft.embed_tokens.weight.device, draft.embed_tokens.weight.dtype))
    draft.embed_tokens.weight.requires_grad_(False)


def load_head(head_dir: Path, target_model=None, dtype: torch.dtype | None = None) -> Eagle3Draft:
    """The draft of a head folder of any layout (`read_head`); with `target_model`, its
    input embeddings are copied in and its layer count gives the engines' default aux layers.

    Refuses a folder whose config or tensor names/shapes do not make a one-layer EAGLE-3 head
    (a head the engines would load half-random). Without a target the embeddings are left zero:
    set them before drafting (eval/serve pass the target).
    """
    return load_any_head(head_dir, target_model, dtype)[0]


@torch.no_grad()
def init_draft_from_weights(
    draft: Eagle3Draft,
    embed: torch.Tensor,
    lm_head: torch.Tensor | None,
    norm: torch.Tensor | None,
    d2t: torch.Tensor,
    t2d: torch.Tensor | None = None,
    norm_offset: float = 0.0,
) -> None:
    """Start from the target: frozen embeddings, lm_head = the target's rows of the draft vocab,
    final norm = the target's. fc/midlayer then only have to reproduce something like the target's
    last hidden state for step 0 to be right, which shortens early training a lot.

    `norm_offset`: Gemma-style norms scale by (1 + w) and store w; the draft's Llama RMSNorm
    scales by its weight, so it gets w + 1 (`speculate.target.final_norm_offset`)."""
    copy_embeddings(draft, embed)
    d2t = d2t.to(torch.long).cpu()
    draft.set_vocab_maps(d2t, t2d_of(d2t, draft.config.vocab_size) if t2d is None else t2d)
    if lm_head is not None and lm_head.shape[1] == draft.lm_head.weight.shape[1]:
        draft.lm_head.weight.copy_(lm_head[target_ids(d2t).to(lm_head.device)].to(draft.lm_head.weight))
    if norm is not None and norm.shape == draft.norm.weight.shape:
        draft.norm.weight.copy_(norm.to(draft.norm.weight) + norm_offset)
