"""One reader for EAGLE-3 heads of any origin: eagle3's export, SGLang's layout (SpecForge heads,
with or without `eagle_config`), vLLM's (top-level ids), and vLLM `speculators` checkpoints.

`read_head` looks at config.json and the safetensors header only (no weights) and resolves the
one thing that decides whether a head is evaluated on the features it was trained on: which
target hidden states it reads. Each config field that names layers is read in its own engine's
convention and turned into eagle3's (`hidden_states[k]`, the input of decoder layer k):

  field                                            convention                 eagle3 ids
  eagle3.aux_layer_ids                             hidden_states[k]           k
  eagle_config.eagle_aux_hidden_state_layer_ids    SGLang: output of layer k  k + 1
  eagle_aux_hidden_state_layer_ids (top level)     vLLM/speculators           k

Fields that disagree are refused with every reading shown: whichever we picked, one engine
would feed the head other layers than the ones it was trained on. A head that names no layers
gets what both engines capture then, [2, L//2, L-3], with a notice saying so.

EAGLE-3.1's two norms (`head_norms`) are read where vLLM reads them: `norm_before_residual` at the
top level (in a speculators config a missing one means true, vLLM's and the speculators library's
default), `norm_before_fc` in `eagle_config` first, then at the top level; its weight is
`input_norm.weight`. `fc_norm` (one norm per aux feature, another variant) is refused.

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
from ..manifest import for_run, read_json_object
from ..speculate.aux_layers import default_aux_layer_ids, from_sglang_ids, int_list
from .config_check import config_problems

if TYPE_CHECKING:
    from ..speculate.draft import Eagle3Draft

HEAD_WEIGHTS = "model.safetensors"
HEAD_ARCH = "LlamaForCausalLMEagle3"
# vLLM registers both names for the same class.
HEAD_ARCHS = (HEAD_ARCH, "Eagle3LlamaForCausalLM")
SPECULATORS_ARCH = "Eagle3Speculator"
# The draft's parameters, named as the engines map them; embeddings are the target's.
HEAD_TENSOR_NAMES = (
    "fc.weight",
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight",
    "norm.weight",
    "lm_head.weight",
    "d2t",
    "t2d",
)
OPTIONAL_TENSOR_NAMES = ("embed_tokens.weight",)
# EAGLE-3.1's norm_before_fc: the RMSNorm over the concatenated aux features (vLLM's and llama.cpp's
# converter's checkpoint name). Part of a head exactly when the flag is set.
INPUT_NORM = "input_norm.weight"
FLOAT_DTYPES = ("F32", "BF16", "F16", "F64")
NEXT = "eagle3 export --head HEAD --format sglang --out DIR   (or re-export: eagle3 train --run runs/NAME)"


def head_tensor_names(norm_before_fc: bool) -> tuple[str, ...]:
    """The tensors a head has: `HEAD_TENSOR_NAMES`, and `input_norm.weight` with norm_before_fc."""
    return HEAD_TENSOR_NAMES + ((INPUT_NORM,) if norm_before_fc else ())


# ---------------------------------------------------------------- safetensors header
@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype string: F32, BF16, I64, BOOL...


def read_tensor_index(path: Path) -> dict[str, TensorInfo]:
    """Names, shapes and dtypes from the safetensors header; no tensor is loaded."""
    from safetensors import safe_open

    out = {}
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():
            s = f.get_slice(name)
            out[name] = TensorInfo(tuple(int(d) for d in s.get_shape()), str(s.get_dtype()))
    return out


def canonical_name(name: str) -> str:
    """The eagle3 name an engine maps this checkpoint name to (`model.` dropped, layers.0 = midlayer)."""
    if name.startswith("model."):
        name = name[len("model.") :]
    if name.startswith("layers.0."):
        name = "midlayer." + name[len("layers.0.") :]
    return name


# ---------------------------------------------------------------- aux layer ids
@dataclass(frozen=True)
class AuxReading:
    """One config field naming aux layers, and what it means in eagle3's convention."""

    field: str
    raw: tuple[int, ...]
    hidden_states: tuple[int, ...]
    convention: str

    def describe(self) -> str:
        return f"{self.field}={list(self.raw)} ({self.convention}) -> hidden_states{list(self.hidden_states)}"


def _int_list(value, where: str) -> list[int] | None:
    try:
        return int_list(value)
    except ValueError:
        raise UsageError(f"{where} is {value!r}, not a list of integers", "a list of layer indices", NEXT) from None


def aux_readings(cfg: dict, layout: str) -> list[AuxReading]:
    """Every field of a head config that names aux layers, each read in its engine's convention."""
    out = []
    ours = _int_list((cfg.get("eagle3") or {}).get("aux_layer_ids"), "eagle3.aux_layer_ids")
    if ours:
        out.append(AuxReading("eagle3.aux_layer_ids", tuple(ours), tuple(ours), "hidden_states[k]"))

    def order(ids) -> tuple[int, ...]:
        # eagle3 concatenates features in the order of its own field; the engines capture in
        # layer order, which is what a head without that field was trained on
        ids = list(ids)
        return tuple(ids) if ours else tuple(sorted(ids))

    eagle_cfg = cfg.get("eagle_config") or {}
    sg = _int_list(eagle_cfg.get("eagle_aux_hidden_state_layer_ids"), "eagle_config.eagle_aux_hidden_state_layer_ids")
    if sg:
        # SGLang adds 1: "output of layer k" is the input of layer k+1; it captures in layer order
        out.append(
            AuxReading(
                "eagle_config.eagle_aux_hidden_state_layer_ids",
                tuple(sg),
                order(from_sglang_ids(sg)),
                "SGLang: output of layer k, +1",
            )
        )
    top = _int_list(cfg.get("eagle_aux_hidden_state_layer_ids"), "eagle_aux_hidden_state_layer_ids")
    if top:
        who = "speculators/vLLM" if layout == "speculators" else "vLLM"
        out.append(
            AuxReading(
                "eagle_aux_hidden_state_layer_ids",
                tuple(top),
                order(top),
                f"{who}: hidden_states[k]",
            )
        )
    return out


def resolve_aux_ids(
    readings: list[AuxReading], num_target_layers: int | None, n_aux_fc: int | None, where: str
) -> tuple[tuple[int, ...], str, list[str]]:
    """(eagle3 ids, where they came from, notices); refuses fields that contradict each other."""
    distinct = {r.hidden_states for r in readings}
    if len(distinct) > 1:
        lines = "\n  ".join(r.describe() for r in readings)
        raise UsageError(
            f"{where}: its aux layer fields contradict each other, so engines would feed it different layers:\n  "
            f"{lines}",
            "fields that name the same target layers, each in its engine's convention "
            "(eagle_config ids = k - 1, top-level ids = k, for hidden_states[k])",
            "fix the field that is wrong in config.json (the one the head was not trained with), "
            "or re-export: eagle3 export --head HEAD --format sglang --out DIR",
        )
    notices = []
    if readings:
        ids, source = readings[0].hidden_states, " = ".join(r.field for r in readings)
    else:
        if num_target_layers is None:
            raise UsageError(
                f"{where} names no aux layers and no target is known to take the engines' default from",
                "a target (--target) whose layer count gives the default [2, L//2, L-3]",
                "pass --target MODEL_DIR",
            )
        ids = tuple(default_aux_layer_ids(num_target_layers))
        source = f"engine default [2, L//2, L-3] for L={num_target_layers}"
        notices.append(
            f"{where} names no aux layers: assuming what SGLang and vLLM capture then, "
            f"hidden_states{list(ids)} (inputs of decoder layers {list(ids)}, L={num_target_layers})"
        )
    if n_aux_fc is not None and n_aux_fc != len(ids):
        raise UsageError(
            f"{where}: fc.weight reads {n_aux_fc} aux features but the config gives {len(ids)} aux layers "
            f"(hidden_states{list(ids)} from {source})",
            "as many aux layer ids as fc.weight's input width / target hidden size",
            "add the layer ids the head was trained on to config.json (eagle_config.eagle_aux_hidden_state_layer_ids)",
        )
    if num_target_layers is not None:
        bad = [k for k in ids if not 0 <= k < num_target_layers]
        if bad:
            raise UsageError(
                f"{where}: aux layers hidden_states{list(ids)} ({source}) include {bad}, which a "
                f"{num_target_layers}-layer target does not have",
                "the target the head was trained for",
                "pass --target with the model the head names (eagle3.target or speculators verifier)",
            )
    return tuple(int(k) for k in ids), source, notices


# ---------------------------------------------------------------- EAGLE-3.1's norms
@dataclass(frozen=True)
class HeadNorms:
    """EAGLE-3.1's optional norms as the engines read a head's config (`head_norms`)."""

    norm_before_fc: bool = False
    norm_before_residual: bool = False
    problems: tuple[str, ...] = ()
    notices: tuple[str, ...] = ()


def head_norms(cfg: dict, layout: str) -> HeadNorms:
    """The two norm flags of a head config, each read where and as vLLM reads it (the reference
    loader), and the spellings that would make engines disagree, as problems:

      norm_before_residual  top level; speculators: missing = true (vLLM's `update_eagle3` and the
                            speculators library's own default), elsewhere missing = false
      norm_before_fc        `eagle_config` first, then the top level (llama.cpp's converter reads
                            only the top level: the two must not disagree); missing = false
      fc_norm               a norm per aux feature, not one over all of them: refused
    """
    eagle_cfg = cfg.get("eagle_config") or {}
    problems, notices = [], []

    def value(where: dict, key: str, label: str) -> bool | None:
        v = where.get(key)
        if v is None or isinstance(v, bool):
            return v
        problems.append(f"{label} is {v!r}, not true or false")
        return None

    if eagle_cfg.get("fc_norm") or cfg.get("fc_norm"):
        problems.append(
            "fc_norm is set: one RMSNorm per aux feature before fc, a variant eagle3's draft does not implement "
            "(its norm_before_fc is one norm over all of them)"
        )
    top_fc = value(cfg, "norm_before_fc", "norm_before_fc")
    ec_fc = value(eagle_cfg, "norm_before_fc", "eagle_config.norm_before_fc")
    if top_fc is not None and ec_fc is not None and top_fc != ec_fc:
        problems.append(
            f"eagle_config.norm_before_fc is {ec_fc} but norm_before_fc is {top_fc}: vLLM reads the first, "
            "llama.cpp's converter the second"
        )
    fc = bool(ec_fc if ec_fc is not None else top_fc)
    top_res = value(cfg, "norm_before_residual", "norm_before_residual")
    ec_res = value(eagle_cfg, "norm_before_residual", "eagle_config.norm_before_residual")
    if ec_res is not None and ec_res != bool(top_res):
        problems.append(
            f"eagle_config.norm_before_residual is {ec_res}, but vLLM and llama.cpp read only the top-level "
            f"norm_before_residual, which is {top_res if top_res is not None else 'missing'}"
        )
    if top_res is None and layout == "speculators":
        notices.append(
            "the speculators config does not say norm_before_residual: reading it as true, as vLLM and the "
            "speculators library do"
        )
        top_res = True
    return HeadNorms(fc, bool(top_res), tuple(problems), tuple(notices))


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
    def target_ref(self) -> str | None:
        return self.target.get("name_or_path") or self.target.get("path")

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


def head_file(head_dir: Path, name: str) -> Path:
    """`head_dir/name`, or the error saying what a head folder holds and how one is made."""
    path = Path(head_dir) / name
    if not path.exists():
        raise UsageError(
            f"{path} does not exist",
            "a head folder with config.json + model.safetensors (eagle3, SGLang, vLLM or speculators layout)",
            for_run("eagle3 train --run runs/NAME   (exports runs/NAME/head)", head_dir),
        )
    return path


def read_config_json(path: Path) -> dict:
    return read_json_object(path, "a head config.json", NEXT)


def detect_layout(cfg: dict) -> str:
    if cfg.get("speculators_model_type") == "eagle3" or SPECULATORS_ARCH in (cfg.get("architectures") or []):
        return "speculators"
    if (cfg.get("eagle3") or {}).get("aux_layer_ids"):
        return "eagle3"
    if cfg.get("eagle_aux_hidden_state_layer_ids") and not (cfg.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids"
    ):
        return "vllm"
    return "sglang"


def _speculators_fields(cfg: dict, where: str) -> tuple[dict, dict]:
    """(Llama fields, recorded target) of a speculators eagle3 config (its norms: `head_norms`)."""
    layer = cfg.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise UsageError(
            f"{where}: a speculators config without transformer_layer_config", "an Eagle3Speculator config"
        )
    verifier = (cfg.get("speculators_config") or {}).get("verifier") or {}
    target = dict((cfg.get("eagle3") or {}).get("target") or {})
    if verifier.get("name_or_path"):
        target["name_or_path"] = verifier["name_or_path"]
    return dict(layer), target


def read_head(head_dir: Path, num_target_layers: int | None = None) -> HeadSpec:
    """Understand a head folder from its config and safetensors header; refuse what we cannot run."""
    head_dir = Path(head_dir)
    where = f"head {head_dir}"
    cfg_path, w_path = head_file(head_dir, "config.json"), head_file(head_dir, HEAD_WEIGHTS)
    cfg = read_config_json(cfg_path)
    layout = detect_layout(cfg)
    problems: list[str] = []
    if layout == "speculators":
        llama, target = _speculators_fields(cfg, where)
    else:
        archs = cfg.get("architectures") or []
        if not any(a in HEAD_ARCHS for a in archs):
            problems.append(f"architectures is {archs}, expected one of {list(HEAD_ARCHS)} or ['{SPECULATORS_ARCH}']")
        llama = {k: v for k, v in cfg.items() if k not in ("eagle3", "eagle_config")}
        target = dict((cfg.get("eagle3") or {}).get("target") or {})
        if cfg.get("tie_word_embeddings") is True:
            problems.append("tie_word_embeddings is true (engines would replace the trained lm_head by embeddings)")
    if llama.get("num_hidden_layers", 1) != 1:
        problems.append(f"num_hidden_layers is {llama.get('num_hidden_layers')}; eagle3 runs one-layer EAGLE-3 heads")
    eagle_cfg = cfg.get("eagle_config") or {}
    norms = head_norms(cfg, layout)
    problems += list(norms.problems)
    if eagle_cfg.get("use_aux_hidden_state") is False:
        problems.append("eagle_config.use_aux_hidden_state is false: not an EAGLE-3 (multi-layer feature) head")
    for k in ("hidden_size", "num_attention_heads", "vocab_size"):
        if not isinstance(llama.get(k), int):
            problems.append(f"no integer {k} in the draft layer's config")
    problems += [f"{cfg_path}: {p}" for p in config_problems(llama, required=False)]  # before a tensor is made
    try:
        index = read_tensor_index(w_path)
    except Exception as e:  # noqa: BLE001 — a truncated or foreign file: say so, do not crash
        raise UsageError(f"{w_path} is not a readable safetensors file ({type(e).__name__}: {e})", None, NEXT) from e
    names: dict[str, str] = {}
    for name in index:
        names.setdefault(canonical_name(name), name)
    wanted = head_tensor_names(norms.norm_before_fc)
    known = set(wanted) | set(OPTIONAL_TENSOR_NAMES)
    if INPUT_NORM in names and not norms.norm_before_fc:
        # vLLM drops it when the flag is off: the head would draft without the norm it was trained with
        problems.append(f"{names[INPUT_NORM]} is in model.safetensors but norm_before_fc is not set in config.json")
    unknown = sorted(n for n in index if canonical_name(n) not in known | {INPUT_NORM})
    if unknown:
        problems.append(f"tensors eagle3's draft has no place for: {', '.join(unknown[:8])}")
    missing = [n for n in wanted if n not in names and n not in ("d2t", "t2d")]
    if missing:
        flagged = " (norm_before_fc is set)" if INPUT_NORM in missing else ""
        problems.append(f"model.safetensors lacks {', '.join(missing)}{flagged}")
    not_float = [
        f"{n} ({index[names[n]].dtype})"
        for n in wanted
        if n in names and n not in ("d2t", "t2d") and index[names[n]].dtype not in FLOAT_DTYPES
    ]
    if not_float:  # an int32 head would "load" and draft nonsense
        problems.append(f"weights that are not floating point: {', '.join(not_float[:6])} (expected F32, BF16 or F16)")
    if problems:
        raise UsageError(
            f"{where} ({layout} layout) cannot be evaluated as it is:\n  " + "\n  ".join(problems),
            "a one-layer EAGLE-3 head (eagle3, SGLang/SpecForge, vLLM or speculators layout)",
            NEXT,
        )
    hidden = int(llama["hidden_size"])
    lm = index[names["lm_head.weight"]].shape
    draft_vocab = cfg.get("draft_vocab_size") or llama.get("draft_vocab_size")
    notices = []
    if not draft_vocab:
        draft_vocab = lm[0]
        notices.append(f"{where} has no draft_vocab_size: taking lm_head.weight's {lm[0]} rows (SGLang needs it set)")
    target_hidden = int(cfg.get("target_hidden_size") or llama.get("target_hidden_size") or hidden)
    fc = index[names["fc.weight"]].shape
    shape_problems = []
    if len(fc) != 2 or fc[0] != hidden or fc[1] % target_hidden:
        shape_problems.append(f"fc.weight {fc}, expected ({hidden}, n_aux * {target_hidden})")
    if norms.norm_before_fc and len(fc) == 2 and index[names[INPUT_NORM]].shape != (fc[1],):
        shape_problems.append(f"{INPUT_NORM} {index[names[INPUT_NORM]].shape}, expected ({fc[1]},), fc's input width")
    if lm != (int(draft_vocab), hidden):
        shape_problems.append(f"lm_head.weight {lm}, expected (draft_vocab_size {draft_vocab}, {hidden})")
    vocab = int(llama["vocab_size"])
    if "d2t" in names and index[names["d2t"]].shape != (int(draft_vocab),):
        shape_problems.append(f"d2t {index[names['d2t']].shape}, expected ({draft_vocab},)")
    if "d2t" not in names and int(draft_vocab) < vocab:
        shape_problems.append(
            f"no d2t although draft_vocab_size {draft_vocab} < vocab_size {vocab}: draft ids could not be mapped"
        )
    if shape_problems:
        raise UsageError(f"{where}: tensors do not match its config:\n  " + "\n  ".join(shape_problems), None, NEXT)
    if "embed_tokens.weight" in names:
        notices.append(
            f"{where} carries embed_tokens: ignored, the target's embeddings are used (as SGLang and vLLM do)"
        )
    readings = aux_readings(cfg, layout)
    n_target = num_target_layers or target.get("num_hidden_layers")
    ids, source, aux_notes = resolve_aux_ids(readings, n_target, fc[1] // target_hidden, where)
    return HeadSpec(
        path=head_dir,
        layout=layout,
        llama=llama,
        vocab_size=vocab,
        draft_vocab_size=int(draft_vocab),
        target_hidden_size=target_hidden,
        aux_layer_ids=ids,
        aux_source=source,
        names=names,
        index=index,
        target=target,
        notices=tuple(notices + list(norms.notices) + aux_notes),
        readings=tuple(readings),
        norm_before_fc=norms.norm_before_fc,
        norm_before_residual=norms.norm_before_residual,
    )


# ---------------------------------------------------------------- weights
_NOT_LLAMA = (
    "architectures",
    "torch_dtype",
    "dtype",
    "norm_output",
    "draft_vocab_size",
    "target_hidden_size",
    "eagle_aux_hidden_state_layer_ids",
    "transformers_version",
    "_name_or_path",
    "norm_before_fc",  # set from the spec: read where the engines read them (head_norms)
    "norm_before_residual",
    "fc_norm",
)


def draft_config(spec: HeadSpec):
    """The LlamaConfig `Eagle3Draft` is built from."""
    from transformers import LlamaConfig

    llama = LlamaConfig(**{k: v for k, v in spec.llama.items() if k not in _NOT_LLAMA})
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
    from .headcheck import refuse_nonfinite

    draft = Eagle3Draft(draft_config(spec))
    with safe_open(str(spec.path / HEAD_WEIGHTS), framework="pt") as f:
        wanted = head_tensor_names(spec.norm_before_fc)
        tensors = {n: f.get_tensor(file_name) for n, file_name in spec.names.items() if n in wanted}
    refuse_nonfinite(tensors, spec.path / HEAD_WEIGHTS)  # a NaN head drafts garbage and engines load it silently
    file_dtype = tensors["fc.weight"].dtype
    if "d2t" not in tensors:  # full-vocab head: draft id = target id
        tensors["d2t"] = torch.zeros(spec.draft_vocab_size, dtype=torch.long)
    d2t = tensors["d2t"].to(torch.long)
    target_ids = torch.arange(spec.draft_vocab_size) + d2t
    if int(target_ids.min()) < 0 or int(target_ids.max()) >= spec.vocab_size:
        raise UsageError(
            f"head {spec.path}: d2t maps draft ids to target ids {int(target_ids.min())}..{int(target_ids.max())}, "
            f"outside the vocab 0..{spec.vocab_size - 1}",
            "d2t = target id - draft id",
            NEXT,
        )
    if "t2d" not in tensors:
        t2d = torch.zeros(spec.vocab_size, dtype=torch.bool)
        t2d[target_ids] = True
        tensors["t2d"] = t2d
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
    if target_model is not None:
        copy_target_embeddings(draft, target_model)
    return draft.eval()


def load_any_head(head_dir: Path, target_model=None, dtype: torch.dtype | None = None) -> tuple[Eagle3Draft, HeadSpec]:
    """(draft, spec) for a head of any layout; with a target, its layer count and embeddings."""
    n_layers = target_model.config.num_hidden_layers if target_model is not None else None
    spec = read_head(head_dir, n_layers)
    return load_head_weights(spec, target_model, dtype), spec


# ---------------------------------------------------------------- the target's embeddings
# Here, with the loader, not in the draft: the shape refusal is a UsageError, which the method
# wing (speculate/) does not know.
def copy_target_embeddings(draft: Eagle3Draft, target_model) -> None:
    """The target's input embeddings into the draft, frozen (the head never stores its own)."""
    copy_embeddings(draft, target_model.get_input_embeddings().weight)


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
    if t2d is None:
        t2d = torch.zeros(draft.config.vocab_size, dtype=torch.bool)
        t2d[torch.arange(len(d2t)) + d2t] = True
    draft.set_vocab_maps(d2t, t2d)
    target_ids = torch.arange(len(d2t)) + d2t
    if lm_head is not None and lm_head.shape[1] == draft.lm_head.weight.shape[1]:
        draft.lm_head.weight.copy_(lm_head[target_ids.to(lm_head.device)].to(draft.lm_head.weight))
    if norm is not None and norm.shape == draft.norm.weight.shape:
        draft.norm.weight.copy_(norm.to(draft.norm.weight) + norm_offset)
