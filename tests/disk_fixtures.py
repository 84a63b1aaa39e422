"""A real small filesystem for full-disk tests: a tmpfs mounted for the test (root only), and a
ballast file that fills it up to a given free space. No tests here."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_disk(path: Path, size: str = "9m") -> Iterator[Path]:
    """Mount a tmpfs of `size` at `path` for the block; skip the test (saying why) where mounting is
    not permitted (not root, a container without CAP_SYS_ADMIN)."""
    path.mkdir(parents=True, exist_ok=True)
    if not shutil.which("mount"):
        pytest.skip("no mount command: the full-disk test needs a real small filesystem")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.decode(errors='replace').strip() or 'not permitted'})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk: Path, leave: int) -> Path:
    """Write a ballast file so that about `leave` bytes stay free on `disk`; returns it."""
    ballast = disk / "ballast"
    free = shutil.disk_usage(disk).free
    with open(ballast, "ab") as f:
        f.write(b"\0" * max(0, free - leave))
        f.flush()
        os.fsync(f.fileno())
    return ballast
