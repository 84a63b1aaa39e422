"""One writer per stage folder: `stage_lock(folder, stage)` / `@locked_stage(...)`.

Every writing stage (gen-data, cache, train, eval) holds an exclusive lock on its output folder
while it runs, so a second process on the same folder is refused with who holds it, instead of
both "succeeding" with interleaved metrics or a crashed journal. The lock is `flock` on
`FOLDER/.lock`: the kernel drops it when its process dies, so a lock left by kill -9 or a crash
is simply taken over. Where a filesystem has no flock, a PID file is used instead, and a lock
whose PID no longer runs on this host is taken over.

Child processes of the holder (the DeepSpeed ranks of `eagle3 train --deepspeed`) are part of
the same job: the holder exports the lock path in EAGLE3_LOCKS_HELD and children skip it.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import os
import socket
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import UsageError

LOCK_NAME = ".lock"
HELD_ENV = "EAGLE3_LOCKS_HELD"


def _held() -> list[str]:
    return [p for p in os.environ.get(HELD_ENV, "").split(os.pathsep) if p]


# Who holds the lock: pid, host, stage and start time only. Never the command line: it may carry
# `--endpoint user:password@host` or an api_key, and the file is readable by others (0644).
LOCK_MODE = 0o644
# O_NOFOLLOW: a `.lock` that is a symbolic link (planted, or left by a copy) is refused (ELOOP),
# never followed: we would truncate and write the file it points to.
# O_NONBLOCK: a `.lock` that is a FIFO must not block the open (it is then refused below).
OPEN_FLAGS = os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK


def _holder_info(stage: str) -> bytes:
    return json.dumps(
        {"pid": os.getpid(), "host": socket.gethostname(), "stage": stage, "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    ).encode()


def _describe(raw: bytes) -> str:
    try:
        h = json.loads(raw)
        return f"pid {h['pid']} on {h['host']} (`eagle3 {h.get('stage')}`, since {h.get('since')})"
    except (ValueError, KeyError, TypeError):
        return "another process"


def _open(path: Path, flags: int) -> int:
    try:
        fd = os.open(path, flags | OPEN_FLAGS, LOCK_MODE)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise UsageError(
            f"{path} is a symbolic link: eagle3 never follows a link for its lock file (it would write where "
            f"the link points, {os.readlink(path)!r})",
            "a lock file eagle3 creates itself (or none)",
            f"remove the link (rm {path}) if no eagle3 runs there, then rerun the same command",
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device: flock/pread on it end in OSError
        os.close(fd)
        raise UsageError(
            f"{path} is not a regular file (a FIFO, socket or device): eagle3 cannot keep its lock there",
            "a lock file eagle3 creates itself (or none)",
            f"remove it (rm {path}) if no eagle3 runs there, then rerun the same command",
        )
    return fd


def _refuse(folder: Path, stage: str, who: str, path: Path) -> UsageError:
    return UsageError(
        f"{folder} is being written by another eagle3 {stage}: {who}",
        "one writer per stage folder",
        "wait for it to finish (or stop it), then rerun the same command to continue; to run both at once, "
        f"give this one another run folder. (If no such process exists, remove {path}.)",
    )


def _acquire_flock(path: Path, folder: Path, stage: str) -> int | None:
    """The locked descriptor, or None where the filesystem has no flock."""
    while True:
        fd = _open(path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = _describe(os.pread(fd, 4096, 0))
            os.close(fd)
            raise _refuse(folder, stage, who, path) from None
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                return None
            raise
        # The previous holder unlinks the file on release: if we locked an unlinked inode, retry.
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.pwrite(fd, _holder_info(stage), 0)
            return fd
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _acquire_pidfile(path: Path, folder: Path, stage: str) -> None:
    for _ in range(3):
        try:
            fd = _open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            try:
                with os.fdopen(_open(path, os.O_RDONLY), "rb") as f:
                    raw = f.read(4096)
            except FileNotFoundError:
                continue
            try:
                h = json.loads(raw)
                stale = h["host"] == socket.gethostname() and not _pid_alive(int(h["pid"]))
            except (ValueError, KeyError, TypeError):
                stale = False
            if not stale:
                raise _refuse(folder, stage, _describe(raw), path) from None
            path.unlink(missing_ok=True)  # its process is gone: take the lock over
            continue
        os.write(fd, _holder_info(stage))
        os.close(fd)
        return
    raise _refuse(folder, stage, "a process that keeps re-taking the lock", path)


@contextmanager
def stage_lock(folder: Path, stage: str, name: str = LOCK_NAME) -> Iterator[Path]:
    """Hold FOLDER/NAME exclusively for the block (the folder is created); UsageError if taken."""
    folder = Path(folder)
    created = [p for p in (folder, *folder.parents) if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    key = str(path.resolve())
    if key in _held():  # our parent process (or an outer block of ours) holds it
        yield path
        return
    fd = _acquire_flock(path, folder, stage)
    if fd is None:
        _acquire_pidfile(path, folder, stage)
    before = os.environ.get(HELD_ENV)
    os.environ[HELD_ENV] = os.pathsep.join([*_held(), key])
    try:
        yield path
    finally:
        if before is None:
            os.environ.pop(HELD_ENV, None)
        else:
            os.environ[HELD_ENV] = before
        path.unlink(missing_ok=True)  # unlink while still locked, so no one locks a dead inode
        if fd is not None:
            os.close(fd)
        for p in created:  # a stage that failed before writing leaves no empty folders behind
            try:
                p.rmdir()
            except OSError:
                break


def locked_stage(stage: str, folder_of: Callable, name_of: Callable | None = None) -> Callable:
    """Decorate `run_<stage>(cfg)`: hold the lock on `folder_of(cfg)` (None: no lock, e.g. a dry run)."""

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(cfg, *args, **kwargs):
            folder = folder_of(cfg)
            if folder is None:
                return fn(cfg, *args, **kwargs)
            with stage_lock(folder, stage, name_of(cfg) if name_of else LOCK_NAME):
                return fn(cfg, *args, **kwargs)

        return run

    return wrap
