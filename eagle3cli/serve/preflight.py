"""Checks that run before a GPU is spent: does the engine load *this* head the way it was trained?

Every check is a pure function returning a list of `Problem`s (what is wrong + the fix), so the
CLI can report all of them at once. Engines accept several wrong heads without a word:

  * no `d2t` in model.safetensors: SGLang's `hot_token_id` stays None and draft id i is read as
    target id i, so acceptance collapses to ~0 while the server looks healthy;
  * explicit aux layer ids: SGLang reads `eagle_config.eagle_aux_hidden_state_layer_ids` as
    "output of layer k" and captures `hidden_states[k+1]`; vLLM reads the top-level
    `eagle_aux_hidden_state_layer_ids` as `hidden_states[k]`; a head that writes the same numbers
    in both places therefore gets different features in the two engines;
  * `draft_vocab_size` missing: SGLang fails late; `null`: it loads the target's lm_head instead;
  * `tie_word_embeddings: true`: the trained lm_head is replaced by the embeddings;
  * unknown tensor names: SGLang's loader skips names it cannot map, leaving random weights;
  * attention/MLP biases: SGLang's EAGLE-3 layer has no q/k/v bias, vLLM's has them (heads carry none);
  * a target family the engine cannot capture aux states from (`model.engines`): it fails at startup.

Safetensors headers are read with `safe_open` (names, shapes, dtypes) without loading weights;
only the small `d2t`/`t2d` vectors are read to check the id map.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..manifest import model_fingerprint, read_json_object
from ..model.engines import target_support
from ..model.headcheck import load_head_tensors
from ..model.heads import (
    HEAD_ARCH,
    HEAD_TENSOR_NAMES,
    HEAD_WEIGHTS,
    OPTIONAL_TENSOR_NAMES,
    TensorInfo,
    aux_readings,
    canonical_name,
    default_engine_aux_ids,
    detect_layout,
    read_head,
    read_tensor_index,
    resolve_aux_ids,
)

INSTALL = {
    "sglang": 'pip install "sglang>=0.5,<0.6"   (on a CUDA node; or: pip install "eagle3cli[serve]")',
    "vllm": 'pip install "vllm>=0.10"   (on a CUDA node; or: pip install "eagle3cli[vllm]")',
}
# `embed_tokens.weight` is loaded if present (heads usually leave it out and share the target's).
_OPTIONAL_NAMES = OPTIONAL_TENSOR_NAMES
__all__ = ["TensorInfo", "read_tensor_index", "default_engine_aux_ids"]


# The EAGLE-3 layer's biases: SGLang builds q/k/v without bias whatever the config says and
# skips their tensors, but gives o_proj a bias when `attention_bias` is set (left unset if the
# file has none); vLLM builds and loads all of them. One head, two different models.
_BIAS_WHY = (
    "SGLang drops the q/k/v biases of an EAGLE-3 layer (and leaves o_proj's unset when absent) while "
    "vLLM loads them, so the engines would run different drafts"
)
_BIAS_FIX = "re-export the head with eagle3 (heads carry no biases, whatever the target's attention_bias)"


@dataclass(frozen=True)
class Problem:
    what: str
    fix: str
    severity: str = "error"  # "error" stops serve; "warning" is printed and serve goes on

    @property
    def is_error(self) -> bool:
        return self.severity == "error"


def _err(what: str, fix: str) -> Problem:
    return Problem(what, fix, "error")


def _warn(what: str, fix: str) -> Problem:
    return Problem(what, fix, "warning")


# ---------------------------------------------------------------- inputs
def read_config(folder: Path, role: str, next_step: str) -> dict:
    """config.json of a model folder (text_config of multimodal targets), or a UsageError."""
    path = Path(folder) / "config.json"
    if not Path(folder).is_dir():
        raise UsageError(f"{role} folder {folder} does not exist", "a local model folder with config.json", next_step)
    if not path.exists():
        if (Path(folder) / role / "config.json").exists():  # given runs/NAME instead of runs/NAME/head
            next_step = f"--{role} {Path(folder) / role}"
        raise UsageError(f"{path} does not exist", f"a {role} folder with config.json", next_step)
    return read_json_object(path, "the config.json transformers wrote", next_step)


def _text_cfg(cfg: dict) -> dict:
    return cfg.get("text_config") or cfg


def _canonical(name: str) -> str:
    """The head-contract name SGLang would map this checkpoint name to."""
    return canonical_name(name)


# ---------------------------------------------------------------- aux layer ids
def _int_list(value) -> list[int] | None:
    """A list of ints from config JSON, or None when absent/empty; raises ValueError when malformed."""
    if not value:
        return None
    if not isinstance(value, list) or not all(isinstance(k, int) and not isinstance(k, bool) for k in value):
        raise ValueError(f"{value!r} is not a list of integers")
    return value


def sglang_hidden_ids(head_cfg: dict, num_layers: int) -> tuple[list[int], str]:
    """The hidden_states indices SGLang feeds this head, and where they come from."""
    ids = _int_list((head_cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids"))
    if ids:
        # SGLang: "for the ith layer, it takes the output of the (i-1)th layer" -> it adds 1.
        return [int(k) + 1 for k in ids], f"eagle_config.eagle_aux_hidden_state_layer_ids={list(ids)} (+1)"
    return default_engine_aux_ids(num_layers), "SGLang's default (no eagle_config ids)"


def vllm_hidden_ids(head_cfg: dict, num_layers: int) -> tuple[list[int], str]:
    """The hidden_states indices vLLM feeds this head (top-level ids, read as hidden_states[k])."""
    ids = _int_list(head_cfg.get("eagle_aux_hidden_state_layer_ids"))
    if ids:
        return [int(k) for k in ids], f"eagle_aux_hidden_state_layer_ids={list(ids)}"
    return default_engine_aux_ids(num_layers), "vLLM's default (no top-level ids)"


def _check_aux_ids(head_cfg: dict, target_layers: int, engine: str, n_aux_fc: int | None) -> list[Problem]:
    problems: list[Problem] = []
    try:
        trained = _int_list((head_cfg.get("eagle3") or {}).get("aux_layer_ids"))
        resolved = {
            "sglang": sglang_hidden_ids(head_cfg, target_layers),
            "vllm": vllm_hidden_ids(head_cfg, target_layers),
        }
    except ValueError as e:
        return [
            _err(
                f"an aux layer id field of the head's config.json is malformed: {e}",
                "lists of integers: eagle3.aux_layer_ids, eagle_config.eagle_aux_hidden_state_layer_ids, "
                "eagle_aux_hidden_state_layer_ids",
            )
        ]
    eagle_cfg = head_cfg.get("eagle_config") or {}
    if eagle_cfg.get("use_aux_hidden_state") is False:
        problems.append(
            _err(
                "eagle_config.use_aux_hidden_state is false: SGLang would feed the head only the last hidden state",
                "set eagle_config.use_aux_hidden_state to true in the head's config.json (or re-export the head)",
            )
        )
    if trained is None:
        # a head from another tool: the common reader decides which layers it was trained on
        try:
            ids, source, notices = resolve_aux_ids(
                aux_readings(head_cfg, detect_layout(head_cfg)), target_layers, None, "the head"
            )
        except UsageError as e:
            return problems + [_err(e.what, e.next_step or "fix the head's aux layer fields")]
        trained_ids = list(ids)
        fix = (
            "record the layers the head was trained on: eagle3.aux_layer_ids (hidden_states indices), "
            "eagle_config ids = k-1 for SGLang, top-level ids = k for vLLM"
        )
        problems += [_warn(n, fix) for n in notices]
        if not notices:
            problems.append(
                _warn(f"the head has no eagle3.aux_layer_ids; taking hidden_states{trained_ids} from {source}", fix)
            )
    else:
        trained_ids = [int(k) for k in trained]
        bad = [k for k in trained_ids if not 1 <= k <= target_layers - 1]
        if bad:
            problems.append(
                _err(
                    f"eagle3.aux_layer_ids {trained_ids} include {bad}, outside 1..{target_layers - 1} for a "
                    f"{target_layers}-layer target",
                    "serve the head with the target it was trained on",
                )
            )
    label = "eagle3.aux_layer_ids" if trained is not None else "its config"
    for eng, (ids, source) in resolved.items():
        if ids == trained_ids:
            continue
        want = [k - 1 for k in trained_ids] if eng == "sglang" else trained_ids
        field = (
            "eagle_config.eagle_aux_hidden_state_layer_ids"
            if eng == "sglang"
            else "top-level eagle_aux_hidden_state_layer_ids"
        )
        msg = (
            f"{eng} would feed hidden_states{ids} from {source}, but the head was trained on "
            f"hidden_states{trained_ids} ({label})"
        )
        fix = f"set {field} to {want} in the head's config.json"
        problems.append(_err(msg, fix) if eng == engine else _warn(msg + f" (only matters for --engine {eng})", fix))
    if n_aux_fc is not None and n_aux_fc != len(trained_ids):
        problems.append(
            _err(
                f"fc.weight reads {n_aux_fc} aux features, but the config names {len(trained_ids)} aux layers "
                f"({trained_ids})",
                "re-export the head; its config.json and weights come from different runs",
            )
        )
    return problems


# ---------------------------------------------------------------- the target vs the engine
_ENGINE_NEEDS = {
    "sglang": "SGLang needs set_eagle3_layers_to_capture on the target's model class",
    "vllm": "vLLM needs the SupportsEagle3 interface on the target's model class",
}


def check_target_engine(architectures, engine: str) -> list[Problem]:
    """Refuse a target the engine cannot capture EAGLE-3 features from (it would fail at startup,
    after minutes of weight loading); warn when eagle3's table does not know the architecture."""
    s = target_support(engine, architectures if isinstance(architectures, list) else None)
    other = "vllm" if engine == "sglang" else "sglang"
    alt = (
        f", or --engine {other}, which supports {s.architecture}" if target_support(other, [s.architecture]).ok else ""
    )
    if s.status == "no":
        return [
            _err(
                f"{engine} cannot serve an EAGLE-3 head on a {s.architecture} target: {_ENGINE_NEEDS[engine]} and "
                f"this class has none ({s.source}); it would stop at startup after loading the weights",
                f"a target family {engine} supports for EAGLE-3 (docs/serve.md lists them){alt}",
            )
        ]
    if s.status == "unknown":
        return [
            _warn(
                f"cannot tell whether {engine} serves EAGLE-3 heads on {s.architecture or 'this target'} "
                f"({s.source}); {_ENGINE_NEEDS[engine]}",
                "check the engine's model file for that support before a long launch",
            )
        ]
    return []


# ---------------------------------------------------------------- the head vs the target
def check_head(head_dir: Path, target_dir: Path, engine: str = "sglang") -> list[Problem]:
    """Everything about the head folder that the engine would accept silently or fail on late."""
    head_dir, target_dir = Path(head_dir), Path(target_dir)
    head_cfg = read_config(head_dir, "head", "eagle3 train --run runs/NAME   (exports runs/NAME/head)")
    target_raw = read_config(target_dir, "target", "pass --target, the model folder the head was trained for")
    target_cfg = _text_cfg(target_raw)
    weights = head_dir / HEAD_WEIGHTS
    problems: list[Problem] = []
    reexport = "re-export the head: eagle3 train --run runs/NAME --resume"

    lacking = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers") if not isinstance(target_cfg.get(k), int)]
    if lacking:
        raise UsageError(
            f"{target_dir}/config.json has no integer {', '.join(lacking)}",
            "a transformers decoder config (Llama, Qwen, ...)",
            "pass the target model folder as --target",
        )
    t_vocab, t_hidden = int(target_cfg["vocab_size"]), int(target_cfg["hidden_size"])
    t_layers = int(target_cfg["num_hidden_layers"])
    t_maxpos = int(target_cfg.get("max_position_embeddings") or 0)
    problems += check_target_engine(target_raw.get("architectures"), engine)
    if detect_layout(head_cfg) == "speculators":
        return problems + _check_speculators(head_dir, t_layers, t_vocab, t_hidden, engine)

    # --- config.json
    if HEAD_ARCH not in (head_cfg.get("architectures") or []):
        problems.append(
            _err(
                f"architectures is {head_cfg.get('architectures')}; the engines pick the EAGLE-3 draft class by name",
                f'set "architectures": ["{HEAD_ARCH}"]',
            )
        )
    if head_cfg.get("vocab_size") != t_vocab:
        problems.append(
            _err(
                f"head vocab_size {head_cfg.get('vocab_size')} != target vocab_size {t_vocab}",
                "serve the head with the target it was trained for (eagle3.target in its config)",
            )
        )
    h_hidden = head_cfg.get("hidden_size")
    if h_hidden != t_hidden:
        problems.append(
            _err(
                f"head hidden_size {h_hidden} != target hidden_size {t_hidden}",
                "serve the head with the target it was trained for",
            )
        )
    if "target_hidden_size" in head_cfg and head_cfg["target_hidden_size"] != t_hidden:
        problems.append(
            _err(
                f"head target_hidden_size {head_cfg['target_hidden_size']} != target hidden_size {t_hidden}",
                "serve the head with the target it was trained for",
            )
        )
    draft_vocab = head_cfg.get("draft_vocab_size", "<missing>")
    if draft_vocab == "<missing>":
        problems.append(
            _err(
                "draft_vocab_size is missing from the head's config.json (SGLang fails to build the draft lm_head)",
                f'add "draft_vocab_size": <rows of lm_head.weight>, or {reexport}',
            )
        )
        draft_vocab = None
    elif draft_vocab is None:
        problems.append(
            _err(
                "draft_vocab_size is null: SGLang then loads the TARGET's lm_head into the draft and "
                "ignores the trained one",
                'set "draft_vocab_size" to the rows of lm_head.weight',
            )
        )
    elif not isinstance(draft_vocab, int) or not 1 <= draft_vocab <= t_vocab:
        problems.append(
            _err(f"draft_vocab_size {draft_vocab!r} is not an integer in 1..{t_vocab} (target vocab)", reexport)
        )
        draft_vocab = None
    if "tie_word_embeddings" not in head_cfg:
        problems.append(
            _warn(
                "tie_word_embeddings is not written: the engines then take the config class's "
                "default (false for Llama today)",
                '"tie_word_embeddings": false, explicitly',
            )
        )
    elif head_cfg["tie_word_embeddings"] is not False:
        problems.append(
            _err(
                f"tie_word_embeddings is {json.dumps(head_cfg['tie_word_embeddings'])}: the engines "
                f"replace the trained lm_head with the (target's) embeddings",
                '"tie_word_embeddings": false in the head\'s config.json',
            )
        )
    if head_cfg.get("norm_output"):
        problems.append(
            _err(
                "norm_output is true: SGLang would feed the draft its own NORMED hidden state at "
                "later steps, but the head was trained on the pre-norm one",
                '"norm_output": false in the head\'s config.json',
            )
        )
    biased = [k for k in ("attention_bias", "mlp_bias", "bias", "qkv_bias") if head_cfg.get(k)]
    if biased:
        problems.append(_err(f"{', '.join(biased)} true in the head's config.json: {_BIAS_WHY}", _BIAS_FIX))
    h_maxpos = int(head_cfg.get("max_position_embeddings") or 0)
    if h_maxpos < t_maxpos:
        problems.append(
            _err(
                f"head max_position_embeddings {h_maxpos} < target's {t_maxpos}: the draft's rotary "
                f"tables and context limit come from it",
                f'"max_position_embeddings": {t_maxpos} (or more) in the head\'s config.json',
            )
        )
    if head_cfg.get("num_hidden_layers") != 1:
        problems.append(
            _err(
                f"num_hidden_layers is {head_cfg.get('num_hidden_layers')}; an eagle3 head has one "
                f"decoder layer (midlayer)",
                '"num_hidden_layers": 1',
            )
        )
    target_id = (head_cfg.get("eagle3") or {}).get("target") or {}
    if target_id.get("num_hidden_layers") not in (None, t_layers):
        problems.append(
            _err(
                f"the head was trained on a {target_id['num_hidden_layers']}-layer target "
                f"({target_id.get('path')}); --target has {t_layers} layers",
                f"--target {target_id.get('path') or '<the training target>'}",
            )
        )
    if target_id.get("fingerprint") and target_id["fingerprint"] != model_fingerprint(target_dir):
        problems.append(
            _warn(
                f"--target {target_dir} is not byte-identical to the training target "
                f"({target_id.get('path')}, fingerprint {target_id['fingerprint']})",
                "fine for a re-saved or re-quantised copy; otherwise pass the training target",
            )
        )

    # --- model.safetensors (header only)
    if not weights.exists():
        problems.append(_err(f"{weights} does not exist", reexport))
        return problems + _check_aux_ids(head_cfg, t_layers, engine, None)
    try:
        index = read_tensor_index(weights)
    except Exception as e:  # noqa: BLE001 — a truncated or foreign file: report, do not crash
        problems.append(_err(f"{weights} is not a readable safetensors file ({type(e).__name__}: {e})", reexport))
        return problems + _check_aux_ids(head_cfg, t_layers, engine, None)
    try:  # engines load NaN/inf weights without a word
        load_head_tensors(weights)
    except UsageError as e:
        problems.append(_err(e.what, e.next_step or reexport))
    canon = {}
    for name, info in index.items():
        canon.setdefault(_canonical(name), (name, info))
    known = set(HEAD_TENSOR_NAMES) | set(_OPTIONAL_NAMES)
    unknown = sorted(n for n in index if _canonical(n) not in known)
    biases = [n for n in unknown if n.endswith(".bias")]
    if biases:
        problems.append(_err(f"model.safetensors has bias tensors ({', '.join(biases[:6])}): {_BIAS_WHY}", _BIAS_FIX))
        unknown = [n for n in unknown if n not in biases]
    if unknown:
        problems.append(
            _err(
                f"model.safetensors has tensor(s) SGLang cannot map and skips silently: "
                f"{', '.join(unknown[:8])}{' ...' if len(unknown) > 8 else ''}",
                f"rename them to the head names ({', '.join(HEAD_TENSOR_NAMES[:3])}, ...) or {reexport}",
            )
        )
    required = [n for n in HEAD_TENSOR_NAMES if n not in ("d2t", "t2d")]
    missing = [n for n in required if n not in canon]
    if missing:
        problems.append(
            _err(f"model.safetensors lacks {', '.join(missing)}: the engine would run those weights random", reexport)
        )

    def shape(n: str) -> tuple[int, ...] | None:
        return canon[n][1].shape if n in canon else None

    n_aux_fc = None
    fc = shape("fc.weight")
    if fc is not None:
        if len(fc) != 2 or fc[0] != h_hidden or fc[1] % t_hidden:
            problems.append(_err(f"fc.weight has shape {fc}, expected ({h_hidden}, n_aux * {t_hidden})", reexport))
        else:
            n_aux_fc = fc[1] // t_hidden
    q = shape("midlayer.self_attn.q_proj.weight")
    if q is not None and isinstance(h_hidden, int) and (len(q) != 2 or q[1] != 2 * h_hidden):
        problems.append(
            _err(
                f"midlayer.self_attn.q_proj.weight has shape {q}; an EAGLE-3 midlayer reads "
                f"[embed; hidden] = {2 * h_hidden} features",
                reexport,
            )
        )
    norm = shape("norm.weight")
    if norm is not None and norm != (h_hidden,):
        problems.append(_err(f"norm.weight has shape {norm}, expected ({h_hidden},)", reexport))
    lm = shape("lm_head.weight")
    if lm is not None and draft_vocab is not None and lm != (draft_vocab, h_hidden):
        problems.append(
            _err(
                f"lm_head.weight has shape {lm}, but config says draft_vocab_size={draft_vocab}, "
                f"hidden_size={h_hidden}",
                f'set "draft_vocab_size": {lm[0]} or {reexport}',
            )
        )
    problems += _check_vocab_map(weights, canon, draft_vocab, t_vocab, reexport)
    problems += _check_aux_ids(head_cfg, t_layers, engine, n_aux_fc)
    return problems


def _check_speculators(head_dir: Path, t_layers: int, t_vocab: int, t_hidden: int, engine: str) -> list[Problem]:
    """A `speculators` checkpoint: vLLM reads it as it is; SGLang needs eagle3's layout."""
    fix = f"eagle3 export --head {head_dir} --format {engine} --out {head_dir}-{engine}"
    problems: list[Problem] = []
    if engine == "sglang":
        problems.append(
            _err(
                "the head is in the speculators layout (transformer_layer_config, layers.0.*), which SGLang's "
                "LlamaForCausalLMEagle3 does not read",
                fix,
            )
        )
    try:
        spec = read_head(head_dir, t_layers)
    except UsageError as e:
        return problems + [_err(e.what, fix)]
    problems += [_warn(n, fix) for n in spec.notices]
    if spec.vocab_size != t_vocab:
        problems.append(
            _err(f"head vocab_size {spec.vocab_size} != target vocab_size {t_vocab}", "the training target")
        )
    if spec.target_hidden_size != t_hidden:
        problems.append(
            _err(
                f"head target_hidden_size {spec.target_hidden_size} != target hidden_size {t_hidden}",
                "the training target",
            )
        )
    return problems


def _check_vocab_map(weights: Path, canon: dict, draft_vocab: int | None, t_vocab: int, reexport: str) -> list[Problem]:
    """d2t must exist when the draft vocab is smaller, be int64, and map to distinct in-range target ids."""
    problems: list[Problem] = []
    if draft_vocab is None:
        return problems
    if "d2t" not in canon:
        if draft_vocab < t_vocab:
            problems.append(
                _err(
                    f"model.safetensors has no d2t although draft_vocab_size {draft_vocab} < vocab "
                    f"{t_vocab}: the engine maps draft id i to target id i and acceptance collapses",
                    f"{reexport} (the exporter writes d2t = target_id - draft_id)",
                )
            )
        return problems
    name, info = canon["d2t"]
    if info.shape != (draft_vocab,) or info.dtype != "I64":
        problems.append(
            _err(f"d2t has shape {info.shape} dtype {info.dtype}, expected ({draft_vocab},) int64", reexport)
        )
        return problems
    import torch
    from safetensors import safe_open

    with safe_open(str(weights), framework="pt") as f:
        d2t = f.get_tensor(name)
        t2d = f.get_tensor(canon["t2d"][0]) if "t2d" in canon else None
    target_ids = torch.arange(draft_vocab) + d2t
    if int(target_ids.min()) < 0 or int(target_ids.max()) >= t_vocab:
        problems.append(
            _err(
                f"d2t maps draft ids to target ids {int(target_ids.min())}..{int(target_ids.max())}, "
                f"outside the target vocab 0..{t_vocab - 1}",
                reexport,
            )
        )
    elif len(torch.unique(target_ids)) != draft_vocab:
        problems.append(_err("d2t maps several draft ids to the same target id", reexport))
    elif draft_vocab < t_vocab and not bool(d2t.any()):
        problems.append(
            _warn(
                "d2t is all zeros: the draft vocab is exactly target ids 0..N-1, which is what a "
                "missing d2t looks like",
                "check the draft-vocab step of `eagle3 cache`",
            )
        )
    if t2d is not None and not problems:
        if tuple(t2d.shape) != (t_vocab,) or t2d.dtype != torch.bool:
            problems.append(
                _err(f"t2d has shape {tuple(t2d.shape)} dtype {t2d.dtype}, expected ({t_vocab},) bool", reexport)
            )
        elif int(t2d.sum()) != draft_vocab or not bool(t2d[target_ids].all()):
            problems.append(_err("t2d disagrees with d2t (they name different target ids)", reexport))
    return problems


# ---------------------------------------------------------------- speculation numbers
def check_spec_flags(steps: int | None, topk: int | None, draft_tokens: int | None) -> list[Problem]:
    """The user gives all three of --steps/--topk/--draft-tokens, or none."""
    given = {"--steps": steps, "--topk": topk, "--draft-tokens": draft_tokens}
    named = [k for k, v in given.items() if v is not None]
    if named and len(named) != 3:
        missing = [k for k, v in given.items() if v is None]
        return [
            _err(
                f"{', '.join(named)} given without {', '.join(missing)}: SGLang fills the rest from its own "
                f"per-model defaults, which may not fit yours",
                "give all three (--steps S --topk K --draft-tokens N), none, or --from-eval runs/NAME/eval",
            )
        ]
    return []


def check_spec_numbers(steps: int, topk: int, draft_tokens: int, engine: str = "sglang") -> list[Problem]:
    """A combination the engine accepts and that means what it says."""
    problems: list[Problem] = []
    for flag, v, low in (("--steps", steps, 1), ("--topk", topk, 1), ("--draft-tokens", draft_tokens, 2)):
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            problems.append(_err(f"{flag} is {v!r}; it must be an integer >= {low}", f"{flag} {max(low, 1) + 1}"))
    if problems:
        return problems
    if draft_tokens > steps * topk + 1:
        problems.append(
            _err(
                f"--draft-tokens {draft_tokens} > steps*topk+1 = {steps * topk + 1}: the tree has "
                f"only that many nodes (root included)",
                f"--draft-tokens {steps * topk + 1} or more --steps/--topk",
            )
        )
    if topk == 1 and draft_tokens != steps + 1:
        problems.append(
            _err(
                f"--topk 1 (a chain) with --draft-tokens {draft_tokens}: a chain of {steps} steps "
                f"verifies exactly steps+1 = {steps + 1} tokens",
                f"--draft-tokens {steps + 1}",
            )
        )
    if engine == "vllm" and topk != 1:
        problems.append(
            _err(
                f"--topk {topk}: vLLM's eagle3 proposer drafts a chain (num_speculative_tokens = steps)",
                f"--topk 1 --draft-tokens {steps + 1}",
            )
        )
    return problems


# ---------------------------------------------------------------- the machine
def check_engine_installed(engine: str, python: str | None = None) -> list[Problem]:
    """The engine importable here, or in the environment of `python` (--engine-python)."""
    module = {"sglang": "sglang", "vllm": "vllm"}[engine]
    if python is not None:
        if not shutil.which(python) and not Path(python).is_file():
            return [_err(f"--engine-python {python} does not exist", "the python of the engine's virtualenv")]
        probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
        if subprocess.run([python, "-c", probe], capture_output=True, timeout=120).returncode != 0:
            return [_err(f"{engine} is not installed in the environment of {python}", INSTALL[engine])]
        return []
    if importlib.util.find_spec(module) is None and not (engine == "vllm" and shutil.which("vllm")):
        return [_err(f"{engine} is not installed in this environment", INSTALL[engine])]
    return []


def check_gpu(engine: str) -> list[Problem]:
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        return [
            _err(
                f"no CUDA device: {engine} serves on GPUs only (torch {torch.__version__} sees none)",
                "run on a GPU node, or add --dry-run to print and validate the command here",
            )
        ]
    return []


def check_port(host: str, port: int) -> list[Problem]:
    """The engine binds host:port; find out now rather than after minutes of weight loading."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        return [_err(f"--host {host} does not resolve ({e})", "--host 127.0.0.1 (local) or 0.0.0.0 (all interfaces)")]
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind(addr)
        except OSError as e:
            return [_err(f"port {port} on {host} is not free ({e.strerror})", f"--port {free_port(host)}")]
    return []


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host if host not in ("0.0.0.0", "") else "127.0.0.1", 0))
        return int(s.getsockname()[1])


def raise_if_errors(problems: list[Problem], next_step: str) -> None:
    """One UsageError naming every error (and its fix); warnings are the caller's to print."""
    errors = [p for p in problems if p.is_error]
    if errors:
        lines = "\n".join(f"  - {p.what}\n    fix: {p.fix}" for p in errors)
        raise UsageError(f"preflight found {len(errors)} problem(s):\n{lines}", None, next_step)
