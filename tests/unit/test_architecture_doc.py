"""docs/architecture.md names every module of the package and every benchmark program: a module
added without a line there fails here."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")


def named(path: str) -> bool:
    """`path` appears in the page as itself, not as the tail of a longer path (`run.py` is not named
    by `cache/run.py`)."""
    return re.search(rf"(?<![\w/.]){re.escape(path)}(?![\w])", DOC) is not None


def test_every_module_of_the_package_is_named():
    base = REPO / "eagle3cli"
    missing = []
    for p in sorted(base.rglob("*.py")):
        rel = p.relative_to(base)
        if rel == Path("__init__.py"):
            continue  # the package itself
        # a package is named by its folder, e.g. `cache/`
        name = f"{rel.parent.as_posix()}/" if p.name == "__init__.py" else rel.as_posix()
        if not named(name):
            missing.append(name)
    assert missing == [], "add these to docs/architecture.md"


def test_every_benchmark_program_is_named():
    base = REPO / "benchmarks"
    missing = [
        p.relative_to(base).as_posix()
        for p in sorted(base.rglob("*.py"))
        if p.name != "__init__.py" and not named(p.name)
    ]
    assert missing == [], "add these to docs/architecture.md"


def test_the_checker_tells_a_path_from_its_tail():
    assert named("cache/run.py") and named("manifest.py") and not named("ache/run.py")
