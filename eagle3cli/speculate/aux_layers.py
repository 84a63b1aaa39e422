"""Aux layers: which target hidden states an EAGLE-3 head reads, in eagle3's convention and the
engines'.

eagle3 names an aux layer by its index k in transformers' `output_hidden_states`, i.e. the *input*
of decoder layer k. SGLang reads `eagle_config.eagle_aux_hidden_state_layer_ids` as "output of
layer k" (it adds 1 and captures hidden_states[k+1]); vLLM reads a top-level
`eagle_aux_hidden_state_layer_ids` first, as hidden_states[k]. Both capture [2, L//2, L-3] when a
head names no layers.
"""

from __future__ import annotations


def default_aux_layer_ids(num_layers: int) -> tuple[int, int, int]:
    return (2, num_layers // 2, num_layers - 3)


def top_aux_layer_ids(num_layers: int) -> tuple[int]:
    """The top-only ablation: the input of the last decoder layer."""
    return (num_layers - 1,)


def validate_aux_layer_ids(ids: tuple[int, ...], n_layers: int) -> list[str]:
    # Repeats are legal (engines allow them; a 4-layer target's default is [2, 2, 1]).
    errors = []
    bad = [i for i in ids if not 0 <= i < n_layers]
    if bad:
        errors.append(f"--aux-layers {bad} outside 0..{n_layers - 1} (the target has {n_layers} decoder layers)")
    return errors
