"""Model configs checked before a tensor is made, and model folders that would run repository code.

transformers builds whatever a config.json says: `num_attention_heads: 0` is a ZeroDivisionError,
`vocab_size: -5` a negative-dimension RuntimeError, `hidden_size: 1e12` a size mismatch or an
allocation of terabytes, `rms_norm_eps: "abc"` a TypeError deep in a forward. Every config we read
(the target's, a head's) goes through `config_problems` first, and a refusal names the file, the
key and the value. A folder whose config or tokenizer config names custom code (`auto_map`) is
refused with our own words: eagle3 never runs code from a model repository (trust_remote_code).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..files import check_regular_file, read_file_bytes
from ..readers.limits import max_input_bytes

# key -> (required for a target, largest sane value). Bounds far above any real model: a value past
# them is a typo or a crafted file, and would cost terabytes before transformers noticed.
SIZES: dict[str, tuple[bool, int]] = {
    "hidden_size": (True, 1 << 17),
    "num_attention_heads": (True, 1 << 12),
    "num_hidden_layers": (True, 1 << 11),
    "vocab_size": (True, 1 << 23),
    "intermediate_size": (False, 1 << 20),
    "num_key_value_heads": (False, 1 << 12),
    "head_dim": (False, 1 << 13),
    "max_position_embeddings": (False, 1 << 30),
    "draft_vocab_size": (False, 1 << 23),
    "target_hidden_size": (False, 1 << 17),
}
# float key -> must it be > 0
FLOATS = {"rms_norm_eps": True, "layer_norm_eps": True, "rope_theta": True, "initializer_range": False}
CUSTOM_CODE = "auto_map"


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def config_problems(cfg: dict, required: bool = True) -> list[str]:
    """One line per key whose value cannot make a model: `key = value: what it must be`."""
    text = cfg.get("text_config")
    if isinstance(text, dict) and text:  # a multimodal target: its language model's fields
        cfg = text
    problems = []
    for key, (needed, top) in SIZES.items():
        if key not in cfg or cfg[key] is None:
            if needed and required:
                problems.append(f"{key} is missing: a positive integer is expected")
            continue
        v = cfg[key]
        if isinstance(v, bool) or not isinstance(v, int):
            problems.append(f"{key} = {_shown(v)}: expected a positive integer (not {type(v).__name__})")
        elif not 1 <= v <= top:
            problems.append(f"{key} = {v}: expected an integer from 1 to {top}")
    for key, positive in FLOATS.items():
        if key not in cfg or cfg[key] is None:
            continue
        v = cfg[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (positive and v <= 0):
            problems.append(f"{key} = {_shown(v)}: expected a finite number" + (" > 0" if positive else ""))
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    if isinstance(rope, dict) and "rope_theta" in rope:
        v = rope["rope_theta"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            problems.append(f"rope_parameters.rope_theta = {_shown(v)}: expected a finite number > 0")

    def ok(k: str) -> bool:
        return not any(p.startswith(k + " ") for p in problems) and isinstance(cfg.get(k), int)

    if ok("hidden_size") and ok("num_attention_heads") and cfg.get("head_dim") is None:
        if cfg["hidden_size"] % cfg["num_attention_heads"]:
            problems.append(
                f"num_attention_heads = {cfg['num_attention_heads']} does not divide hidden_size = "
                f"{cfg['hidden_size']} (and no head_dim is given)"
            )
    if ok("num_attention_heads") and ok("num_key_value_heads"):
        if cfg["num_attention_heads"] % cfg["num_key_value_heads"]:
            problems.append(
                f"num_key_value_heads = {cfg['num_key_value_heads']} does not divide num_attention_heads = "
                f"{cfg['num_attention_heads']}"
            )
    return problems


def _read(path: Path, what: str) -> dict:
    try:
        data = json.loads(read_file_bytes(path, f"the {what}", max_input_bytes()))
    except (OSError, ValueError, RecursionError) as e:
        raise UsageError(
            f"{path} cannot be read as JSON ({type(e).__name__}: {str(e)[:200]})",
            f"the {what} as a JSON object",
            f"restore {path.name} from the model's source (a cut download?)",
        ) from e
    if not isinstance(data, dict):
        raise UsageError(f"{path} holds {type(data).__name__}, not a JSON object", f"the {what} as a JSON object")
    return data


def refuse_custom_code(folder: Path, cfg: dict | None = None) -> None:
    """UsageError when config.json or tokenizer_config.json names repository code (`auto_map`)."""
    for name in ("config.json", "tokenizer_config.json"):
        p = folder / name
        data = cfg if (name == "config.json" and cfg is not None) else (_read(p, name) if p.is_file() else {})
        if CUSTOM_CODE in data:
            classes = data[CUSTOM_CODE]
            shown = ", ".join(f"{k}: {v}" for k, v in classes.items())[:200] if isinstance(classes, dict) else ""
            raise UsageError(
                f"{p} names custom code (auto_map {shown}): eagle3 never runs code from a model repository "
                "(no trust_remote_code), so this model cannot be loaded",
                "a model whose architecture transformers ships (config.json and tokenizer_config.json without auto_map)",
                "use a version of the model converted to a built-in architecture (e.g. LlamaForCausalLM), "
                f"or remove auto_map from {name} if the built-in classes load it",
            )


def check_model_folder(folder: Path, role: str = "target") -> dict:
    """The folder's config.json, checked (custom code refused; sizes, heads, floats valid); UsageError
    naming the file, each bad key and its value otherwise."""
    path = Path(folder) / "config.json"
    for f in sorted(Path(folder).iterdir()):  # transformers opens what it finds: a FIFO would hang it
        if not f.name.startswith(".") and f.exists() and not f.is_dir():
            check_regular_file(f, f"a file of the {role} folder", f"replace {f} with the model's own file")
    cfg = _read(path, f"{role}'s config")
    refuse_custom_code(Path(folder), cfg)
    refuse_bad_config(cfg, path, role)
    return cfg


def refuse_bad_config(cfg: dict, path: Path, role: str, required: bool = True) -> None:
    problems = config_problems(cfg, required)
    if problems:
        raise UsageError(
            f"{path}: the {role}'s config cannot make a model:\n  " + "\n  ".join(problems),
            "positive integer sizes, attention heads that divide hidden_size, finite numbers for eps and rope_theta",
            f"fix those keys in {path} (or restore the file from the model's source)",
        )
