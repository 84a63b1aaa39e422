"""Every file eagle3 opens is a regular file of bounded size, checked before it is opened.

Why before: open() of a FIFO blocks until a writer comes, so a FIFO planted as a head's
model.safetensors, a data manifest.json or a checkpoint hung a stage forever with nothing printed;
a device (/dev/zero) never ends. This module sits under config.py (the recipe loader reads through
it) and readers/ (input files, re-exported from readers/limits.py).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import UsageError


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    for test, name in (
        (stat.S_ISFIFO, "a FIFO, a named pipe"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a folder"),
    ):
        if test(mode):
            return name
    return None if stat.S_ISREG(mode) else "not a regular file"


def check_regular_file(path: Path, what: str, next_step: str | None = None, pipes: bool = False) -> os.stat_result:
    """Every file eagle3 opens is checked here before it is opened: a regular file (a pipe too where
    `pipes`: a flag's `<(cat f)`), never a device or socket. Why before: open() of a FIFO blocks until
    a writer comes, so a FIFO planted as model.safetensors or manifest.json hung a stage forever with
    nothing printed; /dev/zero never ends. Missing files are left to the caller's own message."""
    st = os.stat(path)  # follows links: what would be opened
    kind = _kind(st.st_mode)
    if kind is not None and not (pipes and stat.S_ISFIFO(st.st_mode)):
        raise UsageError(
            f"{what} {path} is not a regular file ({kind}): eagle3 does not open it, so nothing waits on it",
            f"{what} as a regular file",
            next_step or f"replace {path} with the file itself (ls -l {path} shows what it is)",
        )
    return st


def read_file_bytes(path: Path, what: str, limit: int, next_step: str | None = None, pipes: bool = False) -> bytes:
    """The bytes of a small file eagle3 reads whole (a config, a manifest, a recipe), at most `limit`:
    regular (or, with `pipes`, a pipe; one nobody writes to reads as empty instead of blocking)."""
    st = check_regular_file(path, what, next_step, pipes)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO with no writer: no wait
    try:
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as f:
            # in pieces: read(n) allocates its n-byte buffer first, so `limit + 1` at once was a
            # gigabyte asked of the allocator for a 1 KB config (refused under a per-process memory cap)
            pieces: list[bytes] = []
            got = 0
            while got <= limit and (piece := f.read(min(1 << 20, limit + 1 - got))):
                pieces.append(piece)
                got += len(piece)
            raw = b"".join(pieces)
    finally:
        os.close(fd)
    if not raw and stat.S_ISFIFO(st.st_mode):  # a named pipe with no writer: EOF at once, not a wait
        raise UsageError(
            f"{what} {path} is a pipe that nothing writes to (it gave no bytes)",
            f"{what} as a regular file, or a pipe with a writer (<(cat FILE))",
            next_step or f"pass the file itself instead of {path}",
        )
    if len(raw) > limit:
        raise UsageError(
            f"{what} {path} is over {human(limit)}, more than such a file holds",
            f"{what} of at most {human(limit)}",
            next_step or f"check the path {path}",
        )
    return raw
