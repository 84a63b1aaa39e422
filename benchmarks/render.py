"""The one renderer of the results pages: a page is its JSON and a Jinja template in docs/templates/.

The template holds the page's prose and tables; the JSON every number. The measurement programs write keys;
nothing here measures or reads a run folder, so a page regenerates byte for byte from its JSON
(`python benchmarks/smollm2/report_page.py --check`). Templates run sandboxed with StrictUndefined: a key a
template reads without `d.get(...)` must be in the JSON, or rendering fails instead of printing nothing.
Sections are one blank line apart however the template's `{% if %}` blocks leave them.

A new key's section is one block in the template:

    {% if d.get('epoch_curve') %}
    ## Epochs

    {{ rows_table(d.epoch_curve, ['epoch', 'tau']) }}
    {% endif %}
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from jinja2 import FileSystemLoader, StrictUndefined, Undefined
from jinja2.sandbox import SandboxedEnvironment

TEMPLATES = Path(__file__).resolve().parents[1] / "docs" / "templates"


def cell(x: object, nd: int = 3) -> str:
    """A table cell: '-' for nothing, floats to ND decimals, ints with thousands separators."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def rows_table(rows: Sequence[dict] | dict, columns: Sequence[str] | None = None) -> list[str]:
    """A table of flat records (a list, or a dict of them by name) whose columns are their keys,
    in first-seen order unless COLUMNS names them: a section for a key with no spec of its own yet."""
    if isinstance(rows, dict):
        rows = [{"name": k, **(v if isinstance(v, dict) else {"value": v})} for k, v in rows.items()]
    cols = list(columns or dict.fromkeys(k for r in rows for k in r))
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)] + [
        "| " + " | ".join(cell(r.get(c)) for c in cols) + " |" for r in rows
    ]


def f(x, nd: int = 2, sign: str = "") -> str:
    return "-" if x is None else format(x, f"{sign}.{nd}f")


def iv(x, nd: int = 2, sign: str = "") -> str:
    return "" if not x else f"[{x[0]:{sign}.{nd}f}, {x[1]:{sign}.{nd}f}]"


FILTERS = {"f": f, "x": lambda v: "-" if v is None else f"{v:.2f}x", "iv": iv, "fmt": format, "cell": cell}


def _strict(fn: Callable) -> Callable:
    """A filter that names the missing key (UndefinedError) rather than failing inside a format()."""

    def filt(v, *a):
        return str(v) if isinstance(v, Undefined) else fn(v, *a)  # str() of a StrictUndefined raises

    return filt


def render_template(name: str, data: dict, filters: dict | None = None, **names: object) -> str:
    """TEMPLATES/NAME rendered with the JSON as `d`, the common FILTERS and FILTERS, and NAMES as globals."""
    env = SandboxedEnvironment(loader=FileSystemLoader(TEMPLATES), undefined=StrictUndefined, trim_blocks=True,
                               lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)  # fmt: skip
    env.filters.update({k: _strict(fn) for k, fn in (FILTERS | (filters or {})).items()})
    env.globals.update(rows_table=lambda *a: "\n".join(rows_table(*a)), log2=math.log2, **names)
    text = env.get_template(name).render(d=data)
    return re.sub(r"\n{3,}", "\n\n", text).strip("\n") + "\n"


def write(md_path: Path, text: str) -> bool:
    """Write the page if it changed; True when it did."""
    if md_path.exists() and md_path.read_text(encoding="utf-8") == text:
        return False
    md_path.write_text(text, encoding="utf-8")
    return True
