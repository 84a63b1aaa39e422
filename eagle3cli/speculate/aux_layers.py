"""Aux layers: which target hidden states an EAGLE-3 head reads, in eagle3's convention and the
engines'.

eagle3 names an aux layer by its index k in transformers' `output_hidden_states`, i.e. the *input*
of decoder layer k. SGLang reads `eagle_config.eagle_aux_hidden_state_layer_ids` as "output of
layer k" (it adds 1 and captures hidden_states[k+1]); vLLM reads a top-level
`eagle_aux_hidden_state_layer_ids` first, as hidden_states[k]. Both capture [2, L//2, L-3] when a
head names no layers. SGLang's DeepSeek-V2 family adds 1 only when the first id is 1
(`from_sglang_ids`), so there the ids are written as they are.

The order is the layers': vLLM's and SGLang's targets capture in their loop over the decoder layers
(`for idx, layer in enumerate(self.layers): if idx in self.aux_hidden_state_layers:
aux_hidden_states.append(...)`, vLLM `models/llama.py`; `if i in self.layers_to_capture`, SGLang
`srt/models/llama.py`) and concatenate in that order, whatever order the config lists. So eagle3
keeps ids in ascending layer order: a flag or a head listing them otherwise is refused
(`aux_layer_problems`), an engine field of a foreign head is read sorted, as the engine feeds it.
"""

from __future__ import annotations

# What a user is told to pass instead, in every stage that refuses ids.
EXPECTED = "aux layer ids in 1..L-1, ascending (k = the input of decoder layer k), e.g. the default 2,L//2,L-3"


def default_aux_layer_ids(num_layers: int) -> tuple[int, ...]:
    """What SGLang and vLLM capture when a head names no layers: hidden_states[2, L//2, L-3], in the
    layer order they capture them (a 4-layer target's [2, 2, 1] is fed as [1, 2, 2])."""
    return tuple(sorted((2, num_layers // 2, num_layers - 3)))


def top_aux_layer_ids(num_layers: int) -> tuple[int]:
    """The top-only ablation: the input of the last decoder layer."""
    return (num_layers - 1,)


# `--aux-layers` by name: `cache` (whatever the cache holds: train), `default`, `top`
AUX_LAYER_NAMES = ("cache", "default", "top")


def parse_aux_layers(spec) -> str | tuple[int, ...]:
    """`--aux-layers` as written, in every stage: one of `AUX_LAYER_NAMES`, or layer ids ("2,6,9",
    "2 6 9", or a list of integers from a recipe). The one parser of the flag: ValueError when it is
    neither (the ids' own rule is `aux_layer_problems`)."""
    if isinstance(spec, str) and spec.strip() in AUX_LAYER_NAMES:
        return spec.strip()
    items = spec.replace(",", " ").split() if isinstance(spec, str) else list(spec)
    if not items or not all(
        (isinstance(x, int) and not isinstance(x, bool)) or (isinstance(x, str) and x.lstrip("-").isdigit())
        for x in items
    ):
        raise ValueError(f"{spec!r} is not a name ({', '.join(AUX_LAYER_NAMES)}) or layer ids")
    return tuple(int(x) for x in items)


def named_aux_layer_ids(choice: str | tuple[int, ...], num_layers: int) -> tuple[int, ...] | None:
    """The ids a parsed `--aux-layers` names on a target of `num_layers` layers: `default` and `top`
    resolved, ids as given, None for `cache` (the cache's own ids)."""
    if choice == "cache":
        return None
    if choice == "default":
        return default_aux_layer_ids(num_layers)
    if choice == "top":
        return top_aux_layer_ids(num_layers)
    if isinstance(choice, str):
        raise ValueError(f"--aux-layers {choice!r}: not a name of {AUX_LAYER_NAMES}")
    return tuple(choice)


def aux_layer_problems(ids, num_layers: int | None = None) -> list[str]:
    """The one rule for the aux layers a head is trained on: what is wrong with `ids`, [] when a head
    on them can be served. cache, train, export and serve all ask this, so an id is refused before
    the features are computed, not after the training.

    k must be 1..L-1: hidden_states[0] (the embedding output) has no SGLang id (SGLang's ids are
    k - 1, and it captures the output of layer id + 1), and a target has no decoder layer L.
    Without `num_layers` only the lower bound and the order are checked (a flag is checked before
    the target is opened). Ids must ascend: the engines feed the states in layer order (module
    docstring), so a head trained on [9, 2, 6] would be fed [2, 6, 9]. Repeats are left alone (a
    4-layer target's default is [1, 2, 2])."""
    ids = [int(k) for k in ids]
    problems = []
    if ids != sorted(ids):
        problems.append(
            f"aux layer ids {ids} are not in layer order: vLLM and SGLang capture the states in their loop over "
            f"the layers, so a head trained on them in this order would be fed {sorted(ids)}; "
            f"use {','.join(map(str, sorted(ids)))}"
        )
    low = [k for k in ids if k < 1]
    if low:
        problems.append(
            f"aux layer ids {ids} include {low}: hidden_states[0] is the embedding output, which SGLang "
            "cannot be told to capture (its ids are k - 1), so a head trained on it could not be served"
        )
    high = [k for k in ids if k >= num_layers] if num_layers is not None else []
    if num_layers is not None and high:
        problems.append(
            f"aux layer ids {ids} include {high}, which a {num_layers}-layer target does not have "
            f"(ids are 1..{num_layers - 1})"
        )
    return problems


def sglang_ids(ids, first_id_rule: bool = False) -> list[int] | None:
    """eagle3 ids written in SGLang's convention (`eagle_config.eagle_aux_hidden_state_layer_ids`) for
    the target's class: k - 1, since SGLang adds 1 ("output of layer k" is the input of layer k+1), or,
    with `first_id_rule`, k as they are (`from_sglang_ids`). None where SGLang cannot be told them
    (`sglang_id_problems`): the field is then written null, and serve --engine sglang refuses the head."""
    if sglang_id_problems(ids, first_id_rule):
        return None
    return [int(k) - (0 if first_id_rule else 1) for k in ids]


def from_sglang_ids(ids, first_id_rule: bool = False) -> list[int]:
    """The hidden_states indices SGLang captures for its ids. Its `set_eagle3_layers_to_capture` adds 1
    to every id on Llama, Qwen2/3 and most classes; on the DeepSeek-V2 family (`deepseek_v2.py`,
    `glm4_moe_lite.py`: `head.engines.SGLANG_FIRST_ID_RULE`) only when the first id is 1, and
    captures the ids as given otherwise (SGLang 0.5.23)."""
    plus = 0 if first_id_rule and not (ids and int(ids[0]) == 1) else 1
    return [int(k) + plus for k in ids]


def sglang_id_problems(ids, first_id_rule: bool) -> list[str]:
    """What SGLang cannot be told to capture on a target with the first-id rule: hidden_states[1]
    (written as 1 it becomes 2; written as 0 it stays 0)."""
    if first_id_rule and ids and int(ids[0]) == 1:
        return [
            f"aux layer ids {list(ids)} start at hidden_states[1], which SGLang's DeepSeek-family targets cannot "
            "be told to capture (they add 1 to the ids only when the first is 1)"
        ]
    return []


def vllm_ids(ids) -> list[int]:
    """eagle3 ids in vLLM's convention (top-level `eagle_aux_hidden_state_layer_ids`): the same."""
    return [int(k) for k in ids]


def vllm_capture_ids(ids, num_layers: int) -> list[int]:
    """What vLLM's `extract_hidden_states` is told to capture for a cache on eagle3 ids `ids`: the ids
    in vLLM's convention, then L. vLLM's targets append `hidden_states[idx + 1]` after decoder layer
    `idx` (`_maybe_add_hidden_state`, `models/llama.py`), so L is the last layer's output, taken
    before the final norm (the residual added, the norm not applied)."""
    return [*vllm_ids(ids), int(num_layers)]


def int_list(value) -> list[int] | None:
    """A list of layer ids read from a config (JSON), None when absent or empty; ValueError when it is
    anything but a list of integers."""
    if value is None or value == []:
        return None
    if not isinstance(value, list) or not all(isinstance(k, int) and not isinstance(k, bool) for k in value):
        raise ValueError(f"{value!r} is not a list of integers")
    return value
