"""`run_serve(config)`: preflight, build the engine command, validate it, then print or launch it."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

from rich.markup import escape

from ..console import log, warn
from ..engines.local_engine import vllm_loadable
from ..engines.vllm import API_MODULE, speculative_config
from ..errors import UsageError
from ..head.check import Problem, raise_if_errors
from ..head.check import problems as head_problems
from ..model.target import resolve_model_path
from .commands import (
    build_command,
    check_spec_flags,
    check_spec_numbers,
    print_or_launch,
    refuse_errors,
    resolve_spec,
    validate_sglang_argv,
)
from .config import ServeConfig
from .engine_args import check_engine_args
from .machine import (
    VllmBuild,
    check_engine_installed,
    check_gpu,
    check_port,
    check_vllm_cpu,
    default_engine_python,
    served_dtype,
    vllm_build,
)
from .vllm_check import validate_vllm_argv
from .vllm_cpu import cpu_launch


def input_problems(cfg: ServeConfig, spec) -> list[Problem]:
    """What is wrong with the head, the target or the flags."""
    assert cfg.head is not None and cfg.target is not None  # validate() requires both
    # a hub id already in the local cache is fine (SGLang resolves the same id); nothing is downloaded
    problems = check_engine_args(cfg.engine, cfg.extra_args)
    problems += head_problems(Path(cfg.head), Path(resolve_model_path(cfg.target)), cfg.engine)
    problems += check_spec_numbers(spec.steps, spec.topk, spec.draft_tokens, cfg.engine)
    return problems


def machine_problems(cfg: ServeConfig, engine_python: str | None, build: VllmBuild | None) -> list[Problem]:
    """What this machine lacks for a real launch (the engine, a GPU or what vllm-cpu cannot run here, the
    port); none for a dry run."""
    if cfg.dry_run:
        return []
    problems = check_engine_installed(cfg.engine, engine_python)
    if build is not None and build.cpu and engine_python and not problems:
        problems += check_vllm_cpu(engine_python, build.version, served_dtype(list(cfg.extra_args)))
    elif build is None or not build.cpu:
        problems += check_gpu(cfg.engine)
    problems += check_port(cfg.host, cfg.port)
    return problems


def _loadable_target(cfg: ServeConfig) -> ServeConfig:
    """vLLM picks the model class from config.json's `architectures`; a GGUF-converted target (SmolLM2
    from `make smollm2`) names none. Serve a lasting copy that names it (local_engine.vllm_loadable)."""
    assert cfg.target is not None
    target = resolve_model_path(cfg.target)
    if not Path(target).is_dir():
        return cfg
    loadable = vllm_loadable(Path(target))
    if loadable != Path(target).resolve():
        warn(
            f"{escape(str(cfg.target))}/config.json names no architectures, which vLLM needs to pick the model "
            f"class: serving {escape(str(loadable))} (links to its files, config naming the class of its "
            "model_type); the target itself is unchanged"
        )
        return replace(cfg, target=loadable)
    return cfg


def run_serve(cfg: ServeConfig) -> int:
    """Returns the process exit code: 0 for a dry run, else the engine's."""
    if cfg.engine == "llama.cpp":  # GGUF files, llama-server: its own preflight (serve/llama_cpp.py)
        from .llama_cpp import run_llama_cpp

        return run_llama_cpp(cfg)
    if cfg.engine == "vllm":
        cfg = _loadable_target(cfg)
    flag_problems = check_spec_flags(cfg.steps, cfg.topk, cfg.draft_tokens)
    raise_if_errors(flag_problems, "eagle3 serve --help")
    spec = resolve_spec(cfg.steps, cfg.topk, cfg.draft_tokens, cfg.from_eval, cfg.engine)
    engine_python = cfg.engine_python or default_engine_python(cfg.engine)
    build = vllm_build(engine_python) if cfg.engine == "vllm" and engine_python else None
    cpu_build = build is not None and build.cpu
    extra, env = list(cfg.extra_args), None
    inputs = input_problems(cfg, spec)
    problems = inputs + machine_problems(cfg, engine_python, build)
    if cpu_build:
        assert build is not None
        log(f"engine: vllm-cpu {build.version} from {escape(str(engine_python))} (serves on this CPU)")
        extra, env, notes = cpu_launch(extra)
        problems += notes
    refuse_errors(
        problems,
        "fix the head/flags above, then re-run with --dry-run to check"
        if any(p.is_error for p in inputs)
        else "the head and flags passed every check: fix what this machine lacks (above), or add --dry-run "
        "to print the checked command here",
    )
    engine = "vllm-cpu" if cpu_build else cfg.engine
    argv = build_command(engine, cfg.target, cfg.head, spec, cfg.host, cfg.port, extra, engine_python)
    log(
        f"speculation: steps={spec.steps} topk={spec.topk} draft_tokens={spec.draft_tokens} "
        f"(from {escape(spec.source)})"
    )
    if cfg.engine == "sglang":
        check = validate_sglang_argv(argv)
        if check.available and not check.ok:
            raise UsageError(
                check.message,
                "flags this SGLang version accepts (no abbreviations)",
                "fix the flags after `--`; see python -m sglang.launch_server --help",
            )
        (log if check.ok else warn)(f"command check: {escape(check.message)}")
    elif cfg.engine == "vllm" and (engine_python or importlib.util.find_spec("vllm") is not None):
        spec_cfg = speculative_config(str(cfg.head), spec)  # as the command has it
        check = validate_vllm_argv(
            argv, engine_python or sys.executable, spec_cfg, cfg.host, cfg.port, model=str(cfg.target)
        )
        if check.available and not check.ok:
            raise UsageError(
                check.message,
                "flags this vLLM version accepts",
                f"fix the flags after `--`; see {engine_python or 'python'} -m {API_MODULE} --help",
            )
        (log if check.ok else warn)(f"command check: {escape(check.message)}")
    elif cfg.engine == "vllm":
        warn("vLLM's parser is not checked here: vLLM is not installed here (make vllm-cpu, or --engine-python)")
    return print_or_launch(cfg, argv, env=env, log_prefix=cfg.engine)
