"""The one head check: `problems(head, target, engine)`, every reason a head folder would be read
wrong, or not at all, by `engine`, as a list (serve reports all of them at once). Every question about
a head folder goes through it: eval and train's `--init-head` through `read.read_head` with the
target's facts (engine "eagle3": what eval's decoder and the converters need), export (what it wrote,
for the engine that serves the format, `table.FORMAT_ENGINE`), `export --format gguf` and serve
("sglang", "vllm", "llama.cpp"). The rules about the target (sizes, layer count, vocabulary hash, max
positions; the chat template and the weights' fingerprint as warnings) are the same for every engine,
so serve refuses every head eval refuses, and more.

What engines accept without a word, and which check catches it:

  * no `d2t` (SGLang's `hot_token_id` stays None: draft id i read as target id i, acceptance ~0), a
    d2t that is not an integer map, maps two draft ids to one target id, leaves the vocab, or that
    t2d contradicts (`speculate.vocab.map_problems`, the one rule for maps);
  * aux layer ids: engine fields in their conventions (`folder.aux_readings`), id 0, ids out of
    layer order (the engines capture in layer order), or an engine falling back to its default;
  * `draft_vocab_size` missing (SGLang fails late) or null (SGLang loads the TARGET's lm_head);
  * `tie_word_embeddings: true` (the trained lm_head replaced by the embeddings), `norm_output`;
  * tensors the loaders skip (SGLang maps unknown names to nothing: random weights), biases (SGLang
    drops q/k/v biases, vLLM loads them), non-float or non-finite weights, shapes;
  * config values no model can be built from (`model.config_check`);
  * EAGLE-3.1's norms an engine does not read (SGLang: `engines.sglang_norm_problem`);
  * a target the engine cannot capture aux states from, or naming no `architectures` (`engines`).

Safetensors headers are read without loading weights, except for the finite check and the small
`d2t`/`t2d` vectors.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from ..errors import StageError, UsageError
from ..model.config_check import config_problems
from ..run_folder.manifest import (
    model_fingerprint,
    same_fingerprint,
    tokenizer_fingerprint,
)
from ..speculate.aux_layers import (
    aux_layer_problems,
    default_aux_layer_ids,
    sglang_id_problems,
    sglang_ids,
)
from ..speculate.target import text_config
from ..speculate.vocab import map_problems
from .engines import SGLANG_NORM_FIX, sglang_first_id_rule, sglang_norm_problem, target_support
from .folder import (
    AuxReading,
    HeadFolder,
    HeadNorms,
    aux_readings,
    head_norms,
    read_config,
    read_folder,
    resolve_aux_ids,
)
from .table import (
    ENGINE_NAMES,
    ENGINES,
    FIELDS,
    FLOAT_DTYPES,
    HEAD_ARCH,
    HEAD_ARCHS,
    HEAD_TENSOR_NAMES,
    HEAD_WEIGHTS,
    INPUT_NORM,
    MAP_TENSORS,
    OPTIONAL_TENSOR_NAMES,
    TENSORS,
    canonical_name,
    get_path,
    head_tensor_names,
)
from .table import field as table_field

REEXPORT = "re-export the head: eagle3 train --run runs/NAME --resume"
RETRAIN = "retrain the head: eagle3 train --run runs/NAME --no-resume (training stops at the first non-finite loss)"
# The EAGLE-3 layer's biases: SGLang builds q/k/v without bias whatever the config says and
# skips their tensors, but gives o_proj a bias when `attention_bias` is set (left unset if the
# file has none); vLLM builds and loads all of them. One head, two different models.
BIAS_WHY = (
    "SGLang drops the q/k/v biases of an EAGLE-3 layer (and leaves o_proj's unset when absent) while "
    "vLLM loads them, so the engines would run different drafts"
)
BIAS_FIX = "re-export the head with eagle3 (heads carry no biases, whatever the target's attention_bias)"
SERVING = ("sglang", "vllm")
NORMS_1D = tuple(t.name for t in TENSORS if t.shape == "(hidden,)")  # the table's norm rows


@dataclass(frozen=True)
class Problem:
    what: str
    fix: str
    severity: str = "error"  # "error" stops the stage; "warning" is printed and the stage goes on

    @property
    def is_error(self) -> bool:
        return self.severity == "error"


def error(what: str, fix: str) -> Problem:
    return Problem(what, fix, "error")


def warning(what: str, fix: str) -> Problem:
    return Problem(what, fix, "warning")


# ---------------------------------------------------------------- finite weights
def nonfinite_tensors(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of the floating-point tensors holding a NaN or an inf."""
    return [n for n, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]


def load_head_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a head's model.safetensors; StageError if it is unreadable or not finite."""
    from safetensors.torch import load_file

    path = Path(path)
    try:
        tensors = load_file(str(path))
    except Exception as e:  # noqa: BLE001 — SafetensorError/OSError for truncated or foreign files
        raise StageError(
            f"{path} is not a readable safetensors file ({type(e).__name__}: {str(e)[:200]})",
            "a head exported by `eagle3 train`",
            RETRAIN,
        ) from e
    refuse_nonfinite(tensors, path)
    return tensors


def refuse_nonfinite(tensors: Mapping[str, torch.Tensor], path: Path) -> None:
    """StageError naming the tensors of `path` that hold a NaN or an inf."""
    bad = nonfinite_tensors(tensors)
    if bad:
        raise StageError(
            f"{path} holds non-finite values (NaN or inf) in {', '.join(bad[:6])}"
            + (f" and {len(bad) - 6} more" if len(bad) > 6 else ""),
            "a head whose weights are all finite",
            RETRAIN,
        )


# ---------------------------------------------------------------- the target
@dataclass(frozen=True)
class TargetFacts:
    """What the checks need of the target: its config.json, and its identity (the hashes a head
    records of the target it was trained for) as the caller computed it, else read on first use."""

    vocab: int
    hidden: int
    layers: int
    max_positions: int
    architectures: list | None
    path: Path
    identity: Mapping | None = None  # eval's and train's `target_identity`, already computed

    def ident(self, key: str) -> str | None:
        """The target's `fingerprint`, `vocab_hash` or `chat_template_hash`."""
        if self.identity and self.identity.get(key):
            return self.identity[key]
        return model_fingerprint(self.path) if key == "fingerprint" else self._tokenizer_hashes.get(key)

    @cached_property
    def _tokenizer_hashes(self) -> dict:
        from ..model.target import load_tokenizer

        try:
            return tokenizer_fingerprint(load_tokenizer(self.path))
        except UsageError:  # no tokenizer (or no chat template) here: nothing to compare
            return {}


def read_target(target_dir: Path, identity: Mapping | None = None) -> TargetFacts:
    raw = read_config(target_dir, "target", "pass --target, the model folder the head was trained for")
    return target_facts(raw, Path(target_dir), identity)


def target_facts(raw: dict, path: Path, identity: Mapping | None = None) -> TargetFacts:
    """The facts of a target config (config.json as read, or a loaded config's `to_dict()`)."""
    cfg = text_config(raw)
    lacking = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers") if not isinstance(cfg.get(k), int)]
    if lacking:
        raise UsageError(
            f"{path}/config.json has no integer {', '.join(lacking)}",
            "a transformers decoder config (Llama, Qwen, ...)",
            "pass the target model folder as --target",
        )
    archs = raw.get("architectures")
    return TargetFacts(
        int(cfg["vocab_size"]),
        int(cfg["hidden_size"]),
        int(cfg["num_hidden_layers"]),
        int(cfg.get("max_position_embeddings") or 0),
        archs if isinstance(archs, list) else None,
        Path(path),
        identity,
    )


_ENGINE_NEEDS = {
    "sglang": "SGLang needs set_eagle3_layers_to_capture on the target's model class",
    "vllm": "vLLM needs the SupportsEagle3 interface on the target's model class",
}
_NO_ARCHITECTURES = {
    "sglang": "SGLang's ModelConfig reads architectures[0] before any weight loads (a TypeError on null)",
    "vllm": "vLLM picks the model class from them and refuses to load the target",
}


def target_engine_problems(architectures, engine: str) -> list[Problem]:
    """Refuse a target the engine cannot capture EAGLE-3 features from (it would fail at startup,
    after minutes of weight loading) or cannot load at all (no `architectures`); warn when eagle3's
    table does not know the architecture."""
    s = target_support(engine, architectures if isinstance(architectures, list) else None)
    other = "vllm" if engine == "sglang" else "sglang"
    name = ENGINE_NAMES[engine]
    alt = (
        f", or --engine {other}, which supports {s.architecture}"
        if s.architecture and target_support(other, [s.architecture]).ok
        else ""
    )
    if s.status == "no":
        return [
            error(
                f"{name} cannot serve an EAGLE-3 head on a {s.architecture} target: {_ENGINE_NEEDS[engine]} and "
                f"this class has none ({s.source}); it would stop at startup after loading the weights",
                f"a target family {name} supports for EAGLE-3 (docs/serve.md lists them){alt}",
            )
        ]
    if s.architecture is None:
        return [
            error(
                f"the target's config.json names no architectures: {_NO_ARCHITECTURES[engine]}",
                'set "architectures": ["LlamaForCausalLM"] (the class that fits its model_type) in its config.json',
            )
        ]
    if s.status == "unknown":
        return [
            warning(
                f"cannot tell whether {name} serves EAGLE-3 heads on {s.architecture} "
                f"({s.source}); {_ENGINE_NEEDS[engine]}",
                "check the engine's model file for that support before a long launch",
            )
        ]
    return []


# ---------------------------------------------------------------- the one check
def problems(head_dir: Path, target: Path | TargetFacts | None = None, engine: str = "eagle3") -> list[Problem]:
    """Everything about the head folder that `engine` would fail on, late or never. `target`: the
    target folder (or its facts) the head is to run on; without one, the head is checked against
    itself (its vocab, the layer count it records)."""
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r} not in {ENGINES}")
    t = read_target(Path(target)) if target is not None and not isinstance(target, TargetFacts) else target
    return judge(read_folder(head_dir), t, engine).problems


@dataclass(frozen=True)
class Judged:
    """A parsed folder judged for an engine: every problem, and what the checks read on the way, from
    which `read.read_head` builds its HeadSpec (one parse of each field)."""

    problems: list[Problem]
    norms: HeadNorms
    draft_vocab: int | None
    readings: tuple[AuxReading, ...] = ()
    aux_ids: tuple[int, ...] = ()
    aux_source: str = ""


def judge(
    f: HeadFolder, t: TargetFacts | None, engine: str, num_target_layers: int | None = None, finite: bool = True
) -> Judged:
    """`problems` of a parsed folder, with what was read (`read.read_head` asks this with engine
    "eagle3", and leaves the finite check, which reads every weight, to the loader: `finite=False`)."""
    norms = head_norms(f.cfg, f.layout)
    # the target's class: --target's, else the one the head records (an export checked without its target)
    archs = t.architectures if t is not None else f.target_architectures
    found = target_engine_problems(archs, engine) if engine in SERVING and (t is not None or archs) else []
    found += _config(f, t, engine, norms)
    draft_vocab, vocab_problems = _draft_vocab(f, t, engine)
    n_aux_fc, tensor_problems = _tensors(f, t, draft_vocab, norms.norm_before_fc, finite)
    layers = t.layers if t is not None else num_target_layers or f.target.get("num_hidden_layers")
    aux_problems, readings, aux = _aux(f, layers, engine, n_aux_fc, sglang_first_id_rule(archs))
    found += vocab_problems + tensor_problems + aux_problems
    return Judged(found, norms, draft_vocab, tuple(readings), *(aux or ((), "")))


def _config(f: HeadFolder, t: TargetFacts | None, engine: str, norms) -> list[Problem]:
    cfg, llama, serving = f.cfg, f.llama, engine in SERVING
    out: list[Problem] = []
    if f.layout == "speculators":
        if engine == "sglang":
            out.append(
                error(
                    "the head is in the speculators layout (transformer_layer_config, layers.0.*), which SGLang's "
                    "LlamaForCausalLMEagle3 does not read",
                    f"eagle3 export --head {f.path} --format sglang --out {f.path}-sglang",
                )
            )
        if not llama:
            out.append(error("a speculators config without transformer_layer_config", "an Eagle3Speculator config"))
    else:
        archs = cfg.get("architectures") or []
        allowed = (HEAD_ARCH,) if engine == "sglang" else HEAD_ARCHS
        if not any(a in allowed for a in archs):
            out.append(
                error(
                    f"architectures is {cfg.get('architectures')}; the engines pick the EAGLE-3 draft class by name "
                    f"(one of {list(allowed)})",
                    f'set "architectures": ["{HEAD_ARCH}"]',
                )
            )
    missing = [k for k in ("hidden_size", "num_attention_heads", "vocab_size") if llama.get(k) is None]
    if missing:
        out.append(error(f"no {', '.join(missing)} in the draft layer's config", REEXPORT))
    out += [error(f"config.json: {p}", REEXPORT) for p in config_problems(llama, required=False)]
    for row in FIELDS:  # the rows with the one value a head may hold (`Field.must`)
        if row.must is None or (row.serving and not serving):
            continue
        key = row.eagle3 or row.name
        value = llama.get(key) if row.kind == "layer" else get_path(cfg, key)
        fix = f"set {key} to {json.dumps(row.must)} in the head's config.json"
        if value is None and serving and row.missing:
            out.append(warning(f"{key} is not written: {row.missing}", fix))
        wrong = value != row.must or type(value) is not type(row.must)  # 0 is not false here
        if wrong and (value is not None or (serving and row.required)):
            out.append(error(f"{key} is {json.dumps(value)}: {row.why}", fix))
    biased = [k for k in ("attention_bias", "mlp_bias", "bias", "qkv_bias") if llama.get(k)]
    if biased:
        out.append(error(f"{', '.join(biased)} true in the head's config.json: {BIAS_WHY}", BIAS_FIX))
    out += [error(p, REEXPORT) for p in norms.problems]
    out += [warning(n, REEXPORT) for n in norms.notices]
    problem = sglang_norm_problem(norms.norm_before_fc, norms.norm_before_residual) if engine == "sglang" else None
    if problem:
        out.append(error(problem, SGLANG_NORM_FIX))
    return out + (_against_target(f, t) if t is not None else [])


def _against_target(f: HeadFolder, t: TargetFacts) -> list[Problem]:
    """The head's sizes and recorded target against --target: the same rules for every engine (eval's
    decoder included), so serve refuses every head eval refuses."""
    out = []
    same = f"--target {f.target_ref or '<the training target>'} (the target the head was trained for)"
    for key, want in (("vocab_size", t.vocab), ("hidden_size", t.hidden)):
        if f.llama.get(key) != want:
            out.append(error(f"head {key} {f.llama.get(key)} != target {key} {want}", same))
    th = f.cfg.get("target_hidden_size", f.llama.get("target_hidden_size"))
    if th is not None and th != t.hidden:
        out.append(error(f"head target_hidden_size {th} != target hidden_size {t.hidden}", same))
    h_maxpos = f.llama.get("max_position_embeddings") or 0
    if isinstance(h_maxpos, int) and h_maxpos < t.max_positions:
        out.append(
            error(
                f"head max_position_embeddings {h_maxpos} < target's {t.max_positions}: the engines take the "
                "draft's rotary tables and context limit from it",
                f'"max_position_embeddings": {t.max_positions} (or more) in the head\'s config.json',
            )
        )
    rec = f.target
    if rec.get("num_hidden_layers") not in (None, t.layers):
        out.append(
            error(
                f"the head was trained on a {rec['num_hidden_layers']}-layer target "
                f"({rec.get('path')}); --target has {t.layers} layers",
                same,
            )
        )
    vocab = t.ident("vocab_hash") if rec.get("vocab_hash") else None  # the tokenizer is read only when needed
    if vocab and vocab != rec["vocab_hash"]:
        out.append(
            error(
                f"the head was trained with another vocabulary (vocab hash {rec['vocab_hash'][:12]}, "
                f"--target's is {vocab[:12]}): its token ids mean other tokens here",
                same,
            )
        )
    template = t.ident("chat_template_hash") if rec.get("chat_template_hash") else None
    if template and template != rec["chat_template_hash"]:
        out.append(
            warning(
                f"the head was trained on conversations rendered with another chat template "
                f"({rec['chat_template_hash'][:12]}, this target's is {template[:12]}): prompts here are "
                "rendered differently and acceptance may suffer",
                same,
            )
        )
    if rec.get("fingerprint") and not same_fingerprint(rec["fingerprint"], t.ident("fingerprint")):
        out.append(
            warning(
                f"--target {t.path} is not byte-identical to the training target (fingerprint "
                f"{rec['fingerprint']}): acceptance may suffer",
                "fine for a re-saved or re-quantised copy; otherwise pass the training target",
            )
        )
    return out


def _draft_vocab(f: HeadFolder, t: TargetFacts | None, engine: str) -> tuple[int | None, list[Problem]]:
    """draft_vocab_size: missing (SGLang fails), null (SGLang then loads the target's lm_head) or out of
    range; eval takes lm_head.weight's rows when it is missing or null, and says so."""
    # as written: top level, else in the layer config
    raw: Any = next((w["draft_vocab_size"] for w in (f.cfg, f.llama) if "draft_vocab_size" in w), "<missing>")
    lm = f.shape("lm_head.weight")
    if raw in ("<missing>", None):
        if engine not in SERVING:
            notice = f"{f.where} has no draft_vocab_size: taking lm_head.weight's rows (SGLang needs it set)"
            return (lm[0] if lm else None), [warning(notice, REEXPORT)]
        if raw is None:
            what = "draft_vocab_size is null: SGLang then loads the TARGET's lm_head into the draft and ignores the trained one"
            return None, [error(what, 'set "draft_vocab_size" to the rows of lm_head.weight')]
        what = "draft_vocab_size is missing from the head's config.json (SGLang fails to build the draft lm_head)"
        return None, [error(what, f'add "draft_vocab_size": <rows of lm_head.weight>, or {REEXPORT}')]
    vocab = t.vocab if t is not None else f.llama.get("vocab_size")
    top = vocab if isinstance(vocab, int) else raw
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= top:
        return None, [error(f"draft_vocab_size {raw!r} is not an integer in 1..{top} (target vocab)", REEXPORT)]
    return raw, []


def _tensors(
    f: HeadFolder, t: TargetFacts | None, draft_vocab: int | None, norm_before_fc: bool, finite: bool = True
) -> tuple[int | None, list[Problem]]:
    """model.safetensors: readable, finite, names the engines map, floats, shapes, the id map. Also how
    many aux features fc reads (None when unknown)."""
    if f.index is None:
        return None, [error(f.unreadable or "model.safetensors cannot be read", REEXPORT)]
    out: list[Problem] = []
    try:  # engines load NaN/inf weights without a word
        if finite:
            load_head_tensors(f.path / HEAD_WEIGHTS)
    except UsageError as e:
        out.append(error(e.what, e.next_step or REEXPORT))
    wanted = head_tensor_names(norm_before_fc)
    known = set(wanted) | set(OPTIONAL_TENSOR_NAMES)
    if INPUT_NORM in f.names and not norm_before_fc:
        out.append(
            error(
                f"{f.names[INPUT_NORM]} is in model.safetensors but norm_before_fc is not set in config.json: "
                "vLLM drops the tensor then, and the head would draft without the norm it was trained with",
                '"norm_before_fc": true in the head\'s config.json, if it was trained with it; else ' + REEXPORT,
            )
        )
        known.add(INPUT_NORM)
    unknown = sorted(n for n in f.index if canonical_name(n) not in known)
    biases = [n for n in unknown if n.endswith(".bias")]
    if biases:
        out.append(error(f"model.safetensors has bias tensors ({', '.join(biases[:6])}): {BIAS_WHY}", BIAS_FIX))
        unknown = [n for n in unknown if n not in biases]
    if unknown:
        out.append(
            error(
                "model.safetensors has tensors eagle3's draft has no place for, which SGLang's loader skips "
                f"silently: {', '.join(unknown[:8])}{' ...' if len(unknown) > 8 else ''}",
                f"rename them to the head names ({', '.join(HEAD_TENSOR_NAMES[:3])}, ...) or {REEXPORT}",
            )
        )
    missing = [n for n in wanted if n not in f.names and n not in MAP_TENSORS]
    if missing:
        flagged = " (norm_before_fc is set)" if INPUT_NORM in missing else ""
        out.append(
            error(
                f"model.safetensors lacks {', '.join(missing)}{flagged}: the engine would run those weights random",
                REEXPORT,
            )
        )
    not_float = [
        f"{n} ({f.index[f.names[n]].dtype})"
        for n in wanted
        if n in f.names and n not in MAP_TENSORS and f.index[f.names[n]].dtype not in FLOAT_DTYPES
    ]
    if not_float:  # an int32 head would "load" and draft nonsense
        out.append(
            error(
                f"weights that are not floating point: {', '.join(not_float[:6])} (expected F32, BF16 or F16)", REEXPORT
            )
        )
    n_aux_fc, shape_problems = _shapes(f, draft_vocab)
    return n_aux_fc, out + shape_problems + _vocab_map(f, t, draft_vocab)


def _shapes(f: HeadFolder, draft_vocab: int | None) -> tuple[int | None, list[Problem]]:
    hidden, t_hidden = f.llama.get("hidden_size"), f.target_hidden
    if not isinstance(hidden, int) or t_hidden is None:
        return None, []  # reported by the config checks
    out, n_aux_fc = [], None
    fc = f.shape("fc.weight")
    if fc is not None:
        if len(fc) != 2 or fc[0] != hidden or fc[1] % t_hidden:
            out.append(error(f"fc.weight has shape {fc}, expected ({hidden}, n_aux * {t_hidden})", REEXPORT))
        else:
            n_aux_fc = fc[1] // t_hidden
    norm_in = f.shape(INPUT_NORM)
    if norm_in is not None and fc is not None and len(fc) == 2 and norm_in != (fc[1],):
        out.append(error(f"{INPUT_NORM} has shape {norm_in}, expected ({fc[1]},): fc's input width", REEXPORT))
    q = f.shape("midlayer.self_attn.q_proj.weight")
    if q is not None and (len(q) != 2 or q[1] != 2 * hidden):
        out.append(
            error(
                f"midlayer.self_attn.q_proj.weight has shape {q}; an EAGLE-3 midlayer reads "
                f"[embed; hidden] = {2 * hidden} features",
                REEXPORT,
            )
        )
    for name in NORMS_1D:
        shape = f.shape(name)
        if shape is not None and shape != (hidden,):
            out.append(error(f"{name} has shape {shape}, expected ({hidden},)", REEXPORT))
    lm = f.shape("lm_head.weight")
    if lm is not None and draft_vocab is not None and lm != (draft_vocab, hidden):
        out.append(
            error(
                f"lm_head.weight has shape {lm}, but config says draft_vocab_size={draft_vocab}, hidden_size={hidden}",
                f'set "draft_vocab_size": {lm[0]} or {REEXPORT}',
            )
        )
    return n_aux_fc, out


def _vocab_map(f: HeadFolder, t: TargetFacts | None, draft_vocab: int | None) -> list[Problem]:
    """d2t must exist when the draft vocab is smaller, and pass the one rule for maps."""
    vocab = t.vocab if t is not None else f.llama.get("vocab_size")
    if draft_vocab is None or not isinstance(vocab, int):
        return []
    if "d2t" not in f.names:
        if draft_vocab < vocab:
            return [
                error(
                    f"model.safetensors has no d2t although draft_vocab_size {draft_vocab} < vocab "
                    f"{vocab}: the engine maps draft id i to target id i and acceptance collapses",
                    f"{REEXPORT} (the exporter writes d2t = target_id - draft_id)",
                )
            ]
        return []
    shape = f.shape("d2t")
    if shape != (draft_vocab,):
        return [error(f"d2t has shape {shape}, expected ({draft_vocab},): one entry per draft id", REEXPORT)]
    from safetensors import safe_open

    with safe_open(str(f.path / HEAD_WEIGHTS), framework="pt") as h:
        d2t = h.get_tensor(f.names["d2t"])
        t2d = h.get_tensor(f.names["t2d"]) if "t2d" in f.names else None
    out = [error(p, REEXPORT) for p in map_problems(d2t, t2d, vocab)]
    if t2d is None and not out and draft_vocab < vocab and not bool(d2t.any()):
        # all zeros is a valid map when the data used only ids 0..N-1 (a small target's data); only
        # t2d can confirm it, and without one this is also what a head exported without d2t holds
        out.append(
            warning(
                "d2t is all zeros and there is no t2d to confirm it: the draft vocab is target ids "
                "0..N-1, which is also what a missing d2t looks like",
                "check the draft-vocab step of `eagle3 cache` (its vocab.json lists the chosen ids)",
            )
        )
    return out


def _aux(f: HeadFolder, layers: int | None, engine: str, n_aux_fc: int | None, first_id_rule: bool):
    """(problems, readings, (ids, source) or None): the layers the head reads (one reading of every
    field, the one rule for ids) and, per serving engine, the layers that engine would feed it
    (SGLang's by the target's class: `first_id_rule`)."""
    fix = "fix the head's aux layer fields"
    readings: list[AuxReading] = []
    try:
        readings = aux_readings(f.cfg, f.layout, first_id_rule)
        ids, source, notices = resolve_aux_ids(readings, layers, n_aux_fc, f.where)
    except UsageError as e:
        return [error(e.what, e.next_step or fix)], readings, None
    record = (
        "record the layers the head was trained on: eagle3.aux_layer_ids (hidden_states indices), "
        "eagle_config ids = k-1 for SGLang (k on its DeepSeek family), top-level ids = k for vLLM"
    )
    out = [warning(n, record) for n in notices]
    if engine == "llama.cpp":
        out += [
            error(p, "a head trained on three aux layers (the default 2,L//2,L-3)")
            for p in llama_cpp_layer_problems(ids, layers)
        ]
    if engine == "sglang":
        out += [
            error(p, "serve it with vLLM, or retrain on ids from 2") for p in sglang_id_problems(ids, first_id_rule)
        ]
    if engine not in SERVING or layers is None:
        return out, readings, (ids, source)
    if not (f.cfg.get("eagle3") or {}).get("aux_layer_ids") and not notices:
        out.append(
            warning(f"the head has no eagle3.aux_layer_ids; taking hidden_states{list(ids)} from {source}", record)
        )
    # an engine's own field agrees with `ids` (`resolve_aux_ids` refuses fields that contradict); without
    # one the engine feeds its default
    fed = list(default_aux_layer_ids(layers))
    for eng in SERVING:
        field = table_field(f"{eng}_aux_layer_ids").eagle3 or ""
        if fed == list(ids) or any(r.field == field for r in readings) or (eng != engine and f.layout == "speculators"):
            continue
        want = sglang_ids(ids, first_id_rule) if eng == "sglang" else list(ids)
        msg = (
            f"{eng} would feed hidden_states{fed} from {ENGINE_NAMES[eng]}'s default (no ids for it), but the head "
            f"was trained on hidden_states{list(ids)}"
        )
        fix = f"set {field} to {want} in the head's config.json"
        out.append(error(msg, fix) if eng == engine else warning(msg + f" (only matters for --engine {eng})", fix))
    return out, readings, (ids, source)


def llama_cpp_layer_problems(layers, target_layers: int | None) -> list[str]:
    """llama.cpp's extract layers: exactly 3 (`eagle3.cpp`), by the one rule for aux ids (1..L-1)."""
    three = [] if len(layers) == 3 else [f"extract layers {list(layers)}: llama.cpp's eagle3 reads exactly 3"]
    return three + aux_layer_problems(layers, target_layers)


def refuse(found: list[Problem], what: str, expected: str | None, next_step: str) -> list[Problem]:
    """UsageError listing every error of `found` (each with its fix); the warnings are returned."""
    errors = [p for p in found if p.is_error]
    if errors:
        lines = "\n  ".join(p.what for p in errors)
        first_fix = errors[0].fix
        raise UsageError(f"{what}:\n  {lines}", expected, first_fix if len(errors) == 1 else next_step)
    return [p for p in found if not p.is_error]


def raise_if_errors(found: list[Problem], next_step: str) -> None:
    """One UsageError naming every error and its fix (serve's preflight); warnings are the caller's to print."""
    errors = [p for p in found if p.is_error]
    if errors:
        lines = "\n".join(f"  - {p.what}\n    fix: {p.fix}" for p in errors)
        raise UsageError(f"preflight found {len(errors)} problem(s):\n{lines}", None, next_step)


__all__ = ["Problem", "TargetFacts", "problems", "raise_if_errors", "read_target", "refuse"]
