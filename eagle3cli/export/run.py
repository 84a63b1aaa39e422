"""`run_export(config)`: a head of any layout (eagle3, SGLang, vLLM, speculators) written in another
engine's layout (`head.write.layout_files`), then checked as that engine's serve checks it.

sglang and vllm: eagle3's own layout (both engines load it; vLLM maps `midlayer.` to `layers.0.`
itself), with the aux layer ids written in each engine's convention. speculators: `layers.0.*`
names and a `speculators_model_type: eagle3` config whose `verifier.name_or_path` is an absolute
path or a hub id, so it loads from any directory. gguf: llama.cpp's converter (`engines.gguf_export`).

What an export writes is judged by the one head check, `head.check.problems(out, target, engine)`
for the engine that serves the format (`head.table.FORMAT_ENGINE`), against the target the head
names where it is on this machine: an export that engine's `serve --dry-run` would refuse (a flag
SGLang does not read, a target the engine cannot capture from, a field the engine reads wrong) is
deleted and refused (exit 2), so every export `eagle3 serve` accepts.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from ..console import warn
from ..head.card import card_evals
from ..head.check import problems, read_target, refuse
from ..head.folder import recorded_target
from ..head.read import load_any_head
from ..head.table import FORMAT_ENGINE, HEAD_WEIGHTS
from ..head.write import HEAD_FILES, layout_files, write_card, write_head_files
from ..model.target import repo_relative
from ..run_folder.folders import begin_writing, claim_output, end_writing, refuse_replacing
from ..run_folder.manifest import remove_dead_temps, shard_record, write_manifest
from .config import ExportConfig

EXPORT_FORMATS = tuple(f for f in FORMAT_ENGINE if f != "gguf")  # gguf: llama.cpp's converter (run_export)
EXPORT_FILES = HEAD_FILES  # what an export folder holds besides its manifest


def run_export(cfg: ExportConfig) -> Path:
    """`eagle3 export`: the head in cfg.format's layout in cfg.out (gguf: llama.cpp's files, converted by
    its own converter and read back)."""
    assert cfg.out is not None  # validate() requires it
    if cfg.format == "gguf":  # llama.cpp: converted by its own converter, then read back and checked
        from ..engines.gguf_export import export_gguf

        return export_gguf(cfg.head, cfg.target, cfg.out, cfg.dtype, overwrite=cfg.overwrite)
    assert cfg.head is not None  # validate() requires it for the other formats
    return export_head(cfg.head, cfg.format, cfg.out, cfg.num_speculative_tokens, cfg.dtype, overwrite=cfg.overwrite)


def export_head(
    head_dir: Path,
    fmt: str,
    out_dir: Path,
    num_speculative_tokens: int = 7,
    dtype: str = "keep",
    overwrite: bool = False,
) -> Path:
    """Write a head of any layout in `fmt`'s layout (module docstring). An existing export of another
    head or with other settings is replaced only with `overwrite`."""
    head_dir, out_dir = Path(head_dir), Path(out_dir)
    target = _local_target(head_dir)
    # the head as eval reads it, against its target where that is here: refused before anything is written
    draft, spec = load_any_head(head_dir, target=target)
    tensors, cfg = layout_files(draft, spec, fmt, dtype, num_speculative_tokens)
    engine = FORMAT_ENGINE[fmt]
    with tempfile.TemporaryDirectory(prefix="eagle3-export-") as tmp:  # judged before the output folder is touched
        write_head_files(Path(tmp), tensors, cfg)
        found = [replace(p, what=p.what.replace(tmp, str(out_dir))) for p in problems(Path(tmp), target, engine)]
    for p in refuse(
        found,
        f"the {fmt} export of {head_dir} would not be what `eagle3 serve --engine {engine}` accepts, so none was "
        "written",
        "a head the engine reads as it was trained",
        f"eagle3 export --head {head_dir} --format {'vllm' if fmt == 'sglang' else 'gguf'} --out DIR   "
        "(another engine), or fix the head as listed",
    ):
        if p.what not in spec.notices:
            warn(f"{p.what}\n  ({p.fix})")
    for notice in spec.notices:
        warn(notice)
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
    begin_writing(out_dir, "export")  # before the old manifest goes: a killed rerun stays ours
    (out_dir / "manifest.json").unlink(missing_ok=True)
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
    write_card(out_dir, card_evals(head_dir))  # the same weights in another layout: the source's acceptance
    end_writing(out_dir)
    return out_dir


def _local_target(head_dir: Path):
    """The facts of the target the head names, when that folder is on this machine (else None: the
    export is checked against itself)."""
    ref = recorded_target(head_dir)
    if ref and (Path(ref) / "config.json").is_file():
        return read_target(Path(ref))
    return None
