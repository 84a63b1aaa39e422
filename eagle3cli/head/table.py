"""THE table of a head folder: every config field and tensor, where each layout writes it and where
each engine reads it. Adding a field to a head is one row here; the reader (`read.py`), the writer
(`write.py`), export's layouts, the GGUF check and the engines' checks (`check.py`) take their key
lists from these rows, and `tests/unit/test_head_table.py` walks every row through all of them.

Layouts (`Layout`): eagle3 (ours: `train`'s RUN/head, `export --format sglang|vllm`), sglang (a
SpecForge head: `eagle_config` ids, no `eagle3` block), vllm (top-level ids only), speculators
(vLLM's `speculators` format: the Llama layer nested in `transformer_layer_config`), gguf
(llama.cpp's converter output: `eagle3.*` keys and llama.cpp tensor names).

Engines' readings (SGLang `srt/models/llama_eagle3.py` 0.5.23, vLLM `model_executor/models/
llama_eagle3.py` + `transformers_utils/configs/speculators/algos.py`, llama.cpp `convert_hf_to_gguf.py`
+ `src/models/eagle3.cpp`) are in each row's `sglang`, `vllm` and `gguf` columns: a key path, or
None where the engine does not read the field at all (SGLang never reads norm_before_residual).
"""

from __future__ import annotations

from dataclasses import dataclass

HEAD_WEIGHTS = "model.safetensors"
HEAD_ARCH = "LlamaForCausalLMEagle3"
# vLLM registers both names for the same class.
HEAD_ARCHS = (HEAD_ARCH, "Eagle3LlamaForCausalLM")
SPECULATORS_ARCH = "Eagle3Speculator"
FLOAT_DTYPES = ("F32", "BF16", "F16", "F64")
ENGINES = ("eagle3", "sglang", "vllm", "llama.cpp")  # eagle3: eval's own decoder (and train's --init-head)
ENGINE_NAMES = {"eagle3": "eagle3", "sglang": "SGLang", "vllm": "vLLM", "llama.cpp": "llama.cpp"}  # in messages
# `export --format F` writes for the engine that serves it, and asks that engine's check of what it wrote
FORMAT_ENGINE = {"sglang": "sglang", "vllm": "vllm", "speculators": "vllm", "gguf": "llama.cpp"}


@dataclass(frozen=True)
class Field:
    """One config field of a head that is not a plain Llama layer field.

    `eagle3` is where eagle3's layout writes it (a dotted key path; None: not written), `speculators`
    where the speculators layout writes it, `sglang`/`vllm`/`gguf` where each engine reads it, first
    place first (None: never read). `value` is what eagle3 writes (a description). `kind`: "head" (an
    EAGLE-3 field, not a Llama layer field: kept out of the draft's LlamaConfig and of a speculators
    `transformer_layer_config`), "layer" (a Llama layer field the engines read specially) or "meta"
    (file metadata, never a model setting: not passed to the LlamaConfig).

    `must`: the one value a head may hold here (what eagle3 writes), `why`: what the engines do with
    another; `head.check` refuses another value for every engine, or with `serving` for SGLang and vLLM
    only; without the key, `missing` says what SGLang and vLLM do then (a warning), and `required` rows
    are refused by them."""

    name: str
    eagle3: str | None
    speculators: str | None
    sglang: tuple[str, ...] | None
    vllm: tuple[str, ...] | None
    gguf: str | None
    value: str
    kind: str = "head"
    must: object = None
    why: str = ""
    serving: bool = False
    missing: str = ""
    required: bool = False

    @property
    def paths(self) -> tuple[str, ...]:
        """Every key path the row names, in any layout or engine."""
        return tuple(p for p in (self.eagle3, self.speculators, *(self.sglang or ()), *(self.vllm or ())) if p)


# fmt: off
FIELDS: tuple[Field, ...] = (
    Field("architectures", "architectures", "architectures", ("architectures",), ("architectures",),
          "general.architecture", f"[{HEAD_ARCH}] (speculators: [{SPECULATORS_ARCH}]; gguf: eagle3)"),
    Field("draft_vocab_size", "draft_vocab_size", "draft_vocab_size", ("draft_vocab_size",), ("draft_vocab_size",),
          None, "rows of lm_head.weight (SGLang fails without it; null loads the target's lm_head)"),
    Field("target_hidden_size", "target_hidden_size", "target_hidden_size", ("target_hidden_size",),
          ("target_hidden_size",), "eagle3.target_hidden_size", "the target's hidden size"),
    Field("aux_layer_ids", "eagle3.aux_layer_ids", "eagle3.aux_layer_ids", None, None, None,
          "eagle3's own ids, hidden_states[k] (k = the input of decoder layer k), ascending"),
    Field("sglang_aux_layer_ids", "eagle_config.eagle_aux_hidden_state_layer_ids", None,
          ("eagle_config.eagle_aux_hidden_state_layer_ids",), None, None,
          "k - 1 (SGLang captures the output of layer id, the input of id + 1)"),
    Field("vllm_aux_layer_ids", "eagle_aux_hidden_state_layer_ids", "eagle_aux_hidden_state_layer_ids", None,
          ("eagle_aux_hidden_state_layer_ids",), "eagle3.target_layers", "k (hidden_states[k])"),
    Field("use_aux_hidden_state", "eagle_config.use_aux_hidden_state", None,
          ("eagle_config.use_aux_hidden_state",), None, None, "true", must=True,
          why="SGLang would feed the head only the last hidden state (not an EAGLE-3, multi-layer feature, head)"),
    Field("norm_before_fc", "norm_before_fc", "norm_before_fc", ("eagle_config.norm_before_fc", "norm_before_fc"),
          ("eagle_config.norm_before_fc", "norm_before_fc"), "eagle3.norm_before_fc",
          "EAGLE-3.1: one RMSNorm (input_norm.weight) over the concatenated aux features before fc"),
    Field("norm_before_residual", "norm_before_residual", "norm_before_residual", None, ("norm_before_residual",),
          "eagle3.norm_before_residual",
          "EAGLE-3.1: the layer's residual is the normed hidden state (speculators: missing = true)"),
    Field("fc_norm", None, None, ("eagle_config.fc_norm",), ("fc_norm",), None,
          "never written: one norm per aux feature, a variant eagle3's draft does not implement (refused)"),
    Field("norm_output", "norm_output", None, ("norm_output",), None, None, "false", serving=True, must=False,
          why="SGLang would feed the draft its own NORMED hidden state at later steps, but the head was trained "
          "on the pre-norm one"),
    Field("tie_word_embeddings", "tie_word_embeddings", "transformer_layer_config.tie_word_embeddings",
          ("tie_word_embeddings",), ("tie_word_embeddings",), None,
          "false", "layer", must=False, why="the engines replace the trained lm_head with the (target's) embeddings",
          missing="the engines then take the config class's default (false for Llama today)"),
    Field("num_hidden_layers", "num_hidden_layers", "transformer_layer_config.num_hidden_layers",
          ("num_hidden_layers",), ("num_hidden_layers",), "eagle3.block_count", "1", "layer", must=1, required=True,
          why="an eagle3 head has one decoder layer (midlayer)"),
    Field("eagle3", "eagle3", "eagle3", None, None, None,
          "eagle3's block: aux_layer_ids, target (identity), target_architectures, converted_from"),
    Field("eagle_config", "eagle_config", None, ("eagle_config",), ("eagle_config",), None,
          "SGLang's block: its aux ids (k - 1) and use_aux_hidden_state"),
    Field("torch_dtype", "torch_dtype", "torch_dtype", None, None, None, "the weights' dtype", "meta"),
    Field("transformers_version", None, None, None, None, None, "dropped (not part of a head)", "meta"),
    Field("_name_or_path", None, None, None, None, None, "dropped (not part of a head)", "meta"),
    Field("dtype", None, None, None, None, None, "dropped (transformers 5's spelling of torch_dtype)", "meta"),
    Field("speculators_model_type", None, "speculators_model_type", None, ("speculators_model_type",), None,
          "eagle3 (speculators layout only)"),
    Field("speculators_config", None, "speculators_config", None, ("speculators_config",), None,
          "proposal methods and the verifier (the target: name_or_path, architectures)"),
    Field("transformer_layer_config", None, "transformer_layer_config", None, ("transformer_layer_config",), None,
          "the Llama layer config (speculators layout only)"),
)


@dataclass(frozen=True)
class Tensor:
    """One tensor of a head's model.safetensors: eagle3's name (speculators: `midlayer.` written as
    `layers.0.`; engines also accept a `model.` prefix), its GGUF name in llama.cpp, its shape in
    words, and when a head has it ("always", "norm_before_fc", "optional": read and ignored)."""

    name: str
    gguf: str | None
    shape: str
    present: str = "always"
    map: bool = False  # an integer/bool id map, not a weight


TENSORS: tuple[Tensor, ...] = (
    Tensor("fc.weight", "fc.weight", "(hidden, n_aux * target_hidden)"),
    Tensor("midlayer.self_attn.q_proj.weight", "blk.0.attn_q.weight", "(heads * head_dim, 2 * hidden); gguf: rows rope-permuted"),
    Tensor("midlayer.self_attn.k_proj.weight", "blk.0.attn_k.weight", "(kv_heads * head_dim, 2 * hidden); gguf: rope-permuted"),
    Tensor("midlayer.self_attn.v_proj.weight", "blk.0.attn_v.weight", "(kv_heads * head_dim, 2 * hidden)"),
    Tensor("midlayer.self_attn.o_proj.weight", "blk.0.attn_output.weight", "(hidden, heads * head_dim)"),
    Tensor("midlayer.mlp.gate_proj.weight", "blk.0.ffn_gate.weight", "(intermediate, hidden)"),
    Tensor("midlayer.mlp.up_proj.weight", "blk.0.ffn_up.weight", "(intermediate, hidden)"),
    Tensor("midlayer.mlp.down_proj.weight", "blk.0.ffn_down.weight", "(hidden, intermediate)"),
    Tensor("midlayer.input_layernorm.weight", "blk.0.attn_norm.weight", "(hidden,)"),
    Tensor("midlayer.hidden_norm.weight", "blk.0.attn_norm_2.weight", "(hidden,)"),
    Tensor("midlayer.post_attention_layernorm.weight", "blk.0.ffn_norm.weight", "(hidden,)"),
    Tensor("norm.weight", "output_norm.weight", "(hidden,)"),
    Tensor("lm_head.weight", "output.weight", "(draft_vocab, hidden)"),
    Tensor("d2t", "d2t", "(draft_vocab,) int64: target id - draft id; gguf: absolute target ids", map=True),
    Tensor("t2d", None, "(vocab,) bool: the target ids of the draft vocab (engines skip it)", map=True),
    Tensor("input_norm.weight", "enc.output_norm.weight", "(n_aux * target_hidden,)", present="norm_before_fc"),
    Tensor("embed_tokens.weight", None, "(vocab, hidden): never written; the target's are used", present="optional"),
)
# fmt: on

INPUT_NORM = "input_norm.weight"
HEAD_TENSOR_NAMES = tuple(t.name for t in TENSORS if t.present == "always")
OPTIONAL_TENSOR_NAMES = tuple(t.name for t in TENSORS if t.present == "optional")
MAP_TENSORS = tuple(t.name for t in TENSORS if t.map)
# Top-level config keys of the "head" rows: left out of a speculators `transformer_layer_config` and,
# with the "meta" rows, out of the draft's LlamaConfig.
HEAD_KEYS = tuple(sorted({p.split(".")[0] for f in FIELDS if f.kind == "head" for p in f.paths}))
NOT_LLAMA_KEYS = HEAD_KEYS + tuple(f.name for f in FIELDS if f.kind == "meta")
GGUF_TENSOR_NAMES = {t.name: t.gguf for t in TENSORS if t.gguf}


def head_tensor_names(norm_before_fc: bool) -> tuple[str, ...]:
    """The tensors a head has: every "always" row, and input_norm.weight with norm_before_fc."""
    return HEAD_TENSOR_NAMES + ((INPUT_NORM,) if norm_before_fc else ())


def canonical_name(name: str) -> str:
    """The eagle3 name an engine maps this checkpoint name to (`model.` dropped, layers.0 = midlayer)."""
    if name.startswith("model."):
        name = name[len("model.") :]
    if name.startswith("layers.0."):
        name = "midlayer." + name[len("layers.0.") :]
    return name


def get_path(cfg: dict, path: str):
    """The value at a dotted key path of a config (None when any level is missing)."""
    value: object = cfg
    for key in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def field(name: str) -> Field:
    return next(f for f in FIELDS if f.name == name)
