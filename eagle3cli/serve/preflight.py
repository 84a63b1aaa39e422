"""Checks that run before a GPU is spent: does the engine load *this* head the way it was trained?

Every check is a pure function returning a list of `Problem`s (what is wrong + the fix), so the
CLI can report all of them at once. Engines accept several wrong heads without a word:

  * no `d2t` in model.safetensors: SGLang's `hot_token_id` stays None and draft id i is read as
    target id i, so acceptance collapses to ~0 while the server looks healthy;
  * explicit aux layer ids, which SGLang and vLLM read in different conventions (`aux_ids.py`);
  * `draft_vocab_size` missing: SGLang fails late; `null`: it loads the target's lm_head instead;
  * `tie_word_embeddings: true`: the trained lm_head is replaced by the embeddings;
  * unknown tensor names: SGLang's loader skips names it cannot map, leaving random weights;
  * attention/MLP biases: SGLang's EAGLE-3 layer has no q/k/v bias, vLLM's has them (heads carry none);
  * a target family the engine cannot capture aux states from (`model.engines`): it fails at startup;
  * EAGLE-3.1's norms (`norm_before_fc`, `norm_before_residual`): vLLM reads both, SGLang neither
    (it would skip input_norm.weight and add the raw residual), so SGLang refuses such a head.

Safetensors headers are read with `safe_open` (names, shapes, dtypes) without loading weights;
only the small `d2t`/`t2d` vectors are read to check the id map. The checks of the machine
(engine installed, GPU, port) are in `machine.py`, of the speculation numbers in `commands.py`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..manifest import for_run, model_fingerprint, read_json_object, same_fingerprint
from ..model.engines import SGLANG_NORM_FIX, sglang_norm_problem, target_support
from ..model.heads import (
    HEAD_ARCH,
    HEAD_WEIGHTS,
    detect_layout,
    head_norms,
    read_head,
)
from ..speculate.target import text_config
from .aux_ids import check_aux_ids
from .head_weights import BIAS_FIX, BIAS_WHY, REEXPORT, check_head_weights
from .problems import Problem, error, warning


# ---------------------------------------------------------------- inputs
def read_config(folder: Path, role: str, next_step: str) -> dict:
    """config.json of a model folder (text_config of multimodal targets), or a UsageError."""
    path = Path(folder) / "config.json"
    next_step = for_run(next_step, folder)
    if not Path(folder).is_dir():
        raise UsageError(f"{role} folder {folder} does not exist", "a local model folder with config.json", next_step)
    if not path.exists():
        if (Path(folder) / role / "config.json").exists():  # given runs/NAME instead of runs/NAME/head
            next_step = f"--{role} {Path(folder) / role}"
        raise UsageError(f"{path} does not exist", f"a {role} folder with config.json", next_step)
    return read_json_object(path, "the config.json transformers wrote", next_step)


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
        f", or --engine {other}, which supports {s.architecture}"
        if s.architecture and target_support(other, [s.architecture]).ok
        else ""
    )
    if s.status == "no":
        return [
            error(
                f"{engine} cannot serve an EAGLE-3 head on a {s.architecture} target: {_ENGINE_NEEDS[engine]} and "
                f"this class has none ({s.source}); it would stop at startup after loading the weights",
                f"a target family {engine} supports for EAGLE-3 (docs/serve.md lists them){alt}",
            )
        ]
    if engine == "vllm" and s.architecture is None:
        return [
            error(
                "the target's config.json names no architectures: vLLM picks the model class from them and "
                "refuses to load the target",
                'set "architectures": ["LlamaForCausalLM"] (the class that fits its model_type) in its config.json',
            )
        ]
    if s.status == "unknown":
        return [
            warning(
                f"cannot tell whether {engine} serves EAGLE-3 heads on {s.architecture or 'this target'} "
                f"({s.source}); {_ENGINE_NEEDS[engine]}",
                "check the engine's model file for that support before a long launch",
            )
        ]
    return []


# ---------------------------------------------------------------- the head vs the target
@dataclass(frozen=True)
class Target:
    """What the checks need of the target's config.json."""

    vocab: int
    hidden: int
    layers: int
    max_positions: int
    architectures: list | None
    path: Path


def read_target(target_dir: Path) -> Target:
    raw = read_config(target_dir, "target", "pass --target, the model folder the head was trained for")
    cfg = text_config(raw)
    lacking = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers") if not isinstance(cfg.get(k), int)]
    if lacking:
        raise UsageError(
            f"{target_dir}/config.json has no integer {', '.join(lacking)}",
            "a transformers decoder config (Llama, Qwen, ...)",
            "pass the target model folder as --target",
        )
    archs = raw.get("architectures")
    return Target(
        int(cfg["vocab_size"]),
        int(cfg["hidden_size"]),
        int(cfg["num_hidden_layers"]),
        int(cfg.get("max_position_embeddings") or 0),
        archs if isinstance(archs, list) else None,
        Path(target_dir),
    )


def check_head(head_dir: Path, target_dir: Path, engine: str = "sglang") -> list[Problem]:
    """Everything about the head folder that the engine would accept silently or fail on late."""
    head_dir = Path(head_dir)
    head_cfg = read_config(head_dir, "head", "eagle3 train --run runs/NAME   (exports runs/NAME/head)")
    target = read_target(Path(target_dir))
    problems = check_target_engine(target.architectures, engine)
    layout = detect_layout(head_cfg)
    if layout == "speculators":
        return problems + _check_speculators(head_dir, target, engine)
    config_problems, draft_vocab = check_head_config(head_cfg, target)
    norms = head_norms(head_cfg, layout)
    norm_problems = [error(p, REEXPORT) for p in norms.problems] + _check_norms(
        norms.norm_before_fc, norms.norm_before_residual, engine
    )
    weight_problems, n_aux_fc = check_head_weights(
        head_dir / HEAD_WEIGHTS,
        head_cfg.get("hidden_size"),
        target.hidden,
        target.vocab,
        draft_vocab,
        norms.norm_before_fc,
    )
    return (
        problems
        + config_problems
        + norm_problems
        + weight_problems
        + check_aux_ids(head_cfg, target.layers, engine, n_aux_fc)
    )


def _check_norms(norm_before_fc: bool, norm_before_residual: bool, engine: str) -> list[Problem]:
    """EAGLE-3.1's norms on an engine whose EAGLE-3 loader does not read them (SGLang's)."""
    problem = sglang_norm_problem(norm_before_fc, norm_before_residual) if engine == "sglang" else None
    return [error(problem, SGLANG_NORM_FIX)] if problem else []


def check_head_config(head_cfg: dict, t: Target) -> tuple[list[Problem], int | None]:
    """The head's config.json against the target; also its draft vocab size when that is usable."""
    problems = _check_sizes(head_cfg, t)
    draft_vocab, vocab_problems = _draft_vocab(head_cfg, t.vocab)
    return problems + vocab_problems + _check_switches(head_cfg, t) + _check_training_target(head_cfg, t), draft_vocab


def _check_sizes(head_cfg: dict, t: Target) -> list[Problem]:
    problems = []
    if HEAD_ARCH not in (head_cfg.get("architectures") or []):
        problems.append(
            error(
                f"architectures is {head_cfg.get('architectures')}; the engines pick the EAGLE-3 draft class by name",
                f'set "architectures": ["{HEAD_ARCH}"]',
            )
        )
    if head_cfg.get("vocab_size") != t.vocab:
        problems.append(
            error(
                f"head vocab_size {head_cfg.get('vocab_size')} != target vocab_size {t.vocab}",
                "serve the head with the target it was trained for (eagle3.target in its config)",
            )
        )
    if head_cfg.get("hidden_size") != t.hidden:
        problems.append(
            error(
                f"head hidden_size {head_cfg.get('hidden_size')} != target hidden_size {t.hidden}",
                "serve the head with the target it was trained for",
            )
        )
    if "target_hidden_size" in head_cfg and head_cfg["target_hidden_size"] != t.hidden:
        problems.append(
            error(
                f"head target_hidden_size {head_cfg['target_hidden_size']} != target hidden_size {t.hidden}",
                "serve the head with the target it was trained for",
            )
        )
    return problems


def _draft_vocab(head_cfg: dict, t_vocab: int) -> tuple[int | None, list[Problem]]:
    """draft_vocab_size: missing, null (SGLang then loads the target's lm_head) or out of range."""
    draft_vocab = head_cfg.get("draft_vocab_size", "<missing>")
    if draft_vocab == "<missing>":
        return None, [
            error(
                "draft_vocab_size is missing from the head's config.json (SGLang fails to build the draft lm_head)",
                f'add "draft_vocab_size": <rows of lm_head.weight>, or {REEXPORT}',
            )
        ]
    if draft_vocab is None:
        return None, [
            error(
                "draft_vocab_size is null: SGLang then loads the TARGET's lm_head into the draft and "
                "ignores the trained one",
                'set "draft_vocab_size" to the rows of lm_head.weight',
            )
        ]
    if not isinstance(draft_vocab, int) or not 1 <= draft_vocab <= t_vocab:
        return None, [
            error(f"draft_vocab_size {draft_vocab!r} is not an integer in 1..{t_vocab} (target vocab)", REEXPORT)
        ]
    return draft_vocab, []


def _check_switches(head_cfg: dict, t: Target) -> list[Problem]:
    """Config fields that make an engine build a different draft than the one trained."""
    problems = []
    if "tie_word_embeddings" not in head_cfg:
        problems.append(
            warning(
                "tie_word_embeddings is not written: the engines then take the config class's "
                "default (false for Llama today)",
                '"tie_word_embeddings": false, explicitly',
            )
        )
    elif head_cfg["tie_word_embeddings"] is not False:
        problems.append(
            error(
                f"tie_word_embeddings is {json.dumps(head_cfg['tie_word_embeddings'])}: the engines "
                f"replace the trained lm_head with the (target's) embeddings",
                '"tie_word_embeddings": false in the head\'s config.json',
            )
        )
    if head_cfg.get("norm_output"):
        problems.append(
            error(
                "norm_output is true: SGLang would feed the draft its own NORMED hidden state at "
                "later steps, but the head was trained on the pre-norm one",
                '"norm_output": false in the head\'s config.json',
            )
        )
    biased = [k for k in ("attention_bias", "mlp_bias", "bias", "qkv_bias") if head_cfg.get(k)]
    if biased:
        problems.append(error(f"{', '.join(biased)} true in the head's config.json: {BIAS_WHY}", BIAS_FIX))
    h_maxpos = int(head_cfg.get("max_position_embeddings") or 0)
    if h_maxpos < t.max_positions:
        problems.append(
            error(
                f"head max_position_embeddings {h_maxpos} < target's {t.max_positions}: the draft's rotary "
                f"tables and context limit come from it",
                f'"max_position_embeddings": {t.max_positions} (or more) in the head\'s config.json',
            )
        )
    if head_cfg.get("num_hidden_layers") != 1:
        problems.append(
            error(
                f"num_hidden_layers is {head_cfg.get('num_hidden_layers')}; an eagle3 head has one "
                f"decoder layer (midlayer)",
                '"num_hidden_layers": 1',
            )
        )
    return problems


def _check_training_target(head_cfg: dict, t: Target) -> list[Problem]:
    """The target the head records (eagle3.target) against --target."""
    problems = []
    target_id = (head_cfg.get("eagle3") or {}).get("target") or {}
    if target_id.get("num_hidden_layers") not in (None, t.layers):
        problems.append(
            error(
                f"the head was trained on a {target_id['num_hidden_layers']}-layer target "
                f"({target_id.get('path')}); --target has {t.layers} layers",
                f"--target {target_id.get('path') or '<the training target>'}",
            )
        )
    if target_id.get("fingerprint") and not same_fingerprint(target_id["fingerprint"], model_fingerprint(t.path)):
        problems.append(
            warning(
                f"--target {t.path} is not byte-identical to the training target "
                f"({target_id.get('path')}, fingerprint {target_id['fingerprint']})",
                "fine for a re-saved or re-quantised copy; otherwise pass the training target",
            )
        )
    return problems


def _check_speculators(head_dir: Path, t: Target, engine: str) -> list[Problem]:
    """A `speculators` checkpoint: vLLM reads it as it is; SGLang needs eagle3's layout."""
    fix = f"eagle3 export --head {head_dir} --format {engine} --out {head_dir}-{engine}"
    problems: list[Problem] = []
    if engine == "sglang":
        problems.append(
            error(
                "the head is in the speculators layout (transformer_layer_config, layers.0.*), which SGLang's "
                "LlamaForCausalLMEagle3 does not read",
                fix,
            )
        )
    try:
        spec = read_head(head_dir, t.layers)
    except UsageError as e:
        return problems + [error(e.what, fix)]
    problems += [warning(n, fix) for n in spec.notices]
    problems += _check_norms(spec.norm_before_fc, spec.norm_before_residual, engine)
    if spec.vocab_size != t.vocab:
        problems.append(
            error(f"head vocab_size {spec.vocab_size} != target vocab_size {t.vocab}", "the training target")
        )
    if spec.target_hidden_size != t.hidden:
        problems.append(
            error(
                f"head target_hidden_size {spec.target_hidden_size} != target hidden_size {t.hidden}",
                "the training target",
            )
        )
    return problems
