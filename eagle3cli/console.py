"""Rich console, progress bars and tables. Only rank 0 draws; other ranks stay silent."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from .urls import redact_text

console = Console(stderr=True, highlight=False)
out = Console(highlight=False)  # results (tables) go to stdout so they can be piped


def is_rank0() -> bool:
    return os.environ.get("RANK", "0") == "0" and os.environ.get("LOCAL_RANK", "0") == "0"


def log(msg: str) -> None:
    if is_rank0():
        console.print(redact_text(msg))


def warn(msg: str) -> None:
    if is_rank0():
        console.print(f"[yellow]warning:[/] {redact_text(msg)}")


class _RateColumn(ProgressColumn):
    """Items/s and, when the caller counts them, tokens/s over the whole run."""

    def render(self, task: Task) -> Text:
        elapsed = task.elapsed or 0.0
        if elapsed <= 0:
            return Text("")
        unit = task.fields.get("unit", "it")
        parts = [f"{task.completed / elapsed:,.2f} {unit}/s"]
        tokens = task.fields.get("tokens", 0)
        if tokens:
            parts.append(f"{tokens / elapsed:,.0f} tok/s")
        return Text("  ".join(parts), style="cyan")


class StageProgress:
    """Handle returned by `progress()`: advance by items and count tokens for the tok/s column."""

    def __init__(self, prog: Progress | None, task_id, completed: int = 0):
        self._prog, self._task = prog, task_id
        self.tokens = 0
        self.completed = completed
        self.started = time.time()

    def advance(self, n: int = 1, tokens: int = 0, **fields) -> None:
        self.tokens += tokens
        self.completed += n
        if self._prog is not None:
            self._prog.update(self._task, advance=n, tokens=self.tokens, **fields)


@contextmanager
def progress(description: str, total: int | None, unit: str = "it", completed: int = 0) -> Iterator[StageProgress]:
    """A progress bar with ETA, items/s and tokens/s; a no-op on ranks other than 0."""
    if not is_rank0():
        yield StageProgress(None, None, completed)
        return
    prog = Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        _RateColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )
    with prog:
        task_id = prog.add_task(description, total=total, completed=completed, unit=unit, tokens=0)
        yield StageProgress(prog, task_id, completed)


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB': sizes in messages keep 3 significant digits at any scale (a small cache on
    a nearly full disk is not '0.00 GiB needed, 0.00 GiB free')."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} B" if unit == "B" else f"{n:,.3g} {unit}" if abs(n) < 1000 else f"{n:,.0f} {unit}"
        n /= 1024
    return f"{n} TiB"


def table(title: str, columns: list[str], rows: Sequence[Sequence[object]]) -> Table:
    t = Table(title=title, title_style="bold", header_style="bold cyan")
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*[f"{v:,.4g}" if isinstance(v, float) else redact_text(str(v)) for v in r])
    return t


def print_table(title: str, columns: list[str], rows: Sequence[Sequence[object]]) -> None:
    if is_rank0():
        out.print(table(title, columns, rows))
