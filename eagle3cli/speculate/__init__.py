"""The method wing: EAGLE-3 itself, apart from the stages that call it (docs/architecture.md).

The draft head (`draft`), the TTT teacher and loss (`ttt`), the draft-vocab maps (`vocab`), aux
layer ids and their one rule (`aux_layers`), tau and alpha_k (`acceptance`), the target's logits and
feature capture (`target`), and the speculation maths exported here as pure tensor functions:
sampling with the probabilities returned, chain and tree verification (greedy and lossless
sampling), EAGLE-2 dynamic tree construction, tree attention masks and position ids,
verification masks with sliding windows. No files, no screen, no stage: torch, transformers and
itself. Importing the package loads nothing: the maths load on first use, the other modules are imported by name
(`decoder`: speculative decoding on transformers, over `target_kv`'s position-indexed KV cache).

The wing raises `Unsupported` for an input its method cannot run (a target with layers the decoder
cannot cache); the stage that called it says what to do instead (eval: exit 2, use --endpoint)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .chain import verify_chain_greedy, verify_chain_sampling
    from .masks import attention_mask
    from .sampling import generator_for, logits_to_probs, residual, sample, sample_from
    from .tree import (
        DraftTree,
        children_of,
        expand_frontier,
        node_depths,
        select_nodes,
        tree_attention_mask,
        tree_position_ids,
        verify_tree_greedy,
        verify_tree_sampling,
    )

# The maths' home modules, loaded on first use: the flags' configs import `aux_layers` through this
# package, and `eagle3 --help` must not pay for torch (seconds) to print text.
_HOMES = {
    "verify_chain_greedy": "chain",
    "verify_chain_sampling": "chain",
    "attention_mask": "masks",
    "generator_for": "sampling",
    "logits_to_probs": "sampling",
    "residual": "sampling",
    "sample": "sampling",
    "sample_from": "sampling",
    **dict.fromkeys(
        (
            "DraftTree",
            "children_of",
            "expand_frontier",
            "node_depths",
            "select_nodes",
            "tree_attention_mask",
            "tree_position_ids",
            "verify_tree_greedy",
            "verify_tree_sampling",
        ),
        "tree",
    ),
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{home}", __name__), name)


class Unsupported(Exception):
    """An input the method cannot run: `what` is wrong and what was `expected`. The wing knows no
    exit codes or commands; the calling stage maps it to its own error and next step."""

    def __init__(self, what: str, expected: str):
        self.what, self.expected = what, expected
        super().__init__(f"{what}\nexpected: {expected}")


__all__ = [
    "Unsupported",
    "attention_mask",
    "DraftTree",
    "children_of",
    "expand_frontier",
    "logits_to_probs",
    "node_depths",
    "residual",
    "generator_for",
    "sample",
    "sample_from",
    "select_nodes",
    "tree_attention_mask",
    "tree_position_ids",
    "verify_chain_greedy",
    "verify_chain_sampling",
    "verify_tree_greedy",
    "verify_tree_sampling",
]
