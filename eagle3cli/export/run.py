"""`run_export(config)`: a head of any layout (eagle3, SGLang, vLLM, speculators) written in another
engine's layout, checked by reading it first.

sglang and vllm: eagle3's own layout (both engines load it; vLLM maps `midlayer.` to `layers.0.`
itself), with the aux layer ids written in each engine's convention. speculators: `layers.0.*`
names and a `speculators_model_type: eagle3` config whose `verifier.name_or_path` is an absolute
path or a hub id, so it loads from any directory.

EAGLE-3.1's norms travel as top-level `norm_before_fc` / `norm_before_residual` in every layout
(speculators: beside `transformer_layer_config`, where vLLM's `update_eagle3` reads them, always
written since a missing norm_before_residual means true there) with `input_norm.weight`. SGLang
reads norm_before_fc from 0.5.23 on and norm_before_residual in no version, so `--format sglang`
refuses a flag the SGLang here does not read rather than write a head it loads wrong.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..console import warn
from ..errors import UsageError
from ..head.engines import sglang_norm_problem, target_support
from ..head.read import load_any_head
from ..head.table import HEAD_WEIGHTS
from ..head.write import (
    HEAD_FILES,
    head_state_dict,
    own_layout_config,
    speculators_config,
    target_architectures,
    write_head_files,
)
from ..model.target import repo_relative
from ..run_folder.folders import begin_writing, claim_output, end_writing, refuse_replacing
from ..run_folder.manifest import read_json, remove_dead_temps, shard_record, write_manifest
from .config import ExportConfig

EXPORT_FORMATS = ("sglang", "vllm", "speculators")
EXPORT_FILES = HEAD_FILES  # what an export folder holds besides its manifest


def run_export(cfg: ExportConfig) -> Path:
    """`eagle3 export`: the head in cfg.format's layout in cfg.out (gguf: llama.cpp's files, converted by
    its own converter and read back); says when vLLM's support for the target cannot be told."""
    assert cfg.out is not None  # validate() requires it
    if cfg.format == "gguf":  # llama.cpp: converted by its own converter, then read back and checked
        from ..engines.gguf_export import export_gguf

        return export_gguf(cfg.head, cfg.target, cfg.out, cfg.dtype, overwrite=cfg.overwrite)
    assert cfg.head is not None  # validate() requires it for the other formats
    path = export_head(
        cfg.head, cfg.format, cfg.out, cfg.num_speculative_tokens, cfg.dtype, overwrite=cfg.overwrite
    )  # refuses targets vLLM cannot serve
    if cfg.format == "speculators":
        s = speculators_support(read_json(path / "config.json"))
        if s.status == "unknown":
            warn(f"cannot tell whether vLLM serves EAGLE-3 heads on {s.architecture or 'this target'} ({s.source})")
    return path


def speculators_support(head_cfg: dict):
    """vLLM's support for the head's target (speculators heads are vLLM's format)."""
    return target_support("vllm", (head_cfg.get("eagle3") or {}).get("target_architectures"))


EXPORT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def export_head(
    head_dir: Path,
    fmt: str,
    out_dir: Path,
    num_speculative_tokens: int = 7,
    dtype: str = "keep",
    overwrite: bool = False,
) -> Path:
    """Write a head of any layout (eagle3, SGLang, vLLM, speculators) in another engine's layout.

    sglang and vllm: eagle3's own layout (both engines load it; vLLM maps `midlayer.` to
    `layers.0.` itself), with the aux layer ids written in each engine's convention.
    speculators: `layers.0.*` names and a `speculators_model_type: eagle3` config whose
    `verifier.name_or_path` is an absolute path or a hub id, so it loads from any directory.
    sglang and vllm record the target and the source head relative to the working directory (the
    repository) where they lie inside it: an export may be committed, and must not name the folders
    of the machine that wrote it. An existing export of another head or with other settings is
    replaced only with `overwrite`.
    """
    if fmt not in EXPORT_FORMATS:
        raise UsageError(
            f"unknown --format {fmt!r}",
            f"one of {', '.join(EXPORT_FORMATS)}",
            "eagle3 export --head runs/NAME/head --format sglang --out DIR",
        )
    head_dir, out_dir = Path(head_dir), Path(out_dir)
    # validates names, shapes and aux layer fields before anything is written
    draft, spec = load_any_head(head_dir)
    if fmt == "sglang":
        problem = sglang_norm_problem(spec.norm_before_fc, spec.norm_before_residual)
        if problem:
            raise UsageError(
                f"{problem}; no SGLang export was written",
                "for SGLang, a head trained without --norm-before-fc and --norm-before-residual",
                f"eagle3 export --head {head_dir} --format vllm --out DIR   (or --format gguf, for llama.cpp)",
            )
    # marked: config.json + model.safetensors are any head folder's names; a user's own is refused
    claim_output(out_dir, "export", EXPORT_FILES, [("--head", head_dir)], marked=True)
    settings = {
        "head": repo_relative(head_dir),
        "format": fmt,
        "num_speculative_tokens": num_speculative_tokens,
        "dtype": dtype,
    }
    refuse_replacing(out_dir, "export", settings, overwrite)
    remove_dead_temps(out_dir)  # an export cut by a kill
    for notice in spec.notices:
        warn(notice)
    cfg = own_layout_config(draft, spec)
    own = cfg.setdefault("eagle3", {})
    if not own.get("target_architectures"):  # heads of other layouts: ask the target, if it is here
        archs = target_architectures(own.get("target"))
        if archs:
            own["target_architectures"] = archs
    if fmt == "speculators":
        support = speculators_support(cfg)
        if support.status == "no":
            raise UsageError(
                f"vLLM cannot serve an EAGLE-3 head on a {support.architecture} target (no SupportsEagle3 in "
                f"{support.source}); a speculators export would fail when vLLM starts",
                "a target family vLLM supports for EAGLE-3 (docs/serve.md lists them)",
                f"eagle3 export --head {head_dir} --format sglang --out DIR   (if SGLang supports the target)",
            )
    begin_writing(out_dir, "export")  # before the old manifest goes: a killed rerun stays ours
    (out_dir / "manifest.json").unlink(missing_ok=True)
    tensors = head_state_dict(draft)
    if dtype != "keep":  # floating weights only: d2t (int64) and t2d (bool) are maps
        tensors = {n: t.to(EXPORT_DTYPES[dtype]) if t.is_floating_point() else t for n, t in tensors.items()}
        cfg["torch_dtype"] = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[dtype]
    if fmt == "speculators":
        tensors = {n.replace("midlayer.", "layers.0."): t for n, t in tensors.items()}
        cfg = speculators_config(cfg, num_speculative_tokens)
    else:
        _portable_paths(cfg)
    write_head_files(out_dir, tensors, cfg)
    write_manifest(
        out_dir,
        "export",
        config=settings,
        format=fmt,
        source=repo_relative(head_dir),
        source_layout=spec.layout,
        target=(cfg.get("eagle3") or {}).get("target", {}),
        shards=[shard_record(out_dir / HEAD_WEIGHTS)],
    )
    end_writing(out_dir)
    return out_dir


def _portable_paths(cfg: dict) -> None:
    """The target path and a converted head's source, relative to the repository (see export_head)."""
    own = cfg.get("eagle3") or {}
    target = own.get("target") or {}
    if target.get("path"):
        target["path"] = repo_relative(target["path"])
    conv = own.get("converted_from") or {}
    if conv.get("path"):
        conv["path"] = repo_relative(conv["path"])
