"""The end of a target, without the target: its final norm (and, when asked, its lm_head) with the
weights read from its safetensors files alone, for features an engine computed.

An engine (vLLM's `extract_hidden_states`) returns the last decoder layer's output BEFORE the final
norm; the cache stores it after the norm, as `speculate.target.capture_features` does. The norm is
applied by the target's own module: the model class is built from its config on the `meta` device
(no memory, no weights), and only the norm's (and lm_head's) parameters are made real and filled
with `safe_open` reads of exactly those tensors. So a Gemma's (1 + w) norm or a family's logit
processing (`speculate.target.target_logits`, which reads `lm_head` and `config`) is the family's
own code, and a 70B target costs its norm's and its lm_head's bytes, never its layers'.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import UsageError


def _weight_files(path: Path) -> dict[str, Path]:
    """tensor name -> the safetensors file holding it (the index when there is one, else the headers)."""
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map") or {}
        return {k: path / v for k, v in weight_map.items()}
    where: dict[str, Path] = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            where.update(dict.fromkeys(st.keys(), f))
    return where


def _module_name(model: torch.nn.Module, module: torch.nn.Module) -> str:
    return next(name for name, m in model.named_modules() if m is module)


def load_tail(path: Path, dtype: torch.dtype, *, lm_head: bool, device: str = "cpu"):
    """The target's causal-LM module in which only the final norm (`final_norm(tail)`) and, with
    `lm_head`, the output embedding hold weights (the target's own, read from its safetensors); every
    other parameter stays on the meta device and must not be used."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    config = AutoConfig.from_pretrained(str(path))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    norm = getattr(model.get_decoder(), "norm", None)
    if not isinstance(norm, torch.nn.Module):
        raise UsageError(
            f"{path}: its model ({type(model).__name__}) has no final norm where eagle3 looks for one "
            "(`model.norm`), so the states an engine returns before that norm cannot be finished",
            "a decoder-only target whose base model ends in `norm` (Llama, Qwen, Mistral, Gemma families)",
            "rerun without --engine (the target in eagle3's own process)",
        )
    wanted = {_module_name(model, norm): norm}
    if lm_head:
        wanted[_module_name(model, model.get_output_embeddings())] = model.get_output_embeddings()
    files = _weight_files(path)
    for prefix, module in wanted.items():
        module.to_empty(device=device)
        for pname, param in module.named_parameters(recurse=True):
            key = f"{prefix}.{pname}"
            if key not in files and prefix == _module_name(model, model.get_output_embeddings()):
                # tied embeddings: the checkpoint holds the input embedding only
                key = f"{_module_name(model, model.get_input_embeddings())}.{pname}"
            if key not in files:
                raise UsageError(
                    f"{path}: no tensor {key} in its safetensors files",
                    f"the target's {key} in model.safetensors (or the files its index names)",
                    "rerun without --engine (the target in eagle3's own process)",
                )
            with safe_open(str(files[key]), "pt", device=device) as st:
                value = st.get_tensor(key)
            if tuple(value.shape) != tuple(param.shape):
                raise UsageError(
                    f"{path}: tensor {key} has shape {list(value.shape)}, its config makes {list(param.shape)}",
                    "weights that match the target's config.json",
                    "restore the target's files from its source",
                )
            with torch.no_grad():
                param.copy_(value.to(dtype))
    return model.eval()


def final_norm(tail) -> torch.nn.Module:
    """The target's final norm module (filled by `load_tail`)."""
    norm = tail.get_decoder().norm
    assert isinstance(norm, torch.nn.Module)
    return norm


@torch.no_grad()
def normed_rms(tail, states: torch.Tensor) -> torch.Tensor:
    """Per row of `states` [N, H]: the RMS of the row divided by the final norm's per-channel gain
    (`norm(ones)`: w, or Gemma's 1 + w). A row an RMS norm put out is x / rms(x) times the gain, so
    this is 1 up to rounding and eps; a row before the norm has the residual stream's own scale (2-4
    on the tiny target, 13-233 on SmolLM2-135M)."""
    dtype = next(final_norm(tail).parameters()).dtype
    gain = final_norm(tail)(torch.ones(1, states.shape[-1], dtype=dtype)).float()[0]
    keep = gain != 0
    return (states.float()[:, keep] / gain[keep]).pow(2).mean(-1).sqrt()
