"""The one renderer of the results pages: a page is its JSON and a list of section specs.

A spec names the JSON key its section reads, its heading and a body (a function of the whole JSON
that returns Markdown lines: prose, `table(...)` or `rows_table(...)`). A section whose key is
absent (or empty) is left out, or says `missing` (e.g. "not yet run on a GPU") when the spec gives it. The
measurement programs write keys; nothing here measures or reads a run folder, so a page
regenerates byte for byte from its JSON (`python benchmarks/smollm2/report_page.py --check`).

A new key's section is one spec:

    Section("gpu_check", "## On a GPU", lambda d: rows_table(d["gpu_check"]["checks"]), missing="Not yet run.")
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

Body = Callable[[dict], list[str]]


@dataclass(frozen=True)
class Section:
    key: str  # the JSON key the section reads; "" for one that reads nothing (the page's intro)
    heading: str  # "## ..." or "" (no heading)
    body: Body
    missing: str | None = None  # said when `key` is absent; None leaves the section out


def cell(x: object, nd: int = 3) -> str:
    """A table cell: '-' for nothing, floats to ND decimals, ints with thousands separators."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return out + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]


def rows_table(rows: Sequence[dict] | dict, columns: Sequence[str] | None = None) -> list[str]:
    """A table of flat records (a list, or a dict of them by name) whose columns are their keys,
    in first-seen order unless COLUMNS names them: a section for a key with no spec of its own yet."""
    if isinstance(rows, dict):
        rows = [{"name": k, **(v if isinstance(v, dict) else {"value": v})} for k, v in rows.items()]
    cols = list(columns or dict.fromkeys(k for r in rows for k in r))
    return table(cols, [[cell(r.get(c)) for c in cols] for r in rows])


def render(data: dict, sections: Sequence[Section]) -> str:
    """The page: each section whose key DATA holds (or that says what is missing), one blank line apart."""
    parts: list[list[str]] = []
    for s in sections:
        if s.key and not data.get(s.key):  # absent, or written empty (a run that measured nothing there)
            if s.missing is None:
                continue
            body = [s.missing]
        else:
            body = s.body(data)
            if not body:
                continue
        parts.append(([s.heading, ""] if s.heading else []) + body)
    return "\n\n".join("\n".join(p).strip("\n") for p in parts) + "\n"


def write(md_path: Path, text: str) -> bool:
    """Write the page if it changed; True when it did."""
    if md_path.exists() and md_path.read_text(encoding="utf-8") == text:
        return False
    md_path.write_text(text, encoding="utf-8")
    return True
