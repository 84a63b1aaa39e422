"""The import graph of the package and the benchmarks, read from the source with ast (nothing is
imported): no module reaches itself through imports, lazy ones inside functions included, and
serve does not read through eval."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("eagle3cli", "benchmarks")


def module_name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache  # read once per process: six tests walk the same tree
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
    assert "eagle3cli.head.read" in graph and "benchmarks.smollm2.report" in graph
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


# ---------------------------------------------------------------- the shape of the house
# The stages: each a package with cli.py, config.py and run_<stage>(config).
STAGES = ("data", "cache", "train", "export", "eval", "serve")
# The method wing (docs/architecture.md): pure, it knows no stage, file, folder or screen.
WING = "eagle3cli.speculate"
SHELL_MODULES_A_WING_MAY_NOT_USE = (
    "eagle3cli.run_folder.manifest",
    "eagle3cli.console",
    "eagle3cli.errors",
    "eagle3cli.run_folder.folders",
)
# Its one import outside itself: the oneDNN-packed linears the draft's fused decode projections
# use (torch only; docs/architecture.md, "where the structure bends").
WING_MAY_IMPORT = {"eagle3cli.model.cpu_kernels"}
# Shared modules that read a stage's internals (docs/architecture.md, "where the structure bends").
SHELL_INTO_STAGE = {
    ("eagle3cli.doctor", "eagle3cli.serve.machine"),
    ("eagle3cli.prompts", "eagle3cli.data.formats"),
}


def _stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in STAGES else None


def _top_level_imports(path: Path) -> set[str]:
    """Top-level packages a file imports at run time (`import x.y`, `from x.y import z`; absolute ones,
    not those under `if TYPE_CHECKING:`, which annotations alone read)."""
    out = set()
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    typing_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
        for stmt in block.body
        for n in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_the_method_wing_imports_only_torch_transformers_and_itself():
    import sys

    graph = import_graph(REPO, ("eagle3cli",))
    wing = {m: ts for m, ts in graph.items() if m == WING or m.startswith(WING + ".")}
    assert "eagle3cli.speculate.draft" in wing and "eagle3cli.speculate.acceptance" in wing
    outside = {
        m: sorted(t for t in ts if not t.startswith(WING) and t not in WING_MAY_IMPORT) for m, ts in wing.items()
    }
    assert {m: ts for m, ts in outside.items() if ts} == {}, "the wing reaches into the shell"
    for m, ts in wing.items():
        assert not any(_stage(t) or t in SHELL_MODULES_A_WING_MAY_NOT_USE for t in ts), m
    allowed = set(sys.stdlib_module_names) | {"torch", "transformers", "__future__"}
    for path in sorted((REPO / "eagle3cli" / "speculate").rglob("*.py")):
        assert _top_level_imports(path) <= allowed, (path.name, sorted(_top_level_imports(path) - allowed))


WRITE_CALLS = {
    "atomic_write",
    "atomic_write_json",
    "atomic_write_tensors",
    "write_manifest",
    "write_text",
    "write_bytes",
    "save_file",
    "save_pretrained",
    "save",
    "savefig",
    "mkdir",
    "unlink",
    "rmtree",
    "rename",
    "replace",
    "claim_output",
}


def file_writes(path: Path) -> list[str]:
    """Calls in a file that write files: open(...) with a w/a/x/+ mode and the writers above."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name == "open":
            mode = (
                node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
            )
            if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and set(mode.value) & set("wax+"):
                found.append(f"{path.name}:{node.lineno} open(..., {mode.value!r})")
        elif name in WRITE_CALLS and not (
            name == "replace" and isinstance(f, ast.Attribute) and node.args and isinstance(node.args[0], ast.Constant)
        ):  # str.replace("a", "b")
            found.append(f"{path.name}:{node.lineno} {name}()")
    return found


def test_the_checker_finds_file_writes(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(
        "open(p, 'wb')\nopen(p)\nopen(p, mode='a')\natomic_write_json(p, d)\nx.save_pretrained(d)\n"
        "s.replace('a', 'b')\np.replace(q)\n"
    )
    assert [w.split(" ", 1)[1] for w in file_writes(f)] == [
        "open(..., 'wb')",
        "open(..., 'a')",
        "atomic_write_json()",
        "save_pretrained()",
        "replace()",
    ]


def test_model_and_the_wing_write_no_files():
    """model/ and speculate/ read (configs, safetensors headers, tokenizers) but never write: run
    folders, heads and manifests are written by the stages (and head/write.py, which train and
    export share)."""
    files = sorted((REPO / "eagle3cli" / "model").rglob("*.py")) + sorted(
        (REPO / "eagle3cli" / "speculate").rglob("*.py")
    )
    # head/: the table, the reader and the check read; write.py is the one writer of head folders
    files += [p for p in sorted((REPO / "eagle3cli" / "head").rglob("*.py")) if p.name != "write.py"]
    assert [w for p in files for w in file_writes(p)] == []


def test_no_stage_imports_another_stages_internals():
    """A stage may use another stage's package (its public face, e.g. `from ..cache import
    CacheReader`), never a module inside it; shared modules import no stage but the known bends."""
    graph = import_graph(REPO, ("eagle3cli",))
    bad = []
    for m, ts in sorted(graph.items()):
        for t in sorted(ts):
            own, other = _stage(m), _stage(t)
            if other is None or other == own or t == f"eagle3cli.{other}":
                continue
            if own is not None or (m not in ("eagle3cli.cli",) and (m, t) not in SHELL_INTO_STAGE):
                bad.append(f"{m} -> {t}")
    assert bad == []


# ---------------------------------------------------------------- the layers
# docs/architecture.md, "The layers": a table of rows `| N | `a.py`, `room/` | what |`. A module
# imports its own layer or a lower one (a larger N), never a higher one; the root holds <= 12 modules.
ROOT_MODULES_AT_MOST = 12


def documented_layers(doc: str) -> dict[str, int]:
    """The layer table of the architecture page: dotted module or package name -> its layer."""
    section = ("\n" + doc).split("\n## The layers\n", 1)[1].split("\n## ", 1)[0]
    layers: dict[str, int] = {}
    for line in section.splitlines():
        row = re.match(r"\| (\d+) \| (.*?) \|", line)
        for entry in re.findall(r"`([^`]+)`", row[2]) if row else []:
            parts = entry.rstrip("/").removesuffix(".py").split("/")
            name = ".".join(["eagle3cli", *([] if parts == ["__init__"] else parts)])
            assert name not in layers, f"{entry} is in two layers"
            layers[name] = int(row[1])  # type: ignore[index]
    return layers


def layer_of(module: str, layers: dict[str, int]) -> int | None:
    """The layer of the most specific entry naming `module` (itself, or a package above it)."""
    names = [n for n in layers if module == n or (n != "eagle3cli" and module.startswith(n + "."))]
    return layers[max(names, key=len)] if names else None


def upward_imports(graph: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    """Every import from a lower layer to a higher one, as `module (N) -> target (M)`."""
    bad = []
    for m, ts in sorted(graph.items()):
        for t in sorted(ts):
            lm, lt = layer_of(m, layers), layer_of(t, layers)
            if lm is not None and lt is not None and lt < lm:
                bad.append(f"{m} ({lm}) -> {t} ({lt})")
    return bad


def _doc() -> str:
    return (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")


def test_the_layer_checker_finds_an_import_from_below(tmp_path):
    doc = "## The layers\n\n| layer | modules | what |\n| --- | --- | --- |\n"
    doc += (
        "| 1 | `cli.py` | top |\n| 2 | `a/` | middle |\n| 3 | `a/low.py`, `b/`, `__init__.py` | bottom |\n\n## Next\n"
    )
    layers = documented_layers(doc)
    assert layers == {"eagle3cli.cli": 1, "eagle3cli.a": 2, "eagle3cli.a.low": 3, "eagle3cli.b": 3, "eagle3cli": 3}
    graph = {
        "eagle3cli.cli": {"eagle3cli.a.x", "eagle3cli"},
        "eagle3cli.a.x": {"eagle3cli.a.low", "eagle3cli.b.y"},
        "eagle3cli.a.low": {"eagle3cli.b.y"},
        "eagle3cli.b.y": {"eagle3cli.a.x", "eagle3cli.cli"},  # two imports from below
    }
    assert upward_imports(graph, layers) == [
        "eagle3cli.b.y (3) -> eagle3cli.a.x (2)",
        "eagle3cli.b.y (3) -> eagle3cli.cli (1)",
    ]


def test_every_module_of_the_package_has_a_layer():
    layers = documented_layers(_doc())
    graph = import_graph(REPO, ("eagle3cli",))
    assert [m for m in sorted(graph) if layer_of(m, layers) is None] == [], "add them to docs/architecture.md's layers"
    assert [n for n in sorted(layers) if n not in graph] == [], "the layer table names modules that do not exist"


def test_no_import_from_a_lower_layer_to_a_higher_one():
    """Lazy imports inside functions count: a module that needs a higher layer belongs higher."""
    graph = import_graph(REPO, ("eagle3cli",))
    assert "eagle3cli.engines.gguf_export" in graph and "eagle3cli.run_folder.manifest" in graph
    assert upward_imports(graph, documented_layers(_doc())) == []


def test_the_package_root_holds_at_most_12_modules():
    root = sorted(p.name for p in (REPO / "eagle3cli").glob("*.py"))
    assert len(root) <= ROOT_MODULES_AT_MOST, f"{len(root)} modules at the root: group them into rooms: {root}"
