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

The tables are each engine's (`engines/sglang.py`, `engines/vllm.py`, `engines/llama_cpp.py`: `Engine.refused`),
keyed by the engine's argparse `dest`; this module reads them in every spelling. SGLang's spellings (and which flags take a
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
from ..engines.serving import Engine, engines
from ..errors import UsageError
from ..head.check import Problem, error, warning


def engine(name: str) -> Engine:
    """`serve --engine NAME` (a choice of the registry, `engines.serving.ENGINE_MODULES`; vllm-cpu: vLLM's
    CPU build): its module's `Engine`."""
    return engines()["vllm" if name.startswith("vllm") else name]


@dataclass(frozen=True)
class EngineTable:
    engine: Engine  # its guard: what is refused, warned about, or fine
    options: dict[str, str]  # each spelling -> dest
    no_value: frozenset[str]  # spellings that take no value
    many_values: frozenset[str]  # spellings that take any number of values
    complete: bool  # options holds every flag of the engine (so a prefix is resolved as argparse does)


def _static_options(e: Engine) -> dict[str, str]:
    opts = {"--" + d.replace("_", "-"): d for d in [*e.refused, *e.warned]}
    return {**opts, **e.aliases, "--config": "config"}


def sglang_parser_unavailable_reason() -> str | None:
    """None when `sglang.srt.server_args` imports here; else why not (for skips and doctor)."""
    try:
        import sglang.srt.server_args  # noqa: F401
    except Exception as e:  # noqa: BLE001 — missing package, missing light dep, CUDA-only import...
        return f"{type(e).__name__}: {e}"
    return None


@functools.cache
def engine_table(name: str, use_parser: bool = True) -> EngineTable:
    """The engine's guard (`engines.serving.Engine`) with every spelling of its flags: from SGLang's own
    parser where it imports; else the engine's static table."""
    e = engine(name)
    if use_parser and e.name == "sglang" and sglang_parser_unavailable_reason() is None:
        import argparse

        from sglang.srt.server_args import ServerArgs

        parser = argparse.ArgumentParser(allow_abbrev=False)
        ServerArgs.add_cli_args(parser)
        actions = [a for a in parser._actions if a.option_strings]
        return EngineTable(
            e,
            {o: a.dest for a in actions for o in a.option_strings},
            frozenset(o for a in actions if a.nargs == 0 for o in a.option_strings),
            frozenset(o for a in actions if a.nargs in ("+", "*") for o in a.option_strings),
            complete=True,
        )
    return EngineTable(e, _static_options(e), e.no_value, e.many_values, complete=False)


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
    guard = table.engine.refused.get(dest)
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
                f"{table.engine.name} would serve the change unchecked",
                guard.fix,
            )
        ]
    if dest in table.engine.warned:
        return [warning(f"`{arg}` {where}: {table.engine.warned[dest]}", "drop it unless you mean it")]
    if dest.startswith("speculative_") and dest not in table.engine.spec_ok:
        return [
            warning(
                f"`{arg}` {where}: eagle3 does not know what this {table.engine.name} flag does to the draft or its "
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
    """Serve's guard: the arguments after `--` for `engine` (sglang, vllm, llama.cpp)."""
    return scan(engine_table(engine, use_parser), extra)
