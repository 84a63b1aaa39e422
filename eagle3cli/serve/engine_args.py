"""Serve's guard on the engine arguments after `--`: one table per engine of what would swap what
serve checked.

`eagle3 serve` checks a head against a target and sets the engine's flags for both; what follows
`--` goes to the engine as it is, and an engine takes the last value of a flag. An argument that
changes the draft, its weights, its vocab map, the acceptance rule or the target's identity would
serve something serve never checked, so each is refused (exit 2) in every spelling the engine reads:

- each of the flag's names, `_` for `-`, `--flag=value`, a unique prefix (argparse's allow_abbrev),
  vLLM's dotted keys of a JSON argument (`--speculative-config.model X`, `-sc.model X`);
- old spellings (vLLM <= 0.8's `--speculative-model`, `--num-speculative-tokens`);
- the keys of a `--config FILE` YAML (both engines merge it into their arguments);
- a positional argument (`vllm serve T other`: a second model).

The tables are keyed by the engine's argparse `dest`. SGLang's spellings (and which flags take a
value) come from its own parser, `ServerArgs.add_cli_args`, where it imports (`make sglang-cpu`);
vLLM's parser lives in the engine's own environment, so its spellings are a static table here,
and `vllm_check.py` reads every refused dest back from vLLM's parser where vLLM is installed.
What changes how the draft or the target run without swapping them (a quantized draft, adaptive
steps, a `--speculative-*` flag this table does not know) is warned about.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..config import load_yaml
from ..errors import UsageError
from .problems import Problem, error, warning


@dataclass(frozen=True)
class Guard:
    changes: str  # what the argument changes, in words
    fix: str  # what to do instead
    own: str | None = None  # serve's own flag for it, where serve sets it
    allowed: tuple[str, ...] = ()  # values that change nothing serve checked (`--load-format auto`)


def _own(flag: str, changes: str) -> Guard:
    return Guard(changes, f"use serve's own flag {flag} instead", own=flag)


_TARGET_CONFIG = "drop it: edit a copy of the target and give that as --target, so serve checks the head against it"
_ACCEPT = Guard(
    "the acceptance rule: drafted tokens are accepted past what the target would sample, so outputs stop "
    "following the target's distribution (and tau no longer means what eval measured)",
    "drop it: serve verifies with the engine's exact rule, the one eagle3 eval measures",
)
# formats that read the checked folder's own weight files
_LOCAL_FORMATS = ("auto", "pt", "safetensors", "npcache", "fastsafetensors")

SGLANG_REFUSED: dict[str, Guard] = {
    "model_path": _own("--target", "the target"),
    "tokenizer_path": Guard(
        "the target's tokenizer", "drop it: serve serves --target with the tokenizer in its folder"
    ),
    "revision": Guard("the target (another revision of it)", "give the folder or hub id you mean as --target"),
    "load_format": Guard(
        "how the target's weights load (`dummy`: random weights)",
        "drop it: the engine then loads --target's own weights",
        allowed=_LOCAL_FORMATS,
    ),
    "json_model_override_args": Guard("the target's config.json (overridden)", _TARGET_CONFIG),
    "decrypted_config_file": Guard("the target's config (read from another file)", _TARGET_CONFIG),
    "modelopt_checkpoint_restore_path": Guard(
        "the target's weights (a restored checkpoint)", "give that model as --target"
    ),
    "speculative_algorithm": _own("(serve sets EAGLE3)", "the speculation method"),
    "speculative_draft_model_path": _own("--head", "the draft head"),
    "speculative_draft_model_revision": Guard("the draft head (another revision of it)", "give that head as --head"),
    "speculative_draft_load_format": Guard(
        "how the draft's weights load (`dummy`: random weights)",
        "drop it: the engine then loads --head's checked weights",
        allowed=("auto",),
    ),
    "decrypted_draft_config_file": Guard(
        "the draft head's config (read from another file)", "give that head as --head"
    ),
    "speculative_token_map": Guard(
        "the head's vocab map (d2t/t2d), which serve checked",
        "drop it: the head carries its own map, the one eval measured",
    ),
    "speculative_num_steps": _own("--steps", "the draft depth"),
    "speculative_eagle_topk": _own("--topk", "the draft's branching"),
    "speculative_num_draft_tokens": _own("--draft-tokens", "the tokens verified"),
    "speculative_accept_threshold_single": _ACCEPT,
    "speculative_accept_threshold_acc": _ACCEPT,
    "speculative_use_rejection_sampling": _ACCEPT,
    "speculative_use_block_verification": _ACCEPT,
    "host": _own("--host", "the address"),
    "port": _own("--port", "the port"),
}
_QUANT_TARGET = "the target's weights are quantized at load: outputs and acceptance can differ from what eval measured"
_QUANT_DRAFT = "the draft's weights are quantized at load: acceptance can fall below what eval measured"
_ADAPTIVE = (
    "the engine changes the speculation numbers while serving: serve's --steps/--topk/--draft-tokens only start it"
)
SGLANG_WARNED: dict[str, str] = {
    "speculative_draft_model_quantization": _QUANT_DRAFT,
    "speculative_adaptive": _ADAPTIVE,
    "speculative_adaptive_config": _ADAPTIVE,
    "speculative_draft_window_size": "the draft attends to a window of the context: acceptance can differ from eval's",
    "speculative_draft_sink_size": "the draft attends to a window of the context: acceptance can differ from eval's",
    "quantization": _QUANT_TARGET,
    "modelopt_quant": _QUANT_TARGET,
    "model_loader_extra_config": "the target's loader is configured: make sure it still loads --target's own weights",
}
# `--speculative-*` flags that choose kernels or backends, not what is drafted or accepted
SGLANG_SPEC_OK = frozenset(
    {
        "speculative_attention_mode",
        "speculative_draft_attention_backend",
        "speculative_moe_runner_backend",
        "speculative_moe_a2a_backend",
        "speculative_dsa_topk_backend",
        "speculative_draft_kv_cache_dtype",
    }
)
# the names SGLang 0.5 gives a dest besides `--dest-with-dashes` (for the static table)
SGLANG_ALIASES = {"--model": "model_path", "--speculative-draft-model": "speculative_draft_model_path"}

VLLM_REFUSED: dict[str, Guard] = {
    "model": _own("--target", "the target"),
    "model_tag": _own("--target", "the target"),  # `vllm serve MODEL` (and --model-tag)
    "tokenizer": Guard("the target's tokenizer", "drop it: serve serves --target with the tokenizer in its folder"),
    "revision": Guard("the target (another revision of it)", "give the folder or hub id you mean as --target"),
    "code_revision": Guard("the target's model code (another revision)", "give the folder you mean as --target"),
    "tokenizer_revision": Guard("the target's tokenizer (another revision)", "give the folder you mean as --target"),
    "hf_config_path": Guard("the target's config (read from another folder)", _TARGET_CONFIG),
    "hf_overrides": Guard("the target's config.json (overridden)", _TARGET_CONFIG),
    "load_format": Guard(
        "how the target's weights load (`dummy`: random weights)",
        "drop it: the engine then loads --target's own weights",
        allowed=_LOCAL_FORMATS,
    ),
    "speculative_config": _own("--head and --steps", "the draft head and its numbers"),
    "speculative_model": _own("--head", "the draft head"),  # vLLM <= 0.8
    "num_speculative_tokens": _own("--steps", "the draft depth"),  # vLLM <= 0.8
    "spec_decoding_acceptance_method": _ACCEPT,  # vLLM <= 0.8
    "typical_acceptance_sampler_posterior_threshold": _ACCEPT,
    "typical_acceptance_sampler_posterior_alpha": _ACCEPT,
    "ngram_prompt_lookup_max": Guard("the speculation method (n-gram lookup for the draft)", "drop it"),
    "ngram_prompt_lookup_min": Guard("the speculation method (n-gram lookup for the draft)", "drop it"),
    "host": _own("--host", "the address"),
    "port": _own("--port", "the port"),
}
VLLM_WARNED: dict[str, str] = {
    "quantization": _QUANT_TARGET,
    "speculative_model_quantization": _QUANT_DRAFT,
    "speculative_disable_by_batch_size": "speculation is switched off past a batch size",
    "speculative_max_model_len": "the draft stops past a context length",
    "model_loader_extra_config": "the target's loader is configured: make sure it still loads --target's own weights",
    "config_format": "the target's config is read in another format",
}
# vLLM's names other than `--dest-with-dashes`, as its parser spells them (`vllm serve --help`)
VLLM_ALIASES = {"-sc": "speculative_config", "-q": "quantization", "--model-tag": "model_tag"}
# vLLM flags that take no value, for telling a value from a positional where vLLM's parser is not
# here: these, and --enable-*/--disable-*/--no-* (store_true and BooleanOptionalAction in vLLM)
VLLM_NO_VALUE = frozenset({"--enforce-eager", "--trust-remote-code", "--skip-tokenizer-init", "--calculate-kv-scales"})


@dataclass(frozen=True)
class EngineTable:
    engine: str
    refused: dict[str, Guard]
    warned: dict[str, str]
    spec_ok: frozenset[str]  # speculative dests that change nothing checked (no warning)
    options: dict[str, str]  # each spelling -> dest
    no_value: frozenset[str]  # spellings that take no value
    many_values: frozenset[str]  # spellings that take any number of values
    source: str  # where the spellings came from
    complete: bool  # options holds every flag of the engine (so a prefix is resolved as argparse does)


def _static_options(refused: dict, warned: dict, aliases: dict[str, str]) -> dict[str, str]:
    opts = {"--" + d.replace("_", "-"): d for d in [*refused, *warned]}
    return {**opts, **aliases, "--config": "config"}


def sglang_parser_unavailable_reason() -> str | None:
    """None when `sglang.srt.server_args` imports here; else why not (for skips and doctor)."""
    try:
        import sglang.srt.server_args  # noqa: F401
    except Exception as e:  # noqa: BLE001 — missing package, missing light dep, CUDA-only import...
        return f"{type(e).__name__}: {e}"
    return None


@functools.cache
def sglang_table(use_parser: bool = True) -> EngineTable:
    """From SGLang's own parser where it imports; else the static table."""
    reason = sglang_parser_unavailable_reason() if use_parser else "not asked"
    if reason is None:
        import argparse
        from importlib import metadata

        from sglang.srt.server_args import ServerArgs

        parser = argparse.ArgumentParser(allow_abbrev=False)
        ServerArgs.add_cli_args(parser)
        actions = [a for a in parser._actions if a.option_strings]
        return EngineTable(
            "sglang",
            SGLANG_REFUSED,
            SGLANG_WARNED,
            SGLANG_SPEC_OK,
            {o: a.dest for a in actions for o in a.option_strings},
            frozenset(o for a in actions if a.nargs == 0 for o in a.option_strings),
            frozenset(o for a in actions if a.nargs in ("+", "*") for o in a.option_strings),
            f"SGLang {metadata.version('sglang')}'s own parser",
            complete=True,
        )
    return EngineTable(
        "sglang",
        SGLANG_REFUSED,
        SGLANG_WARNED,
        SGLANG_SPEC_OK,
        _static_options(SGLANG_REFUSED, SGLANG_WARNED, SGLANG_ALIASES),
        frozenset({"--speculative-use-rejection-sampling", "--speculative-use-block-verification"}),
        frozenset(),
        f"eagle3's static table (SGLang's parser does not import here: {reason})",
        complete=False,
    )


@functools.cache
def vllm_table() -> EngineTable:
    """vLLM's parser cannot be imported beside eagle3 (its own torch): the static table."""
    return EngineTable(
        "vllm",
        VLLM_REFUSED,
        VLLM_WARNED,
        frozenset(),
        _static_options(VLLM_REFUSED, VLLM_WARNED, VLLM_ALIASES),
        VLLM_NO_VALUE,
        frozenset({"--served-model-name"}),
        "eagle3's static table of vLLM's flags",
        complete=False,
    )


def engine_table(engine: str, use_parser: bool = True) -> EngineTable:
    return vllm_table() if engine.startswith("vllm") else sglang_table(use_parser)


# ---------------------------------------------------------------- reading the arguments
_NUMBER = re.compile(r"^-\.?\d")


def _is_flag(arg: str) -> bool:
    return arg.startswith("-") and arg not in ("-", "--") and not _NUMBER.match(arg)


def _split(arg: str) -> tuple[str, str | None, str | None]:
    """(the option's name as the engine normalises it, a dotted key, an inline value)."""
    name, eq, value = arg.partition("=")
    if name.startswith("--"):
        base, _, key = name[2:].partition(".")
        base = "--" + base.replace("_", "-").lower()
    else:  # vLLM's short names: -sc, -sc.model, -q
        base, _, key = name.partition(".")
    return base, key or None, value if eq else None


def _dest(table: EngineTable, base: str) -> str | None:
    if base in table.options:
        return table.options[base]
    if base.startswith("--") and len(base) >= 5:  # argparse's allow_abbrev: a unique prefix is the flag
        hits = {d for o, d in table.options.items() if o.startswith(base)}
        if len(hits) == 1:
            return hits.pop()
    return None


def _takes(table: EngineTable, base: str, key: str | None) -> int:
    """How many values follow the flag: 0, 1, or -1 for any number."""
    if key is not None:
        return 1
    if base in table.many_values:
        return -1
    if base in table.no_value:
        return 0
    if not table.complete and base.startswith(("--enable-", "--disable-", "--no-")):
        return 0
    return 1


def _judge(table: EngineTable, arg: str, dest: str, value: str | None, where: str) -> list[Problem]:
    guard = table.refused.get(dest)
    if guard is not None:
        if guard.allowed and value is not None and value.strip().lower() in guard.allowed:
            return []
        if guard.own is not None:
            return [
                error(
                    f"`{arg}` {where} sets what eagle3 serve sets itself and checks ({guard.changes}): the engine "
                    "would take the last value, unchecked",
                    f"{guard.fix}, and drop {arg.split('=', 1)[0]} {where}",
                )
            ]
        return [
            error(
                f"`{arg}` {where} changes {guard.changes}: serve checked the head and target without it, and "
                f"{table.engine} would serve the change unchecked",
                guard.fix,
            )
        ]
    if dest in table.warned:
        return [warning(f"`{arg}` {where}: {table.warned[dest]}", "drop it unless you mean it")]
    if dest.startswith("speculative_") and dest not in table.spec_ok:
        return [
            warning(
                f"`{arg}` {where}: eagle3 does not know what this {table.engine} flag does to the draft or its "
                "acceptance (it is not in serve's table)",
                "check the engine's docs; measure the served head with eagle3 eval --endpoint URL",
            )
        ]
    return []


def _config_args(path_text: str | None, where: str) -> tuple[list[str], list[Problem]]:
    """The arguments an engine's --config YAML adds, as `--key=value` (both engines merge it that way)."""
    why = "so the engine arguments in it cannot be checked"
    fix = "give a readable YAML mapping of engine flags, or drop --config"
    if path_text is None:
        return [], [error(f"--config {where} names no file", fix)]
    path = Path(path_text)
    if not path.exists() or path.is_dir():
        return [], [error(f"--config {path} {where} is not a file eagle3 can read, {why}", fix)]
    try:  # the recipe loader's bounds: size, aliases, no device; a FIFO nobody writes to reads as empty
        data = load_yaml(path, f"--config {where}", fix)
    except OSError as e:
        return [], [error(f"--config {path} {where} cannot be read ({e.strerror}), {why}", fix)]
    except UsageError as e:
        return [], [error(f"{e.what}, {why}", fix)]
    if data is None:
        return [], []
    if not isinstance(data, dict):
        return [], [error(f"--config {path} {where} holds a {type(data).__name__}, not a mapping, {why}", fix)]
    args = []
    for key, value in data.items():
        flag = f"--{key}"
        if value is True:
            args.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, dict):
            args.append(f"{flag}={json.dumps(value)}")
        elif isinstance(value, list):
            args.append(f"{flag}={','.join(map(str, value))}")
        else:
            args.append(f"{flag}={value}")
    return args, []


def scan(table: EngineTable, args: list[str] | tuple[str, ...], where: str = "after `--`") -> list[Problem]:
    """Every refused argument (errors) and every one worth a word (warnings) in `args`."""
    problems: list[Problem] = []
    pending = 0  # values the previous flag still takes (-1: any number)
    args = list(args)
    for i, arg in enumerate(args):
        if arg == "--":
            problems.append(
                error(
                    f"a second `--` {where}: the engine reads everything after it as positional arguments",
                    "drop it: give the engine's flags once, after serve's own `--`",
                )
            )
            pending = 0
            continue
        if not _is_flag(arg):
            if pending == 0:
                problems.append(
                    error(
                        f"`{arg}` {where} is a positional argument: vLLM reads one as the model to serve (`vllm "
                        "serve MODEL`), SGLang refuses it; serve checked the head against --target only",
                        "give the target as --target; if it is a flag's value, write it as --flag=VALUE",
                    )
                )
            elif pending > 0:
                pending -= 1
            continue
        base, key, inline = _split(arg)
        dest = _dest(table, base)
        takes = 0 if inline is not None else _takes(table, base, key)
        following = args[i + 1] if takes and i + 1 < len(args) and not _is_flag(args[i + 1]) else None
        value = inline if inline is not None else following
        pending = takes
        if dest is None:
            continue
        if dest == "config":
            if "in --config" in where:
                problems.append(error(f"`{arg}` {where}: a config file inside a config file", "drop it"))
                continue
            extra, found = _config_args(value, where)
            problems += found + scan(table, extra, where=f"in --config {value}")
            continue
        problems += _judge(table, arg, dest, None if key is not None else value, where)
    return problems


def check_engine_args(engine: str, extra: list[str] | tuple[str, ...], use_parser: bool = True) -> list[Problem]:
    """Serve's guard: the arguments after `--` for `engine` (sglang, vllm)."""
    return scan(engine_table(engine, use_parser), extra)


def refused_dests(engine: str) -> dict[str, Guard]:
    """The table of refused dests, for the engines' own parsers to read back (vllm_check, validate_sglang_argv)."""
    return VLLM_REFUSED if engine.startswith("vllm") else SGLANG_REFUSED
