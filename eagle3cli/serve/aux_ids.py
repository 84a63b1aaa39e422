"""Which target hidden states each engine feeds a head, against those it was trained on.

eagle3 names aux layers by their index k in `output_hidden_states` (the input of decoder layer k).
SGLang reads `eagle_config.eagle_aux_hidden_state_layer_ids` as "output of layer k" and captures
hidden_states[k+1]; vLLM reads the top-level `eagle_aux_hidden_state_layer_ids` as
hidden_states[k]. A head that writes the same numbers in both places gets different features in
the two engines, without a word from either.
"""

from __future__ import annotations

from ..errors import UsageError
from ..model.heads import aux_readings, detect_layout, resolve_aux_ids
from ..speculate.aux_layers import aux_layer_problems, default_aux_layer_ids, from_sglang_ids, int_list
from .problems import Problem, error, warning


def sglang_hidden_ids(head_cfg: dict, num_layers: int) -> tuple[list[int], str]:
    """The hidden_states indices SGLang feeds this head, and where they come from."""
    ids = int_list((head_cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids"))
    if ids:
        # SGLang: "for the ith layer, it takes the output of the (i-1)th layer" -> it adds 1.
        return from_sglang_ids(ids), f"eagle_config.eagle_aux_hidden_state_layer_ids={list(ids)} (+1)"
    return list(default_aux_layer_ids(num_layers)), "SGLang's default (no eagle_config ids)"


def vllm_hidden_ids(head_cfg: dict, num_layers: int) -> tuple[list[int], str]:
    """The hidden_states indices vLLM feeds this head (top-level ids, read as hidden_states[k])."""
    ids = int_list(head_cfg.get("eagle_aux_hidden_state_layer_ids"))
    if ids:
        return [int(k) for k in ids], f"eagle_aux_hidden_state_layer_ids={list(ids)}"
    return list(default_aux_layer_ids(num_layers)), "vLLM's default (no top-level ids)"


def check_aux_ids(head_cfg: dict, target_layers: int, engine: str, n_aux_fc: int | None) -> list[Problem]:
    problems: list[Problem] = []
    try:
        trained = int_list((head_cfg.get("eagle3") or {}).get("aux_layer_ids"))
        resolved = {
            "sglang": sglang_hidden_ids(head_cfg, target_layers),
            "vllm": vllm_hidden_ids(head_cfg, target_layers),
        }
    except ValueError as e:
        return [
            error(
                f"an aux layer id field of the head's config.json is malformed: {e}",
                "lists of integers: eagle3.aux_layer_ids, eagle_config.eagle_aux_hidden_state_layer_ids, "
                "eagle_aux_hidden_state_layer_ids",
            )
        ]
    eagle_cfg = head_cfg.get("eagle_config") or {}
    if eagle_cfg.get("use_aux_hidden_state") is False:
        problems.append(
            error(
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
            return problems + [error(e.what, e.next_step or "fix the head's aux layer fields")]
        trained_ids = list(ids)
        fix = (
            "record the layers the head was trained on: eagle3.aux_layer_ids (hidden_states indices), "
            "eagle_config ids = k-1 for SGLang, top-level ids = k for vLLM"
        )
        problems += [warning(n, fix) for n in notices]
        if not notices:
            problems.append(
                warning(f"the head has no eagle3.aux_layer_ids; taking hidden_states{trained_ids} from {source}", fix)
            )
    else:
        trained_ids = [int(k) for k in trained]
        problems += [
            error(f"eagle3.aux_layer_ids: {p}", "serve the head with the target it was trained on")
            for p in aux_layer_problems(trained_ids, target_layers)
        ]
    label = "eagle3.aux_layer_ids" if trained is not None else "its config"
    for eng, (fed, source) in resolved.items():
        if fed == trained_ids:
            continue
        want = [k - 1 for k in trained_ids] if eng == "sglang" else trained_ids
        field = (
            "eagle_config.eagle_aux_hidden_state_layer_ids"
            if eng == "sglang"
            else "top-level eagle_aux_hidden_state_layer_ids"
        )
        msg = (
            f"{eng} would feed hidden_states{fed} from {source}, but the head was trained on "
            f"hidden_states{trained_ids} ({label})"
        )
        fix = f"set {field} to {want} in the head's config.json"
        problems.append(error(msg, fix) if eng == engine else warning(msg + f" (only matters for --engine {eng})", fix))
    if n_aux_fc is not None and n_aux_fc != len(trained_ids):
        problems.append(
            error(
                f"fc.weight reads {n_aux_fc} aux features, but the config names {len(trained_ids)} aux layers "
                f"({trained_ids})",
                "re-export the head; its config.json and weights come from different runs",
            )
        )
    return problems
