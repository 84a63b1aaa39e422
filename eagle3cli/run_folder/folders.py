"""Which folder a stage may write into: a new or empty one, or one it wrote itself; never another
stage's, a user's, or its own input.

One wrong flag (`eagle3 cache --data runs/a/data --out runs/a/data`) used to replace a gen-data
manifest with a cache manifest, after which the data could only be regenerated from scratch. Each
writing stage calls `claim_output` before it writes anything; the check reads names only.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable
from pathlib import Path

from ..errors import UsageError
from .manifest import MANIFEST, atomic_write_json

# A stage that writes generic names (export: config.json, model.safetensors; serve-bench: bench.json)
# drops this file before its first write and removes it with its manifest: own-named files with
# neither beside them are a user's (a head folder with its notes), not a killed run of ours.
WRITING = ".eagle3-writing"
# Files any stage leaves in its folder: its lock(s), temps of atomic writes, a placeholder.
COMMON = (".lock", ".lock.*", ".*.tmp", ".gitkeep", MANIFEST, WRITING)
EXAMPLES = {"export": "runs/NAME/head-speculators", "serve-bench": "runs/NAME/bench"}  # else runs/NAME/STAGE


def manifest_stage(folder: Path) -> str | None:
    """The stage an eagle3 manifest in `folder` names; "" for a manifest.json eagle3 did not write;
    None where there is none."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    try:
        m = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return ""
    if not isinstance(m, dict) or "schema_version" not in m or not isinstance(m.get("stage"), str):
        return ""
    return m["stage"]


def _same_or_inside(a: Path, b: Path) -> bool:
    a, b = a.resolve(), b.resolve()
    return a == b or b in a.parents


def foreign_files(folder: Path, own: Iterable[str]) -> list[str]:
    """Names in `folder` that match none of the stage's own patterns (sorted)."""
    pats = (*COMMON, *own)
    return sorted(p.name for p in Path(folder).iterdir() if not any(fnmatch.fnmatchcase(p.name, q) for q in pats))


def link_out(out: Path) -> Path | None:
    """Where `out` leads when it is a symbolic link out of the folder that names it
    (`runs/NAME/head -> ~/my-head`); None for a plain folder or a link that stays inside."""
    out = Path(out)
    if not out.is_symlink():
        return None
    home, there = out.parent.resolve(), out.resolve()
    return None if home in there.parents else there


def refuse_link_out(out: Path, stage: str, nxt: str, command: str | None = None, resumable: Iterable[str] = ()) -> None:
    """A stage's folder that is a link out of its run is followed only into a new or empty folder, or
    one this stage wrote (its manifest, its mark while it writes, or `resumable`: globs of the records
    an unfinished run of the stage leaves): a link to a folder of a user's (a head, a model) would have
    eagle3 write over files it never wrote. Every writing stage asks this (most through `claim_output`)."""
    there = link_out(out)
    if there is None or not there.is_dir() or not any(there.iterdir()):
        return
    if manifest_stage(there) == stage or _marked_by(there, stage):
        return
    if any(next(there.glob(g), None) is not None for g in resumable):
        return
    raise UsageError(
        f"{out} is a link to {there}, outside the run folder, and that folder holds files `eagle3 {command or stage}` "
        f"did not write ({', '.join(sorted(p.name for p in there.iterdir())[:6])}): it would write through the link",
        f"{out} a folder of the run's own, or a link to an empty folder",
        nxt,
    )


def claim_output(
    out: Path,
    stage: str,
    own: Iterable[str],
    inputs: Iterable[tuple[str, Path]] = (),
    flag: str = "--out",
    marked: bool = False,
    command: str | None = None,
    next_step: str | None = None,
    resumable: Iterable[str] = (),
) -> None:
    """Refuse (exit 2, naming what is there) an output folder that is one of the stage's inputs
    (`inputs`: (what, path) pairs) or lies inside one, that is a link out of its run to a folder this
    stage did not write (`refuse_link_out`), that holds another stage's manifest or a manifest eagle3
    did not write, or that holds files matching none of `own` (the stage's names).
    `marked`: the stage writes through `begin_writing`, so files of its own names with neither its
    manifest nor its WRITING mark beside them were not written by it and are refused too.
    `command`: the command that writes the folder where it is not the stage's name (train writes `head`);
    `resumable`: see `refuse_link_out`."""
    out, own = Path(out), tuple(own)
    example = EXAMPLES.get(stage, f"runs/NAME/{stage}")
    nxt = next_step or f"give `eagle3 {stage}` a folder of its own: {flag} NEW_FOLDER (e.g. {example})"
    refuse_link_out(out, stage, nxt, command, resumable)
    cmd = command or stage
    for what, p in inputs:
        if p is not None and _same_or_inside(out, Path(p)):
            raise UsageError(
                f"{flag} {out} is {'inside ' if out.resolve() != Path(p).resolve() else ''}this stage's input "
                f"({what} {p}): `eagle3 {cmd}` never writes into its own input folder",
                "an output folder apart from the inputs",
                nxt,
            )
    if not out.is_dir():
        return
    st = manifest_stage(out)
    if st == "":
        raise UsageError(
            f"{out / MANIFEST} is not a manifest eagle3 wrote; `eagle3 {cmd}` would overwrite it",
            f"a new or empty folder, or one `eagle3 {cmd}` wrote",
            nxt,
        )
    if st is not None and st != stage:
        raise UsageError(
            f"{out} holds the output of `eagle3 {st}` ({out / MANIFEST} names stage '{st}'); "
            f"`eagle3 {cmd}` would overwrite it",
            f"a new or empty folder, or one `eagle3 {cmd}` wrote",
            nxt,
        )
    foreign = foreign_files(out, own)
    if foreign:
        shown = ", ".join(foreign[:8]) + (f" (+{len(foreign) - 8} more)" if len(foreign) > 8 else "")
        raise UsageError(
            f"{out} holds files `eagle3 {cmd}` did not write: {shown}",
            f"a new or empty folder, or one `eagle3 {cmd}` wrote",
            nxt,
        )
    if marked and st != stage and not _marked_by(out, stage):
        found = sorted(p.name for p in out.iterdir() if any(fnmatch.fnmatchcase(p.name, q) for q in own))
        if found:
            raise UsageError(
                f"{out} holds {', '.join(found[:8])} but no manifest of `eagle3 {cmd}`: eagle3 did not write "
                f"them (a head or model folder of your own?), and `eagle3 {cmd}` would overwrite them",
                f"a new or empty folder, or one `eagle3 {cmd}` wrote",
                nxt,
            )


def _marked_by(out: Path, stage: str) -> bool:
    try:
        return json.loads((Path(out) / WRITING).read_bytes()).get("stage") == stage
    except (OSError, ValueError, AttributeError):
        return False


def begin_writing(out: Path, stage: str) -> None:
    """Mark `out` as being written by `stage` (before its first file): a run killed before its manifest
    is then still recognised as this stage's by `claim_output(..., marked=True)`."""
    Path(out).mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(out) / WRITING, {"stage": stage})


def end_writing(out: Path) -> None:
    """The manifest is written: the folder speaks for itself now."""
    (Path(out) / WRITING).unlink(missing_ok=True)


# Settings that do not change what a finished output holds: where it goes, the replace switch itself,
# how many CPU threads computed it.
_NOT_SETTINGS = ("out", "overwrite", "threads")


def refuse_replacing(out: Path, stage: str, config: dict, overwrite: bool, flag: str = "--out") -> None:
    """A finished output of `stage` in `out` (its manifest names the stage) made with other settings
    or inputs is not replaced silently: exit 2 naming each difference, unless --overwrite. The same
    command again may rerun (it recomputes, or resumes, what it wrote before)."""
    path = Path(out) / MANIFEST
    if overwrite or manifest_stage(Path(out)) != stage:
        return
    try:
        old = json.loads(path.read_bytes()).get("config")
    except (OSError, ValueError):
        return
    if not isinstance(old, dict):
        return
    new = json.loads(json.dumps(config, default=str))  # tuples -> lists, as the manifest holds them
    diffs = [
        f"{k.replace('_', '-')}: {old[k]!r} there, {new.get(k)!r} now"
        for k in sorted(old)
        if k not in _NOT_SETTINGS and k in new and old[k] != new[k]
    ]
    if diffs:
        shown = "\n  ".join(diffs[:8]) + (f"\n  (+{len(diffs) - 8} more)" if len(diffs) > 8 else "")
        raise UsageError(
            f"{out} holds a finished `eagle3 {stage}` made with other settings; this run would replace it:\n  {shown}",
            f"a new {flag} folder, or --overwrite to replace that output",
            f"add {flag} NEW_FOLDER (e.g. {EXAMPLES.get(stage, f'runs/NAME/{stage}')}-2), or add --overwrite",
        )
