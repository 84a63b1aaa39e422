"""One source of truth: every stage's flags come from its config, and agree with it.

For every field of every stage config: the flag exists under its name, its help is the field's
docstring, its default is the field's default, its choices are the field's Literal values, a
value given on the command line reaches the config, and the same key in a recipe loads. Every
recipe in recipes/ (and benchmarks/) loads through the command line its header shows.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import typing
from pathlib import Path

import pytest
import typer
import typer.testing
import yaml
from typer.main import get_command

from eagle3cli import options
from eagle3cli.cli import app, main
from eagle3cli.config import choices

REPO = Path(__file__).resolve().parents[2]
COMMANDS = get_command(app).commands
STAGES = sorted(options.STAGE_COMMANDS.items())


def _fields(cls):
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls)]


def _param(cmd: str, name: str):
    return next(p for p in COMMANDS[cmd].params if p.name == name)


def test_every_stage_command_is_built_from_a_config():
    assert set(options.STAGE_COMMANDS) == {"gen-data", "cache", "train", "export", "eval", "serve", "serve-bench"}


@pytest.mark.parametrize("cmd, spec", STAGES, ids=[s[0] for s in STAGES])
def test_flag_help_default_and_choices_come_from_the_field(cmd, spec):
    cls, _section = spec
    docs = options.field_docs(cls)
    for f, tp in _fields(cls):
        assert docs.get(f.name), f"{cls.__name__}.{f.name} has no docstring: it is the --help text"
        p = _param(cmd, f.name)
        required = "[required: here or in the recipe] " if f.metadata.get("required") else ""
        assert p.help == options.escape(required + docs[f.name]), f.name
        if f.metadata.get("argument"):
            continue
        names = {n for spec in options.flag_names(f) for n in spec.split("/")}
        assert names == {*p.opts, *p.secondary_opts}, f.name
        assert p.default == options._cli_default(f, tp), f.name
        if isinstance(f.default, bool):
            assert not p.metavar, f.name
        else:  # the value's kind, the choices first where the type has them
            assert p.metavar == options.metavar(f.name, tp) and p.metavar.startswith("|".join(choices(tp))), f.name


@pytest.mark.parametrize("cmd", [s[0] for s in STAGES])
def test_help_shows_defaults_and_choices_without_type_tags(cmd):
    cls, _section = options.STAGE_COMMANDS[cmd]
    r = typer.testing.CliRunner().invoke(app, [cmd, "--help"], env={"COLUMNS": "200"}, prog_name="eagle3")
    assert r.exit_code == 0
    text = " ".join(r.stdout.split())
    assert not re.search(r"<(int|float|str|path|bool|list\[\w+\])>", text), "type tags in --help"
    for f, tp in _fields(cls):
        if choices(tp):
            assert "|".join(choices(tp)) in text, f.name
        if isinstance(f.default, (int, float, str)) and not isinstance(f.default, bool):
            assert f"[default: {f.default}]" in text, f.name


def _sample(f, tp):
    """argv setting field `f` to a value other than its default, and that value as the config holds it."""
    name = options.flag_names(f)[0].split("/")[0]
    base = typing.get_args(tp)[0] if type(None) in typing.get_args(tp) else tp
    if choices(tp):
        value = next(c for c in reversed(choices(tp)) if c != f.default)
        return [name, value], value
    if base is bool:
        on, _, off = options.flag_names(f)[0].partition("/")
        return ([off] if f.default else [on]), not f.default
    if base is int:
        value = f.default + 2 if isinstance(f.default, int) else 3
        return [name, str(value)], value
    if base is float:
        return [name, "0.25"], 0.25
    if base is Path:
        return [name, "some/dir"], Path("some/dir")
    if options._tuple_item(tp) is str:
        return [name, "a", name, "b"], ("a", "b")
    if options._tuple_item(tp) is int:
        return [name, "2,3"], (2, 3)
    if options._tuple_item(tp) is float:
        return [name, "0.5,1.5"], (0.5, 1.5)
    return [name, "x"], "x"


# what each command needs besides the flag under test for its config to validate
REQUIRED = {
    "gen-data": ["--target", "t", "--input", "gsm8k", "--dry-run"],
    "cache": ["--run", "r"],
    "train": ["--run", "r"],
    "export": ["--head", "h", "--out", "o"],
    "eval": ["--head", "h"],
    "serve": ["--target", "t", "--head", "h"],
    "serve-bench": ["--spec-url", "http://127.0.0.1:1", "--target", "t"],
}
# fields whose plain sample value would not validate: what to give instead, and the value it sets
SAMPLES = {
    ("gen-data", "backend"): (["--backend", "openai", "--endpoint", "http://e:1"], "openai"),
    ("gen-data", "endpoints"): (["--backend", "openai", "--endpoint", "http://a:1"], ("http://a:1",)),
    ("gen-data", "inputs"): (["-i", "mt_bench"], ("gsm8k", "mt_bench")),
    ("gen-data", "answer_temperatures"): (
        ["--answers-per-prompt", "2", "--answer-temperatures", "0.5,1.5"],
        (0.5, 1.5),
    ),
    ("gen-data", "augment_fraction"): (["--augment-fraction", "0.25"], 0.25),
    # K answers differ by their temperatures: --answers-per-prompt needs --answer-temperatures
    ("gen-data", "answers_per_prompt"): (["--answers-per-prompt", "2", "--answer-temperatures", "0.7"], 2),
    ("train", "deepspeed"): (["--deepspeed", "zero2"], "zero2"),
    ("train", "nproc"): (["--deepspeed", "zero2", "--nproc", "2"], 2),
    ("train", "hostfile"): (["--deepspeed", "zero2", "--hostfile", "h"], Path("h")),
    ("train", "master_addr"): (["--deepspeed", "zero2", "--master-addr", "x"], "x"),
    ("train", "master_port"): (["--deepspeed", "zero2", "--master-port", "3"], 3),
    ("train", "save_every"): (["--save-every", "30"], 30),
    ("train", "log_every"): (["--log-every", "20"], 20),
    ("train", "aux_layers"): (["--aux-layers", "2,4"], "2,4"),
    ("train", "target_dtype"): (["--online", "--target-dtype", "bf16"], "bf16"),
    ("train", "extra_data"): (["--online", "--extra-data", "a", "--extra-data", "b"], ("a", "b")),
    ("train", "tensor_parallel_size"): (
        ["--online", "--deepspeed", "zero2", "--nproc", "3", "--tensor-parallel-size", "3"],
        3,
    ),
    ("train", "extra_data_from"): (["--skip-samples", "5", "--extra-data-from", "3"], 3),
    ("cache", "shard"): (["--shard", "1/2"], "1/2"),
    ("cache", "tensor_parallel_size"): (["--engine", "vllm", "--tensor-parallel-size", "3"], 3),
    ("cache", "engine_python"): (["--engine", "vllm", "--engine-python", "py"], "py"),
    ("export", "target"): (["--format", "gguf", "--target", "t"], Path("t")),
    ("gen-data", "shard"): (["--shard", "1/2"], "1/2"),
    ("eval", "endpoint"): (["--endpoint", "http://e:1"], "http://e:1"),
    ("eval", "base_endpoint"): (["--endpoint", "http://e:1", "--base-endpoint", "http://b:1"], "http://b:1"),
    ("eval", "sweep_tree"): (["--sweep-tree", "3,2,4"], ("3,2,4",)),
    ("serve-bench", "spec_url"): (["--spec-url", "http://s:1"], "http://s:1"),
    ("serve-bench", "base_url"): (["--base-url", "http://b:1"], "http://b:1"),
    ("serve", "extra_args"): (["--", "--mem-fraction-static", "0.5"], ("--mem-fraction-static", "0.5")),
}


@pytest.mark.parametrize("cmd, spec", STAGES, ids=[s[0] for s in STAGES])
def test_a_flag_and_its_recipe_key_set_the_field_alike(cmd, spec, parse, tmp_path):
    cls, section = spec
    for f, tp in _fields(cls):
        argv, want = SAMPLES.get((cmd, f.name)) or _sample(f, tp)
        by_flag = parse([cmd, *REQUIRED[cmd], *argv])
        assert getattr(by_flag, f.name) == want != f.default, (f.name, argv)
        # the same config as a recipe, every field a key, and no flags
        keys = {k: _yaml_value(v) for k, v in dataclasses.asdict(by_flag).items() if v is not None}
        recipe = tmp_path / f"{cmd}-{f.name}.yaml"
        recipe.write_text(yaml.safe_dump({section: keys}))
        assert parse([cmd, "--recipe", str(recipe)]) == by_flag, f.name


def _yaml_value(v):
    return list(v) if isinstance(v, tuple) else str(v) if isinstance(v, Path) else v


def test_flags_given_override_the_recipe_and_defaults_do_not(parse, tmp_path):
    recipe = tmp_path / "eval.yaml"
    recipe.write_text("eval:\n  depth: 5\n  mode: tree\n  generate_baseline: false\n")
    cfg = parse(["eval", "--head", "h", "--recipe", str(recipe)])
    assert (cfg.depth, cfg.mode, cfg.generate_baseline) == (5, "tree", False)
    cfg = parse(["eval", "--head", "h", "--recipe", str(recipe), "--depth", "8", "--generate-baseline"])
    assert (cfg.depth, cfg.mode, cfg.generate_baseline) == (8, "tree", True)


@pytest.mark.parametrize("cmd, spec", STAGES, ids=[s[0] for s in STAGES])
def test_an_unknown_recipe_key_or_a_bad_choice_exits_2(cmd, spec, parse, tmp_path, capsys):
    cls, section = spec
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"{section}:\n  no_such_key: 1\n")
    assert main([cmd, *REQUIRED[cmd], "--recipe", str(recipe)]) == 2
    assert "unknown key(s)" in " ".join(capsys.readouterr().err.split())
    for f, tp in _fields(cls):
        if choices(tp):
            recipe.write_text(f"{section}:\n  {f.name}: nonsense\n")
            assert main([cmd, *REQUIRED[cmd], "--recipe", str(recipe)]) == 2
            assert f"expected one of {', '.join(choices(tp))}" in " ".join(capsys.readouterr().err.split())
            name = options.flag_names(f)[0]
            assert main([cmd, *REQUIRED[cmd], name, "nonsense"]) == 2
            assert "is not one of" in capsys.readouterr().err


def _header_commands(path: Path) -> list[list[str]]:
    """The `eagle3 CMD ... --recipe THIS` command lines in a recipe's header comment."""
    text = "\n".join(line.lstrip("#").strip() for line in path.read_text().splitlines() if line.startswith("#"))
    text = text.replace("\\\n", " ")
    rel = str(path.relative_to(REPO))
    return [shlex.split(m)[1:] for m in re.findall(r"eagle3 [a-z-]+ [^\n]*", text) if f"--recipe {rel}" in m]


# the recipes, and the benchmarks' own (benchmarks/tiny/train.yaml)
RECIPES = sorted(p for d in ("recipes", "benchmarks") for p in (REPO / d).rglob("*.yaml") if _header_commands(p))


def test_every_eagle3_recipe_is_checked():
    named = {p.name for p in RECIPES}
    assert len(RECIPES) >= 11 and {"gen-data.yaml", "cache.yaml", "train.yaml", "eval.yaml"} <= named


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_recipe_loads_through_the_command_in_its_header(path, parse, monkeypatch):
    monkeypatch.chdir(REPO)
    for argv in _header_commands(path):
        cfg = parse(argv)
        cls, _section = options.STAGE_COMMANDS[argv[0]]
        assert isinstance(cfg, cls)


def _numeric(tp) -> bool:
    args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
    if typing.get_origin(tp) is tuple:
        args = [typing.get_args(tp)[0]]
    return any(a in (int, float) for a in args)


@pytest.mark.parametrize("cmd, spec", STAGES, ids=[s[0] for s in STAGES])
def test_every_numeric_option_has_a_bound_that_flags_and_recipes_share(cmd, spec, tmp_path):
    """config.BOUNDS holds a row for every int/float field of every config (and none for a field that is
    gone); each default lies inside its row; one past the top is refused, as a flag and as a recipe key,
    naming the flag."""
    from eagle3cli.config import BOUNDS, build_config
    from eagle3cli.errors import UsageError

    cls, section = spec
    fields = _fields(cls)
    numeric = {f.name for f, tp in fields if _numeric(tp)}
    rows = BOUNDS.get(section, {})
    assert sorted(numeric - set(rows)) == [], f"{cmd}: numeric options without a row in config.BOUNDS"
    assert sorted(set(rows) - numeric) == [], f"{cmd}: rows of config.BOUNDS naming no option"
    for f, tp in fields:
        if f.name not in rows:
            continue
        lo, hi = rows[f.name]
        default = f.default if f.default is not dataclasses.MISSING else None
        for v in default if isinstance(default, tuple) else (default,):
            assert v is None or lo <= v <= hi, (cmd, f.name, v)
        big = hi + 1 if isinstance(hi, int) else hi * 2
        value = (
            (big,) if typing.get_origin(tp) is tuple or tuple in map(typing.get_origin, typing.get_args(tp)) else big
        )
        flag = "--" + f.name.replace("_", "-")
        with pytest.raises(UsageError) as e:
            build_config(cls, None, section, **{f.name: value})
        assert flag in str(e.value), (cmd, f.name, str(e.value)[:400])
        recipe = tmp_path / f"{f.name}.yaml"
        recipe.write_text(yaml.safe_dump({f.name: list(value) if isinstance(value, tuple) else value}))
        with pytest.raises(UsageError) as e:
            build_config(cls, recipe, section)
        assert flag in str(e.value), (cmd, f.name, str(e.value)[:400])
