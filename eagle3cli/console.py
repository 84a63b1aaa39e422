"""Rich console, progress bars and tables. Only rank 0 draws; other ranks stay silent."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
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

# emoji off: user text such as `gsm8k:-1` (a source and a count) must not print as an emoji code.
console = Console(stderr=True, highlight=False, emoji=False)
out = Console(highlight=False, emoji=False)  # results (tables) go to stdout so they can be piped


def is_rank0() -> bool:
    return os.environ.get("RANK", "0") == "0" and os.environ.get("LOCAL_RANK", "0") == "0"


def is_launched_rank() -> bool:
    """A process a distributed launcher (deepspeed, torchrun) started: it sets LOCAL_RANK."""
    return "LOCAL_RANK" in os.environ


# Messages are plain text: they carry folder names, record ids and server replies, which rich would
# read as markup (`[bold red]x[/] [/]` as a folder name raised MarkupError on every rerun). Style
# comes only from `lead`/`style`, the code's own words.
def log(msg: str, lead: tuple[str, str] | None = None, style: str = "") -> None:
    """One line of plain text, after an optional styled `lead` (text, rich style)."""
    if is_rank0():
        text = Text.assemble(lead, " ") if lead else Text()
        text.append(redact_text(msg), style)
        console.print(text)


def warn(msg: str) -> None:
    if is_rank0():
        console.print(Text.assemble(("warning:", "yellow"), " ", redact_text(msg)))


class _RateColumn(ProgressColumn):
    """Items/s and, when the caller counts them, tokens/s of this session's work (a resumed run
    starts its bar at the items already done; they are not this session's rate)."""

    def render(self, task: Task) -> Text:
        elapsed = task.elapsed or 0.0
        if elapsed <= 0:
            return Text("")
        unit = task.fields.get("unit", "it")
        parts = [f"{(task.completed - task.fields.get('session_start', 0)) / elapsed:,.2f} {unit}/s"]
        tokens = task.fields.get("tokens", 0)
        if tokens:
            parts.append(f"{tokens / elapsed:,.0f} tok/s")
        return Text("  ".join(parts), style="cyan")


# Seconds between plain progress lines when stderr is not a terminal (a log file, a pipe, CI).
PLAIN_EVERY_S = float(os.environ.get("EAGLE3_PROGRESS_EVERY", "10"))


class StageProgress:
    """Handle returned by `progress()`: advance by items and count tokens for the tok/s column.
    Without a terminal it prints one plain line every PLAIN_EVERY_S seconds instead of a bar."""

    def __init__(
        self, prog: Progress | None, task_id, completed: int = 0, plain: tuple[str, int | None, str] | None = None
    ):
        self._prog, self._task = prog, task_id
        self.tokens = 0
        self.completed = self.start = completed
        self.started = self._last_line = time.time()
        self._plain = plain  # (description, total, unit) when lines replace the bar
        self.note = ""  # e.g. gen-data's records rejected so far, by reason

    def advance(self, n: int = 1, tokens: int = 0, note: str | None = None, **fields) -> None:
        self.tokens += tokens
        self.completed += n
        if note is not None:
            self.note = note
            fields["note"] = note
        if self._prog is not None:
            self._prog.update(self._task, advance=n, tokens=self.tokens, **fields)
        elif self._plain is not None and time.time() - self._last_line >= PLAIN_EVERY_S:
            self.print_line()

    def line(self) -> str:
        """'gen-data 40/96 (41.7%)  0.52 conv/s  61 tok/s  elapsed 77s  eta 107s' (this session's rates)."""
        desc, total, unit = self._plain or ("", None, "it")
        elapsed = max(time.time() - self.started, 1e-9)
        rate = (self.completed - self.start) / elapsed
        parts = [f"{desc} {self.completed:,}" + (f"/{total:,} ({100 * self.completed / total:.1f}%)" if total else "")]
        parts.append(f"{rate:,.2f} {unit}/s")
        if self.tokens:
            parts.append(f"{self.tokens / elapsed:,.0f} tok/s")
        parts.append(f"elapsed {elapsed:,.0f}s")
        if total and rate > 0:
            parts.append(f"eta {(total - self.completed) / rate:,.0f}s")
        if self.note:
            parts.append(self.note)
        return "  ".join(parts)

    def print_line(self) -> None:
        self._last_line = time.time()
        console.print(self.line(), markup=False, highlight=False, soft_wrap=True)


def _heartbeat(handle: StageProgress, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        if time.time() - handle._last_line >= PLAIN_EVERY_S:
            handle.print_line()


@contextmanager
def progress(description: str, total: int | None, unit: str = "it", completed: int = 0) -> Iterator[StageProgress]:
    """A progress bar with ETA, items/s and tokens/s; a no-op on ranks other than 0."""
    if not is_rank0():
        yield StageProgress(None, None, completed)
        return
    if not console.is_terminal:
        handle = StageProgress(None, None, completed, plain=(description, total, unit))
        handle.print_line()
        # a heartbeat: a batch of long generations or a compilation advances nothing for minutes
        stop = threading.Event()
        beat = threading.Thread(target=_heartbeat, args=(handle, stop), daemon=True)
        beat.start()
        try:
            yield handle
        finally:
            stop.set()
            beat.join()
            handle.print_line()
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
        TextColumn("{task.fields[note]}", markup=False),
        console=console,
        transient=False,
    )
    with prog:
        task_id = prog.add_task(
            escape(description), total=total, completed=completed, unit=unit, tokens=0, session_start=completed, note=""
        )
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
    """Cells and title are plain text (user strings); a cell that is a rich `Text` keeps its style."""
    t = Table(title=Text(redact_text(title)), title_style="bold", header_style="bold cyan")
    for i, c in enumerate(columns):
        t.add_column(Text(c), justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(
            *[
                v if isinstance(v, Text) else Text(f"{v:,.4g}" if isinstance(v, float) else redact_text(str(v)))
                for v in r
            ]
        )
    return t


def print_table(title: str, columns: list[str], rows: Sequence[Sequence[object]]) -> None:
    if is_rank0():
        out.print(table(title, columns, rows))
