"""Command-line flags made from the stage configs: a config field with a docstring is a flag.

Each field of a frozen stage config gives its flag everything: the name (`--field-name`, or the
names in `flag(...)` for an alias, a short name or a `--x/--no-y` pair), the help (the field's
docstring, read from the source as litgpt does), the default and the type; a `Literal` type is
a closed set of choices that the parser enforces. `--help` shows each flag's default and choices.

A command's function takes `flags: Flags[SomeConfig]` plus any options of its own (actions such as
`cache --verify`). Only flags given on the command line override the recipe, so a recipe's value
is never replaced by a flag's default.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import typer
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from .config import NONE_VALUE, build_config, choices, panel_of

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

C = TypeVar("C", bound="DataclassInstance")
# command name -> (config class, recipe section), filled as the commands register (tests walk it)
STAGE_COMMANDS: dict[str, tuple[type, str]] = {}


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """{field name: its docstring as one line}: the string literal right after each annotated field."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):  # a subclass's docstring wins
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0]
        except (OSError, TypeError):  # no source (a frozen build): flags without help, still flags
            continue
        assert isinstance(body, ast.ClassDef)
        for node, nxt in zip(body.body, body.body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = " ".join(inspect.cleandoc(nxt.value.value).split())
    return docs


def flag_names(f: dataclasses.Field) -> tuple[str, ...]:
    """The option names of a field, e.g. ('--input', '-i') or ('--resume/--no-resume',)."""
    names = f.metadata.get("flags") or ()
    if names:
        return tuple(names)
    dashed = f.name.replace("_", "-")
    return (f"--{dashed}/--no-{dashed}",) if isinstance(f.default, bool) else (f"--{dashed}",)


def command_line(name: str, cfg: Any) -> str:
    """`eagle3 NAME --flag value ...` that rebuilds `cfg`: its fields that differ from their defaults
    (what a model card or a report shows as the command that measured it)."""
    import shlex

    argv = ["eagle3", name]
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if value == f.default or (f.default is dataclasses.MISSING and value is None):
            continue
        names = flag_names(f)[0].split("/")
        if f.metadata.get("argument"):
            argv.append(str(value))
        elif isinstance(value, bool):
            argv.append(names[0] if value else names[-1])
        elif isinstance(value, tuple):
            items = [str(v) for v in value]
            if _tuple_item(typing.get_type_hints(type(cfg))[f.name]) is str:
                argv += [x for v in items for x in (names[0], v)]
            else:
                argv += [names[0], ",".join(items)]
        else:
            argv += [names[0], NONE_VALUE if value is None else str(value)]
    return shlex.join(argv)


def _tuple_item(tp: Any) -> Any:
    """The item type of a `tuple[X, ...]` field (also inside `| None`), else None."""
    for t in (tp, *typing.get_args(tp)):
        if typing.get_origin(t) is tuple:
            return typing.get_args(t)[0]
    return None


def _optional_number(tp: Any) -> bool:
    args = typing.get_args(tp)
    return type(None) in args and any(a in (int, float) for a in args)


def _cli_type(tp: Any) -> Any:
    """The type the parser reads: a repeatable flag for a tuple of strings, one comma-separated
    string for a tuple of numbers ("2,6,9"; build_config splits it), and text for an optional
    number (so that `none` can clear it; build_config converts and checks the number)."""
    item = _tuple_item(tp)
    if item is None and (tp is Path or Path in typing.get_args(tp)):
        # text, made a Path by build_config: the parser's Path("") is ".", so `--run ""` wrote into the
        # current folder; as text the empty value reaches build_config, which refuses it
        return str | None if type(None) in typing.get_args(tp) else str
    if item is None:
        return str | None if _optional_number(tp) else tp
    return list[str] if item is str else str | None


# Placeholders in --help: what kind of value a flag takes (`--target DIR`, `--num-samples N`).
_FOLDER_FIELDS = {"target", "run", "out", "data", "cache", "head", "from_eval", "verify", "compare", "extra_data"}
_OTHER_FIELDS = {"engine_python": "PYTHON"}  # an executable, not a folder


def metavar(name: str, tp: Any) -> str:
    """'DIR', 'FILE', 'N', 'X', 'TEXT', 'N,N,...' or the choices, with '|none' where the value may be cleared."""
    cs = choices(tp)
    item = _tuple_item(tp)
    base = next((a for a in (tp, *typing.get_args(tp)) if a is not type(None) and typing.get_origin(a) is None), str)
    if cs:
        mv = "|".join(cs)
    elif name in _OTHER_FIELDS:
        mv = _OTHER_FIELDS[name]
    elif name in _FOLDER_FIELDS and item is str:  # a repeatable folder flag (--compare)
        mv = "DIR"
    elif item is not None:
        mv = "N,N,..." if item in (int, float) else "TEXT"
    elif name in _FOLDER_FIELDS:
        mv = "DIR"
    elif base is Path:
        mv = "PATH"
    elif base is int:
        mv = "N"
    elif base is float:
        mv = "X"
    else:
        mv = "TEXT"
    # paths are left plain (a folder is rarely cleared; `none` still works): the help stays readable
    optional = type(None) in typing.get_args(tp) and item is None and mv not in ("DIR", "PATH", "PYTHON")
    return f"{mv}|{NONE_VALUE}" if optional else mv


def _cli_default(f: dataclasses.Field, tp: Any) -> Any:
    d, item = f.default, _tuple_item(tp)
    if item is None or not isinstance(d, tuple):
        return d
    return list(d) if item is str else (",".join(map(str, d)) or None)


def config_parameters(cls: type) -> list[inspect.Parameter]:
    """One typer parameter per field of `cls`: name, help, default, choices."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    params = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        required = "[required: here or in the recipe] " if f.metadata.get("required") else ""
        help_text = escape(required + docs.get(f.name, ""))
        panel = panel_of(cls, f.name)
        if f.metadata.get("argument"):
            info = typer.Argument(
                None, metavar=f.metadata["argument"], help=help_text, show_default=False, rich_help_panel=panel
            )
        else:
            default = _cli_default(f, tp)
            info = typer.Option(
                default,
                *flag_names(f),
                help=help_text,
                metavar=None if isinstance(default, bool) else metavar(f.name, tp),
                show_default=default not in (None, [], ""),
                rich_help_panel=panel,
            )
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=_cli_type(tp)))
    # --help lists panels in the order their first flag comes: the config's PANELS order, fields in order within
    order = list(getattr(cls, "PANELS", {}))
    return sorted(params, key=lambda p: order.index(panel_of(cls, p.name)) if panel_of(cls, p.name) in order else -1)


@dataclass(frozen=True)
class Flags(Generic[C]):
    """What one invocation of a stage command was given: the recipe and the flags set on the line."""

    cls: type[C]
    section: str
    recipe: Path | None
    given: dict[str, Any]

    def config(self) -> C:
        """The validated config: dataclass defaults, then the recipe, then the given flags."""
        return build_config(self.cls, self.recipe, self.section, **self.given)


class _NoTypeTags:
    """--help without type tags (`<int>`, `<path>`, `<bool>`): the choices and defaults say more."""

    def get_params(self, ctx: Any) -> list[Any]:
        params: list[Any] = super().get_params(ctx)  # type: ignore[misc]  # a mixin of typer's classes
        for p in params:
            if isinstance(p, typer.core.TyperArgument):
                # its metavar names it; typer has no setting for an argument's type column
                p.display_type_rich = lambda ctx: None  # type: ignore[method-assign]
            elif p.metavar is None:
                p.metavar = ""
        return params


class Command(_NoTypeTags, TyperCommand):
    """Every eagle3 command."""


class Group(_NoTypeTags, TyperGroup):
    """The `eagle3` group itself."""


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the parser took `name` from the command line (not its default)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def examples(*commands: str | tuple[str, ...]) -> str:
    """A command's --help epilog: one example per line, as typed. A tuple is one command over several
    lines joined with shell continuations (` \\`), so a terminal never wraps a command mid-flag
    (typer's rich help keeps an epilog's newlines and wraps only lines wider than the terminal).
    A line starting with `#` is a comment."""
    lines = ["Examples:"]
    for c in commands:
        parts = (c,) if isinstance(c, str) else c
        lines += [
            ("  " if i == 0 else "      ") + p + (" \\" if i < len(parts) - 1 else "") for i, p in enumerate(parts)
        ]
    return "\n".join(lines)


def recipe_help(section: str) -> str:
    return f"YAML recipe: flat, or with a section `{section}:`; flags given here override it."


def stage_command(app: typer.Typer, name: str, cls: type[C], section: str, **command: Any) -> Callable:
    """Register `fn(flags: Flags[cls], **own_options)` as `eagle3 NAME` with one flag per field of
    `cls`, then `--recipe`, then the function's own options."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        own = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for p in inspect.signature(fn, eval_str=True).parameters.values()
            if p.name != "flags"
        ]
        params = config_parameters(cls)
        fields = {p.name for p in params}
        recipe = inspect.Parameter(
            "recipe",
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(None, metavar="FILE", help=escape(recipe_help(section))),
            annotation=Path | None,
        )
        ctx = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)

        def run(ctx: typer.Context, recipe: Path | None = None, **values: Any) -> Any:
            given = {k: v for k, v in values.items() if k in fields and _given(ctx, k)}
            flags = Flags(cls, section, recipe, given)
            return fn(flags, **{p.name: values[p.name] for p in own})

        # typer reads the signature inspect reports, which a function's __signature__ sets
        run.__signature__ = inspect.Signature([ctx, *params, recipe, *own])  # type: ignore[attr-defined]
        run.__doc__, run.__name__ = fn.__doc__, fn.__name__
        STAGE_COMMANDS[name] = (cls, section)
        return app.command(name, cls=Command, **command)(run)

    return decorate
