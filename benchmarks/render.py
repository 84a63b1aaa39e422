"""The one renderer of the results pages: a page is its JSON and a Jinja template in docs/templates/ (the
prose and tables; the JSON holds every number), so it regenerates byte for byte. Templates run sandboxed
with StrictUndefined: a key read without `d.get(...)` must be in the JSON, or rendering fails instead of
printing nothing. Sections are one blank line apart however the `{% if %}` blocks leave them."""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from jinja2 import FileSystemLoader, StrictUndefined, Undefined
from jinja2.sandbox import SandboxedEnvironment

TEMPLATES = Path(__file__).resolve().parents[1] / "docs" / "templates"


def cell(x: object, nd: int = 3) -> str:
    """A table cell: '-' for nothing, floats to ND decimals, ints with thousands separators."""
    if x is None or isinstance(x, bool):
        return "-" if x is None else ("yes" if x else "no")
    return f"{x:.{nd}f}" if isinstance(x, float) else f"{x:,}" if isinstance(x, int) else str(x)


def rows_table(rows: Sequence[dict] | dict, columns: Sequence[str] | None = None) -> str:
    """A table of flat records (a list, or a dict of them by name) whose columns are their keys: a section
    for a key with no table of its own yet."""
    if isinstance(rows, dict):
        rows = [{"name": k, **(v if isinstance(v, dict) else {"value": v})} for k, v in rows.items()]
    cols = list(columns or dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return "\n".join(lines + ["| " + " | ".join(cell(r.get(c)) for c in cols) + " |" for r in rows])


def f(x, nd: int = 2, sign: str = "") -> str:
    return "-" if x is None else format(x, f"{sign}.{nd}f")


def iv(x, nd: int = 2, sign: str = "") -> str:
    return "" if not x else f"[{x[0]:{sign}.{nd}f}, {x[1]:{sign}.{nd}f}]"


FILTERS = {"f": f, "x": lambda v: "-" if v is None else f"{v:.2f}x", "iv": iv, "fmt": format, "cell": cell}


def _strict(fn: Callable) -> Callable:
    # str() of a StrictUndefined raises naming the missing key, where format() would fail without naming it
    return lambda v, *a: str(v) if isinstance(v, Undefined) else fn(v, *a)


def render_template(name: str, data: dict, filters: dict | None = None, **names: object) -> str:
    """TEMPLATES/NAME rendered with the JSON as `d`, the common FILTERS and FILTERS, and NAMES as globals."""
    env = SandboxedEnvironment(loader=FileSystemLoader(TEMPLATES), undefined=StrictUndefined, trim_blocks=True,
                               lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)  # fmt: skip
    env.filters.update({k: _strict(fn) for k, fn in (FILTERS | (filters or {})).items()})
    env.globals.update(rows_table=rows_table, log2=math.log2, **names)
    return re.sub(r"\n{3,}", "\n\n", env.get_template(name).render(d=data)).strip("\n") + "\n"


def check_or_write(pages: dict[Path, str], check: bool, source: Path, program: str) -> None:
    """Each page's text: compared (exit 1 naming the stale ones when CHECK) or written where it changed."""
    stale = [p for p, text in pages.items() if not p.exists() or p.read_text(encoding="utf-8") != text]
    if check and stale:
        print(f"out of date (differs from {source}): {', '.join(map(str, stale))}; run {program}", file=sys.stderr)
        raise SystemExit(1)
    for p in [] if check else stale:
        p.write_text(pages[p], encoding="utf-8")


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display: figures are files
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path, dpi: int = 110) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
