"""A head's model.safetensors, read from its header (and the small d2t/t2d vectors) without
loading the weights: names SGLang can map (it skips others silently, leaving random weights),
bias tensors, shapes against the config, finite values, and a d2t/t2d id map that maps draft
ids to distinct target ids."""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError
from ..model.headcheck import load_head_tensors
from ..model.heads import (
    HEAD_TENSOR_NAMES,
    INPUT_NORM,
    OPTIONAL_TENSOR_NAMES,
    TensorInfo,
    canonical_name,
    head_tensor_names,
    read_tensor_index,
)
from .problems import Problem, error, warning

REEXPORT = "re-export the head: eagle3 train --run runs/NAME --resume"
# The EAGLE-3 layer's biases: SGLang builds q/k/v without bias whatever the config says and
# skips their tensors, but gives o_proj a bias when `attention_bias` is set (left unset if the
# file has none); vLLM builds and loads all of them. One head, two different models.
BIAS_WHY = (
    "SGLang drops the q/k/v biases of an EAGLE-3 layer (and leaves o_proj's unset when absent) while "
    "vLLM loads them, so the engines would run different drafts"
)
BIAS_FIX = "re-export the head with eagle3 (heads carry no biases, whatever the target's attention_bias)"


def check_head_weights(
    weights: Path, h_hidden, t_hidden: int, t_vocab: int, draft_vocab: int | None, norm_before_fc: bool = False
) -> tuple[list[Problem], int | None]:
    """model.safetensors, from its header (and the small d2t/t2d): names the engines map, shapes,
    finite values, the id map. Also how many aux features fc reads (None when unknown).
    `norm_before_fc` (EAGLE-3.1, from the config): the head must then have input_norm.weight."""
    if not weights.exists():
        return [error(f"{weights} does not exist", REEXPORT)], None
    try:
        index = read_tensor_index(weights)
    except Exception as e:  # noqa: BLE001 — a truncated or foreign file: report, do not crash
        return [error(f"{weights} is not a readable safetensors file ({type(e).__name__}: {e})", REEXPORT)], None
    problems: list[Problem] = []
    try:  # engines load NaN/inf weights without a word
        load_head_tensors(weights)
    except UsageError as e:
        problems.append(error(e.what, e.next_step or REEXPORT))
    canon: dict[str, tuple[str, TensorInfo]] = {}
    for name, info in index.items():
        canon.setdefault(canonical_name(name), (name, info))
    problems += _check_names(index, canon, norm_before_fc)
    n_aux_fc, shape_problems = _check_shapes(canon, h_hidden, t_hidden, draft_vocab)
    return problems + shape_problems + _check_vocab_map(weights, canon, draft_vocab, t_vocab), n_aux_fc


def _check_names(index: dict, canon: dict, norm_before_fc: bool) -> list[Problem]:
    """Tensors SGLang cannot map (skipped silently), biases, and required tensors missing."""
    problems = []
    wanted = head_tensor_names(norm_before_fc)
    known = set(wanted) | set(OPTIONAL_TENSOR_NAMES)
    if INPUT_NORM in canon and not norm_before_fc:
        problems.append(
            error(
                f"model.safetensors has {canon[INPUT_NORM][0]} but config.json does not set norm_before_fc: "
                "vLLM drops the tensor then, and the head would draft without the norm it was trained with",
                '"norm_before_fc": true in the head\'s config.json, if it was trained with it; else ' + REEXPORT,
            )
        )
        known.add(INPUT_NORM)
    unknown = sorted(n for n in index if canonical_name(n) not in known)
    biases = [n for n in unknown if n.endswith(".bias")]
    if biases:
        problems.append(error(f"model.safetensors has bias tensors ({', '.join(biases[:6])}): {BIAS_WHY}", BIAS_FIX))
        unknown = [n for n in unknown if n not in biases]
    if unknown:
        problems.append(
            error(
                f"model.safetensors has tensor(s) SGLang cannot map and skips silently: "
                f"{', '.join(unknown[:8])}{' ...' if len(unknown) > 8 else ''}",
                f"rename them to the head names ({', '.join(HEAD_TENSOR_NAMES[:3])}, ...) or {REEXPORT}",
            )
        )
    required = [n for n in wanted if n not in ("d2t", "t2d")]
    missing = [n for n in required if n not in canon]
    if missing:
        problems.append(
            error(f"model.safetensors lacks {', '.join(missing)}: the engine would run those weights random", REEXPORT)
        )
    return problems


def _check_shapes(canon: dict, h_hidden, t_hidden: int, draft_vocab: int | None) -> tuple[int | None, list[Problem]]:
    def shape(n: str) -> tuple[int, ...] | None:
        return canon[n][1].shape if n in canon else None

    problems = []
    n_aux_fc = None
    fc = shape("fc.weight")
    if fc is not None:
        if len(fc) != 2 or fc[0] != h_hidden or fc[1] % t_hidden:
            problems.append(error(f"fc.weight has shape {fc}, expected ({h_hidden}, n_aux * {t_hidden})", REEXPORT))
        else:
            n_aux_fc = fc[1] // t_hidden
    norm_in = shape(INPUT_NORM)
    if norm_in is not None and fc is not None and len(fc) == 2 and norm_in != (fc[1],):
        problems.append(error(f"{INPUT_NORM} has shape {norm_in}, expected ({fc[1]},): fc's input width", REEXPORT))
    q = shape("midlayer.self_attn.q_proj.weight")
    if q is not None and isinstance(h_hidden, int) and (len(q) != 2 or q[1] != 2 * h_hidden):
        problems.append(
            error(
                f"midlayer.self_attn.q_proj.weight has shape {q}; an EAGLE-3 midlayer reads "
                f"[embed; hidden] = {2 * h_hidden} features",
                REEXPORT,
            )
        )
    norm = shape("norm.weight")
    if norm is not None and norm != (h_hidden,):
        problems.append(error(f"norm.weight has shape {norm}, expected ({h_hidden},)", REEXPORT))
    lm = shape("lm_head.weight")
    if lm is not None and draft_vocab is not None and lm != (draft_vocab, h_hidden):
        problems.append(
            error(
                f"lm_head.weight has shape {lm}, but config says draft_vocab_size={draft_vocab}, "
                f"hidden_size={h_hidden}",
                f'set "draft_vocab_size": {lm[0]} or {REEXPORT}',
            )
        )
    return n_aux_fc, problems


def _check_vocab_map(weights: Path, canon: dict, draft_vocab: int | None, t_vocab: int) -> list[Problem]:
    """d2t must exist when the draft vocab is smaller, be int64, and map to distinct in-range target ids."""
    problems: list[Problem] = []
    if draft_vocab is None:
        return problems
    if "d2t" not in canon:
        if draft_vocab < t_vocab:
            problems.append(
                error(
                    f"model.safetensors has no d2t although draft_vocab_size {draft_vocab} < vocab "
                    f"{t_vocab}: the engine maps draft id i to target id i and acceptance collapses",
                    f"{REEXPORT} (the exporter writes d2t = target_id - draft_id)",
                )
            )
        return problems
    name, info = canon["d2t"]
    if info.shape != (draft_vocab,) or info.dtype != "I64":
        problems.append(
            error(f"d2t has shape {info.shape} dtype {info.dtype}, expected ({draft_vocab},) int64", REEXPORT)
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
            error(
                f"d2t maps draft ids to target ids {int(target_ids.min())}..{int(target_ids.max())}, "
                f"outside the target vocab 0..{t_vocab - 1}",
                REEXPORT,
            )
        )
    elif len(torch.unique(target_ids)) != draft_vocab:
        problems.append(error("d2t maps several draft ids to the same target id", REEXPORT))
    if t2d is None and not problems and draft_vocab < t_vocab and not bool(d2t.any()):
        # all zeros is a valid map when the data used only ids 0..N-1 (a small target's data); only
        # t2d can confirm it, and without one this is also what a head exported without d2t holds
        problems.append(
            warning(
                "d2t is all zeros and there is no t2d to confirm it: the draft vocab is target ids "
                "0..N-1, which is also what a missing d2t looks like",
                "check the draft-vocab step of `eagle3 cache` (its vocab.json lists the chosen ids)",
            )
        )
    if t2d is not None and not problems:
        if tuple(t2d.shape) != (t_vocab,) or t2d.dtype != torch.bool:
            problems.append(
                error(f"t2d has shape {tuple(t2d.shape)} dtype {t2d.dtype}, expected ({t_vocab},) bool", REEXPORT)
            )
        elif int(t2d.sum()) != draft_vocab or not bool(t2d[target_ids].all()):
            problems.append(error("t2d disagrees with d2t (they name different target ids)", REEXPORT))
    return problems
