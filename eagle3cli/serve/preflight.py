"""Checks that run before a GPU is spent: does the engine load *this* head the way it was trained?

The head and the target are checked by the one head check, `head.check.problems(head, target,
engine)`, which eval, export and train's --init-head ask too, so serve refuses every head they
refuse (and what only an engine would get wrong: SGLang's and vLLM's readings of aux ids, a missing
or null draft_vocab_size, the target's class and `architectures`). The checks of the machine (engine
installed, GPU, port) are in `machine.py`, of the speculation numbers in `commands.py`.
"""

from __future__ import annotations

from pathlib import Path

from ..head.check import Problem, problems, read_config


def check_head(head_dir: Path, target_dir: Path, engine: str = "sglang") -> list[Problem]:
    """Everything about the head folder (and the target) that the engine would accept silently or
    fail on late; a folder that is no head folder at all (or a run folder given for its head) is a
    UsageError naming the folder meant."""
    read_config(Path(head_dir), "head", "eagle3 train --run runs/NAME   (exports runs/NAME/head)")
    return problems(Path(head_dir), Path(target_dir), engine)
