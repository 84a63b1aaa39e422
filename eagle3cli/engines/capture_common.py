"""What the engine capture routes of `eagle3 cache --engine` share (`vllm_capture.py`, `sglang_capture.py`):
the words of their errors and the end of an engine's log. An engine that cannot start, or answers
wrongly, is a setup to fix (exit 2); one lost mid-cache is work the same command finishes (exit 3)."""

from __future__ import annotations

from pathlib import Path

from ..errors import IncompleteError, StageError, UsageError
from .local_engine import tail

HF_ROUTE = "rerun without --engine (the target in eagle3's own process)"


def log_end(path: Path, lines: int = 8) -> str:
    """The engine log's last lines without traceback frames: the error's own lines say what happened,
    and the whole log is one path away."""
    said = [ln for ln in tail(path, 200).splitlines() if ln.strip() and not ln.startswith((" ", "\t", "Traceback"))]
    return "\n".join(said[-lines:])


def died(engine: str, what: str, code: int | None, log_path: Path, starting: bool, needs: str) -> UsageError:
    """The engine process `what` (exited, was never ready, died mid-cache), with its log's end."""
    said = f"--engine {engine}: the engine {what} (exit code {code}). Its log ({log_path}) ends:\n{log_end(log_path)}"
    if starting:
        return StageError(said, needs, HF_ROUTE)
    return IncompleteError(
        said,
        "an engine that runs until the cache is done",
        f"rerun the same command: finished shards are kept and only the rest is computed; or {HF_ROUTE}",
    )


def bad_answer(engine: str, what: str, log_path: Path, expected: str, version: str) -> StageError:
    """An answer eagle3 does not use: nothing is written from it."""
    return StageError(
        f"--engine {engine}: the engine {what}; no shard was written from it. Its log: {log_path}",
        expected,
        f"{HF_ROUTE}; or report the {engine} version ({version}) with the log",
    )
