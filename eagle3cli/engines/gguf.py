"""A GGUF checkpoint -> a plain transformers folder (config, safetensors, tokenizer).

transformers reads GGUF files (`from_pretrained(dir, gguf_file=...)`, needs the `gguf` package)
and dequantizes them, but refuses `save_pretrained` on the result (it is flagged as quantized).
Every eagle3 stage wants a plain folder it can fingerprint and memory-map, so we write the
dequantized state dict with safetensors and drop the quantization flag from the config.

Stored in fp32 by default: dequantized Q4/Q8 values are `scale * q + min` with fp16 scales,
exactly representable in fp32 but not in bf16, so an fp32 folder is the GGUF model itself.
The folder is checked by greedy-decoding a few prompts with both and requiring equal tokens.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import UsageError
from ..run_folder.manifest import sha256_file

STAMP = "eagle3-gguf.json"  # what was converted, from which file, and the check that passed
CHECK_PROMPTS = (
    "What is the capital of France?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Give me three tips for sleeping better.",
)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class ConversionReport:
    out_dir: Path
    skipped: bool  # the folder already held this exact conversion
    seconds: float
    checks: list[dict]


def _load_gguf(gguf: Path, dtype: torch.dtype):
    try:
        import gguf as _gguf  # noqa: F401 — transformers needs it; say so clearly if missing
    except ImportError as e:
        raise UsageError(
            "reading a GGUF file needs the `gguf` package",
            "gguf and accelerate installed",
            "pip install gguf accelerate",
        ) from e
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=dtype).eval()
    return model, tok


def _greedy(model, tok, prompt: str, max_new_tokens: int) -> list[int]:
    ids = tok.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.inference_mode():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
    return out[0, ids["input_ids"].shape[1] :].tolist()


def _write_folder(model, tok, out: Path, dtype: torch.dtype, source: dict) -> None:
    from ..run_folder.manifest import atomic_write_tensors

    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # tied: transformers re-ties it from embed_tokens on load
    atomic_write_tensors(
        tmp / "model.safetensors", {k: v.to(dtype).contiguous() for k, v in state.items()}, {"format": "pt"}
    )
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg.pop("_name_or_path", None)
    cfg["dtype"] = str(dtype).removeprefix("torch.")
    cfg["architectures"] = cfg.get("architectures") or [type(model).__name__]  # SGLang and vLLM load by it
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    model.generation_config.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    (tmp / STAMP).write_text(json.dumps(source, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)  # the folder appears whole or not at all


def name_architecture(out: Path) -> None:
    """Write `"architectures": ["LlamaForCausalLM"]` (the class a GGUF llama loads as) into a converted
    folder's config.json that says null: SGLang reads architectures[0] before any weight and vLLM
    refuses null. Its fingerprint still matches what its corpora and heads recorded
    (`manifest.model_fingerprint` accepts the unnamed config's)."""
    from ..run_folder.manifest import atomic_write_text

    path = out / "config.json"
    cfg = json.loads(path.read_text())
    if not cfg.get("architectures"):
        model_type = str(cfg.get("model_type") or "llama")
        cfg["architectures"] = [
            {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}.get(model_type, "LlamaForCausalLM")
        ]
        atomic_write_text(path, json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _stamp_matches(out: Path, source: dict) -> bool:
    stamp = out / STAMP
    if not stamp.exists() or not (out / "model.safetensors").exists():
        return False
    try:
        old = json.loads(stamp.read_text())
    except json.JSONDecodeError:
        return False
    return all(old.get(k) == source[k] for k in ("gguf_sha256", "dtype")) and bool(old.get("checks"))


def convert_gguf(gguf: Path, out: Path, dtype: str = "fp32", max_new_tokens: int = 48) -> ConversionReport:
    """Convert `gguf` into the plain folder `out`; a no-op when `out` already holds this conversion.

    Raises StageError-like UsageError when the reloaded folder's greedy output differs."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf, out = Path(gguf), Path(out)
    if not gguf.is_file():
        raise UsageError(f"GGUF file {gguf} does not exist", "a .gguf model file")
    if dtype not in DTYPES:
        raise UsageError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}", "fp32 (exact) or bf16 (half the bytes)")
    start = time.perf_counter()
    source = {"gguf_file": gguf.name, "gguf_sha256": sha256_file(gguf), "dtype": dtype}
    if _stamp_matches(out, source):
        checks = json.loads((out / STAMP).read_text())["checks"]
        name_architecture(out)  # a folder converted before the class was written into its config
        return ConversionReport(out, True, time.perf_counter() - start, checks)
    model, tok = _load_gguf(gguf, torch.float32)
    reference = {p: _greedy(model, tok, p, max_new_tokens) for p in CHECK_PROMPTS}
    _write_folder(model, tok, out, DTYPES[dtype], {**source, "checks": []})
    del model
    reloaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    rtok = AutoTokenizer.from_pretrained(str(out))
    checks = []
    for prompt, ref in reference.items():
        got = _greedy(reloaded, rtok, prompt, max_new_tokens)
        checks.append({"prompt": prompt, "tokens": len(ref), "equal": got == ref, "text": rtok.decode(ref)})
    if not all(c["equal"] for c in checks):
        bad = [c["prompt"] for c in checks if not c["equal"]]
        (out / STAMP).unlink(missing_ok=True)
        raise UsageError(
            f"the converted folder {out} decodes differently from the GGUF model on {len(bad)} prompt(s): {bad}",
            "identical greedy tokens (fp32 conversion is exact; bf16 may differ)",
            "convert with dtype fp32",
        )
    (out / STAMP).write_text(json.dumps({**source, "checks": checks}, indent=2) + "\n")
    return ConversionReport(out, False, time.perf_counter() - start, checks)
