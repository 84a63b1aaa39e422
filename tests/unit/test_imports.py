"""The import graph of the package and the benchmarks, read from the source with ast (nothing is
imported): no module reaches itself through imports, lazy ones inside functions included, and
serve does not read through eval."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("eagle3cli", "benchmarks")


def module_name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(base: Path, roots: tuple[str, ...]) -> dict[str, set[str]]:
    """module -> the modules under `roots` it imports (every import statement, at any depth)."""
    files = {module_name(p, base): p for root in roots for p in sorted((base / root).rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    up = package.split(".")
                    up = up[: len(up) - node.level + 1]
                    source = ".".join(up + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                # `from pkg import sub` imports the submodule `pkg.sub` where there is one
                targets = [source, *(f"{source}.{a.name}" for a in node.names)]
            for t in targets:
                if t in files and t != name:
                    graph[name].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_checker_finds_a_lazy_relative_circle(tmp_path):
    pkg = tmp_path / "pkg" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import x\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n")
    (pkg / "c.py").write_text("import pkg.sub.a\nfrom ..sub import b\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.sub.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.sub", "pkg.sub.a"}
    assert graph["pkg.sub.c"] == {"pkg.sub.a", "pkg.sub", "pkg.sub.b"}
    assert cycles(graph) == [["pkg.sub.a", "pkg.sub.b"]]


def test_no_import_circles_in_the_package_or_the_benchmarks():
    graph = import_graph(REPO, ROOTS)
    assert "eagle3cli.model.heads" in graph and "benchmarks.smollm2.report" in graph
    assert cycles(graph) == [], "modules that import each other (directly or around a loop)"


def test_serve_does_not_import_eval():
    graph = import_graph(REPO, ("eagle3cli",))
    bad = {m: sorted(t for t in ts if t.startswith("eagle3cli.eval")) for m, ts in graph.items()}
    assert {m: ts for m, ts in bad.items() if m.startswith("eagle3cli.serve") and ts} == {}


def test_recipes_hold_data_and_short_scripts_only():
    """recipes/ is what a user copies and edits: YAML plus the short scripts a header says to run;
    programs (benchmarks, the tiny target's trainer) live in benchmarks/ and tools/."""
    repo = Path(__file__).resolve().parents[2]
    long = {
        str(p.relative_to(repo)): n
        for p in (repo / "recipes").rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").split("\n"))) > 100
    }
    assert not long, long
