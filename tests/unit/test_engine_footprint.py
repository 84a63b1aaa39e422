"""A new serving engine's footprint, measured: a stand-in engine defined as docs/architecture.md says
(one `Engine` module, its word in the registry and its head-table column) is served by `eagle3 serve
--dry-run` through the same path as the real ones, and the product files it had to touch are counted
(goal: 1 module + 1 table column)."""

from __future__ import annotations

import json
import sys
import types
import typing
from dataclasses import replace
from pathlib import Path

import pytest
from cli_helpers import wide_console  # noqa: F401
from serve_helpers import export_head, printed_command

import eagle3cli.engines.serving as serving
import eagle3cli.head.check as check_module
import eagle3cli.head.table as table
import eagle3cli.serve.engine_args as engine_args
from eagle3cli.config import choices
from eagle3cli.engines.serving import Engine, SpecNumbers, own
from eagle3cli.errors import UsageError
from eagle3cli.serve.commands import build_command, ready_request, resolve_spec
from eagle3cli.serve.config import ServeConfig
from eagle3cli.serve.engine_args import check_engine_args
from eagle3cli.serve.run import run_serve

PRODUCT = Path(__file__).resolve().parents[2] / "eagle3cli"


def standin_command(target, head, spec: SpecNumbers, python=None) -> list[str]:
    return ["standin-server", "--model", str(target), "--draft", str(head), "--k", str(spec.steps)]


# what the stand-in's module (engines/standin.py) would hold
STANDIN = Engine(
    "standin",
    {"model": own("--target", "the target"), "draft": own("--head", "the draft head")},
    {"quant": "the target's weights are quantized"},
    {"-m": "model"},
    defaults=SpecNumbers(2, 1, 3, "the stand-in's default"),
    command=standin_command,
    ready=lambda base, target: [f"# curl {base}/standin"],
)


@pytest.fixture
def standin(monkeypatch) -> set[str]:
    """Register the stand-in the documented way; returns the product files touched (besides its module)."""
    touched = set()

    def patch(module, name, value):
        monkeypatch.setattr(module, name, value)
        touched.add(str(Path(module.__file__).relative_to(PRODUCT)))

    module = types.ModuleType("eagle3cli.engines.standin")  # engines/standin.py, defining its ENGINE
    module.ENGINE = STANDIN  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    patch(serving, "ENGINE_MODULES", (*serving.ENGINE_MODULES, "standin"))  # its word in the registry
    patch(table, "ENGINES", (*table.ENGINES, "standin"))  # the head table's column
    patch(table, "ENGINE_NAMES", {**table.ENGINE_NAMES, "standin": "Stand-in"})
    monkeypatch.setattr(check_module, "ENGINES", table.ENGINES)  # the check reads the table's column
    engine_args.engine_table.cache_clear()
    yield touched
    engine_args.engine_table.cache_clear()


def test_a_standin_engine_is_served_through_the_common_path(standin, tiny_target_dir, tmp_path, capsys):
    head = export_head(tmp_path / "head", tiny_target_dir)
    assert resolve_spec(None, None, None, None, "standin") == STANDIN.defaults
    assert build_command("standin", "T", "H", STANDIN.defaults, "h", 1)[:2] == ["standin-server", "--model"]
    assert "# curl http://h:1/standin" in ready_request("standin", "h", 1, "T")
    refused = check_engine_args("standin", ["-m", "other", "--quant", "x"])
    assert [p.is_error for p in refused] == [True, False] and "--target" in refused[0].fix
    cfg = ServeConfig(target=str(tiny_target_dir), head=head, engine="standin", dry_run=True)  # type: ignore[arg-type]
    assert run_serve(cfg) == 0
    argv = printed_command(capsys.readouterr().out)
    assert argv[:3] == ["standin-server", "--model", str(tiny_target_dir)] and "--k" in argv
    # a head the one check refuses is refused for the stand-in too (the rules on the target are shared)
    bad = json.loads((head / "config.json").read_text())
    (head / "config.json").write_text(json.dumps({**bad, "max_position_embeddings": 8}))
    with pytest.raises(UsageError, match="max_position_embeddings"):
        run_serve(replace(cfg))


def test_the_standin_engines_footprint_is_its_module_and_two_product_files(standin):
    """What the fixture had to change for the test above to serve the stand-in: nothing else in the
    package names engines one by one on the launch path (a fourth place would fail that test)."""
    footprint = {"engines/standin.py", *standin}
    assert footprint == {
        "engines/standin.py",  # the module: Engine(...)
        "engines/serving.py",  # its word in the registry (ENGINE_MODULES)
        "head/table.py",  # the head table's column (ENGINES, ENGINE_NAMES)
    }, footprint


def test_the_engine_choice_is_the_registrys():
    """`--engine`'s choices are read from the registry when serve's config is defined, not spelled out."""
    assert choices(typing.get_type_hints(ServeConfig)["engine"]) == tuple(serving.engines())
    assert tuple(serving.engines()) == ("sglang", "vllm", "llama.cpp")
