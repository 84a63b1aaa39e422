"""What eagle3 asks of a serving engine: the interface (`Engine`) each engine's module fills in, and the
registry (`ENGINE_MODULES`) that `serve --engine`'s choices and serve's lookups read. A new engine is one
module here beside `sglang.py`, `vllm.py` and `llama_cpp.py`, its word in `ENGINE_MODULES`, and one column
of the head table (`head/table.py`: `ENGINES`, the format export writes for it, and where it reads each
field); docs/architecture.md lists what the module must define.

`Engine.refused` is serve's guard on the arguments after `--` (`serve/engine_args.py` reads them in
every spelling the engine takes): each argparse `dest` that would swap what serve checked (the
target, the head, its vocab map, the acceptance rule), with what it changes and what to do instead.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Guard:
    changes: str  # what the argument changes, in words
    fix: str  # what to do instead
    own: str | None = None  # serve's own flag for it, where serve sets it
    allowed: tuple[str, ...] = ()  # values that change nothing serve checked (`--load-format auto`)


def own(flag: str, changes: str) -> Guard:
    return Guard(changes, f"use serve's own flag {flag} instead", own=flag)


# what several engines' guards say
TARGET_CONFIG = "drop it: edit a copy of the target and give that as --target, so serve checks the head against it"
ACCEPT = Guard(
    "the acceptance rule: drafted tokens are accepted past what the target would sample, so outputs stop "
    "following the target's distribution (and tau no longer means what eval measured)",
    "drop it: serve verifies with the engine's exact rule, the one eagle3 eval measures",
)
# guards several engines' tables hold under the same dest
SHARED: dict[str, Guard] = {
    "revision": Guard("the target (another revision of it)", "give the folder or hub id you mean as --target"),
    "load_format": Guard(
        "how the target's weights load (`dummy`: random weights)",
        "drop it: the engine then loads --target's own weights",
        allowed=("auto", "pt", "safetensors", "npcache", "fastsafetensors"),  # the checked folder's own files
    ),
    "host": own("--host", "the address"),
    "port": own("--port", "the port"),
}
TOKENIZER = Guard("the target's tokenizer", "drop it: serve serves --target with the tokenizer in its folder")

QUANT_TARGET = "the target's weights are quantized at load: outputs and acceptance can differ from what eval measured"
QUANT_DRAFT = "the draft's weights are quantized at load: acceptance can fall below what eval measured"
ADAPTIVE = (
    "the engine changes the speculation numbers while serving: serve's --steps/--topk/--draft-tokens only start it"
)
TARGET_LOADER = "the target's loader is configured: make sure it still loads --target's own weights"


@dataclass(frozen=True)
class SpecNumbers:
    """SGLang's names: steps = --speculative-num-steps (draft depth), topk = --speculative-eagle-topk
    (branching per step), draft_tokens = --speculative-num-draft-tokens (tree nodes verified,
    root included). vLLM's num_speculative_tokens = steps (a chain)."""

    steps: int
    topk: int
    draft_tokens: int
    source: str


@dataclass(frozen=True)
class Engine:
    """One serving engine, as its module defines it."""

    name: str  # --engine
    refused: dict[str, Guard]  # argparse dests after `--` that would serve something unchecked
    warned: dict[str, str] = field(default_factory=dict)  # dests worth a word: what they change
    aliases: dict[str, str] = field(default_factory=dict)  # spellings besides --dest-with-dashes
    no_value: frozenset[str] = frozenset()  # spellings that take no value
    many_values: frozenset[str] = frozenset()  # spellings that take any number of values
    spec_ok: frozenset[str] = frozenset()  # `--speculative-*` dests that change nothing checked
    defaults: SpecNumbers = field(kw_only=True)  # the speculation numbers when none are given
    # (target, head, numbers, the engine's python) -> the command before --host/--port/extra arguments
    command: Callable[..., list[str]] = field(kw_only=True)
    ready: Callable[[str, str], list[str]] = lambda base, target: []  # lines to paste once it is up


# the modules of this package that define an `ENGINE`, in `--engine`'s order (imported when asked:
# they import the interface above)
ENGINE_MODULES = ("sglang", "vllm", "llama_cpp")


def engines() -> dict[str, Engine]:
    """Every serving engine by its `--engine` name."""
    found = (importlib.import_module(f"{__package__}.{m}").ENGINE for m in ENGINE_MODULES)
    return {e.name: e for e in found}
