"""Typed, frozen stage configs and YAML recipes that load into them.

A recipe is a YAML file; either flat (keys of one stage's config) or with one section per
stage (`gen_data:`, `cache:`, `train:`, `eval:`, `serve:`). Unknown keys fail loudly. Flags
given on the command line override the recipe; unset flags (None) keep the recipe's or the
dataclass default.
"""

from __future__ import annotations

import dataclasses
import math
import os
import reprlib
import types
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import yaml

from .errors import UsageError
from .files import read_file_bytes
from .urls import redact

# CPU matmul kernels of the inference stages (eval, gen-data's hf backend, cache): see
# eagle3cli/model/cpu_kernels.py for why oneDNN-packed weights are preferred, and when this CPU
# cannot run them (auto then takes torch's F.linear).
CpuKernels = Literal["auto", "onednn", "torch"]

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

C = TypeVar("C", bound="DataclassInstance")  # a stage config: a (frozen) dataclass
STAGE_SECTIONS = ("gen_data", "cache", "train", "eval", "serve", "serve_bench", "export")


def flag(default: Any, *names: str, argument: str | None = None, required: bool = False) -> Any:
    """A config field whose flag is not plainly `--field-name`: other `names` (an alias, a short
    name, a lone `--dry-run` or a `--x/--no-y` pair), a positional `argument` (its metavar), or one
    the stage cannot run without (`required`: given as a flag or in the recipe; --help marks it).
    eagle3cli/options.py turns fields into flags."""
    return dataclasses.field(default=default, metadata={"flags": names, "argument": argument, "required": required})


# A config's help panels: {title: field names}, as the class attribute `PANELS` (a ClassVar, not a
# field). `--help` shows each panel's flags under its title (options.py), in field order; a field in
# no panel is listed under "Options". One block per config keeps each field's line as it is.
Panels = dict[str, tuple[str, ...]]


def panel_of(cls: type, name: str) -> str | None:
    """The help panel that `cls.PANELS` puts field `name` in (None: the default one)."""
    panels: Panels = getattr(cls, "PANELS", {})
    return next((title for title, names in panels.items() if name in names), None)


# The value that clears an optional setting from the command line (`--max-steps none` undoes a
# recipe's `max_steps: 60`): a flag left out never overrides the recipe, so it needs a spelling.
NONE_VALUE = "none"


def _is_optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def choices(tp: Any) -> tuple[str, ...]:
    """The values of a `Literal[...]` type (also inside `X | None`); () for an open type."""
    if typing.get_origin(tp) is typing.Literal:
        return tuple(typing.get_args(tp))
    return next((c for c in map(choices, typing.get_args(tp)) if c), ())


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping: YAML keeps the last silently, so
    `lr: 1e-4` ... `lr: 3e-4` would run with a value the reader of the file may not see."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                dup = key in seen
            except TypeError:  # an unhashable key: the base class reports it
                break
            if dup:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} is given twice (line {seen[key] + 1} and line {key_node.start_mark.line + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: Path, what: str, next_step: str) -> Any:
    """Every YAML file eagle3 reads (recipes, `serve -- --config FILE`, `--augment`), with one set of
    bounds: a regular file or a pipe (`<(cat f)`; a FIFO nobody writes to reads as empty, never a
    hang), never a device; at most MAX_RECIPE_BYTES; UTF-8; no key given twice; aliases expanding to at
    most MAX_RECIPE_VALUES values (a 1 KB alias bomb nests into billions). UsageError otherwise."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{what} {path} does not exist", "a YAML file", next_step)
    raw = read_file_bytes(path, what, MAX_RECIPE_BYTES, next_step, pipes=True)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UsageError(
            f"{what} {path} is not UTF-8 text (byte {e.start} is 0x{e.object[e.start]:02x}): a binary file?",
            "a YAML file in UTF-8",
            next_step,
        ) from e
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except (yaml.YAMLError, RecursionError) as e:
        why = "nests deeper than Python can read" if isinstance(e, RecursionError) else f"is not valid YAML: {e}"
        raise UsageError(f"{what} {path} {why}", "a YAML mapping", next_step) from None
    if expanded_size(data) > MAX_RECIPE_VALUES:  # YAML aliases (&a / *a) can nest a 1 KB file into billions
        raise UsageError(
            f"{what} {path} expands to more than {MAX_RECIPE_VALUES} values through YAML aliases (&name / *name)",
            "plain settings (aliases that repeat a few values are fine)",
            "write the values out instead of nesting aliases",
        )
    return data


def load_recipe(path: Path | None, section: str) -> dict:
    """The keys for one stage from a recipe file (flat, or the stage's own section)."""
    if path is None:
        return {}
    path = Path(path)
    nxt = "check the --recipe path (e.g. recipes/tiny/gen-data.yaml)"
    if path.is_dir():
        raise UsageError(
            f"recipe {path} is a folder", "a YAML file, e.g. recipes/tiny/gen-data.yaml", f"ls {path}   (pick a file)"
        )
    if not path.exists():
        raise UsageError(f"recipe {path} does not exist", "a YAML file, e.g. recipes/tiny/gen-data.yaml", "ls recipes/")
    data = load_yaml(path, "recipe", nxt) or {}
    if not isinstance(data, dict):
        raise UsageError(f"recipe {path} must be a YAML mapping, got {type(data).__name__}")
    if is_sectioned(data, path):
        if section not in data:
            have = ", ".join(f"{k}:" for k in data)
            raise UsageError(
                f"recipe {path} has no `{section}:` section (it has {have})",
                f"a recipe for this stage: a `{section}:` section, or flat keys",
                f"use the recipe written for this stage, e.g. recipes/tiny/{section.replace('_', '-')}.yaml",
            )
        data = data.get(section) or {}
    return {k.replace("-", "_"): v for k, v in data.items()}


MAX_RECIPE_BYTES = 1 << 20
MAX_RECIPE_VALUES = 100_000


def expanded_size(obj: Any, limit: int = MAX_RECIPE_VALUES) -> int:
    """How many values `obj` holds once aliases are expanded, counted without expanding them (each
    shared list or mapping is sized once); stops counting past `limit`."""
    memo: dict[int, int] = {}

    def size(o: Any) -> int:
        if not isinstance(o, (list, dict)):
            return 1
        if id(o) in memo:
            return memo[id(o)]
        memo[id(o)] = limit + 1  # a cycle (an alias inside itself) counts as too big
        items = list(o.keys()) + list(o.values()) if isinstance(o, dict) else o
        total = 1
        for v in items:
            total += size(v)
            if total > limit:
                break
        memo[id(o)] = total
        return total

    try:
        return size(obj)
    except RecursionError:
        return limit + 1


def is_sectioned(data: dict, path: Path | str = "recipe") -> bool:
    """A recipe is sectioned when every top-level key is a stage section holding a mapping.

    Section names are also config keys (`cache:` is the cache folder of a flat train recipe), so
    a key's name alone cannot decide: `cache: runs/x/cache` next to `lr: 3e-4` is a flat recipe.
    """
    sections = {k for k, v in data.items() if k in STAGE_SECTIONS and (v is None or isinstance(v, dict))}
    if not sections:
        return False
    flat = sorted(set(data) - sections)
    if flat:
        raise UsageError(
            f"recipe {path} mixes stage sections ({', '.join(sorted(sections))}) with flat keys ({', '.join(flat)})",
            "either only stage sections (gen_data:, cache:, train:, ...) each holding its keys, or only flat keys",
            "move the flat keys into their stage's section",
        )
    return True


def _coerce(value: Any, tp: Any) -> Any:
    """Turn YAML/CLI values into the field's type (paths, tuples of ints, optionals)."""
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _coerce(value, args[0]) if len(args) == 1 else value
    if tp is Path:
        # `~` expanded for every path (--out, --run, --cache...), not only where the shell did it
        return Path(value).expanduser() if isinstance(value, (str, os.PathLike)) else value  # else: a type error below
    if origin is tuple:
        (inner, *_rest) = typing.get_args(tp)
        if isinstance(value, str):
            # "2,4,5" is three layer ids; but a string of a string list is one item (a path may hold spaces)
            value = [v for v in value.replace(",", " ").split() if v] if inner is not str else [value]
        return tuple(_coerce(v, inner) for v in value)
    if tp in (int, float) and isinstance(value, str):
        try:
            return tp(value)
        except ValueError:
            return value  # left for validate() to report with the flag name
    return value


# ---------------------------------------------------------------- the bounds of every numeric option
# One table for every stage's numeric options, read by `build_config`, through which both the flags and
# the recipes reach a config: a value outside its range is exit 2 naming the flag and the range, before
# anything runs (`--synth-turns 10**9` was a MemoryError; `eval --threads 100000` one at import). A
# stage's validate() may hold a narrower rule (a combination); this table is the outer bound, and
# tests/unit/test_options.py holds every numeric field of every config to having a row here.
_MANY = 10**12  # counts of samples, steps, tokens over a run
_SEED = 2**63 - 1
_TOKENS = 1 << 20  # tokens of one sample, prompt or answer
_WEEK = 7 * 24 * 3600.0
_PORT = (0, 65535)
_P = (0.0, 1.0)  # a probability, a share
_TEMP = (0.0, 100.0)
BOUNDS: dict[str, dict[str, tuple[float, float]]] = {
    "cache": {
        "max_length": (1, _TOKENS),
        "draft_vocab_size": (1, 1 << 22),
        "topk": (1, 1024),
        "token_budget": (1, 1 << 30),
        "shard_tokens": (1, 1 << 34),
        "max_samples": (0, _MANY),
        "tensor_parallel_size": (1, 1024),
    },
    "eval": {
        "depth": (1, 1024),
        "num_prompts": (1, _TOKENS),
        "max_prompt_tokens": (1, _TOKENS),
        "max_new_tokens": (1, _TOKENS),
        "temperature": _TEMP,
        "top_p": _P,
        "topk": (1, 1024),
        "num_draft_tokens": (1, 1 << 16),
        "seed": (0, _SEED),
        "threads": (1, 1024),
        "sweep_prompts": (1, _TOKENS),
        "sweep_max_new_tokens": (1, _TOKENS),
        "sweep_repeats": (1, 1000),
        "tie_tolerance": _P,
        "sampling_check": (0, _TOKENS),
    },
    "export": {"num_speculative_tokens": (1, 1024)},
    "gen_data": {
        "concurrency": (1, 65536),
        "timeout_s": (0.0, _WEEK),
        "retries": (0, 100),
        "backoff_s": (0.0, 3600.0),
        "num_samples": (0, _MANY),
        "max_new_tokens": (1, _TOKENS),
        "temperature": _TEMP,
        "top_p": _P,
        "seed": (0, _SEED),
        "batch_size": (1, 1 << 16),
        "shard_size": (1, 1 << 24),
        "max_prompt_tokens": (1, _TOKENS),
        "max_turns": (0, 10_000),
        "synthetic": (0, 1 << 32),
        "synth_turns": (1, 64),
        "synth_temperature": _TEMP,
        "synth_top_p": _P,
        "synth_max_tokens": (1, _TOKENS),
        "synth_min_words": (0, _TOKENS),
        "near_dup_threshold": _P,
        "answers_per_prompt": (1, 64),
        "answer_temperatures": _TEMP,
        "augment_fraction": _P,
    },
    "serve": {
        "port": _PORT,
        "steps": (1, 1024),
        "topk": (1, 1024),
        "draft_tokens": (1, 1 << 16),
        "health_timeout": (0.0, _WEEK),
    },
    "serve_bench": {
        "concurrency": (1, 65536),
        "requests": (1, 1 << 24),
        "max_tokens": (1, _TOKENS),
        "timeout": (0.0, _WEEK),
    },
    "train": {
        "tensor_parallel_size": (1, 1024),
        "extra_data_from": (0, _MANY),
        "ttt_steps": (1, 64),
        "step_weight": (0.0, 10.0),
        "feature_noise": (0.0, 10.0),
        "draft_vocab_size": (1, 1 << 22),
        "max_length": (1, _TOKENS),
        "train_samples": (0, _MANY),
        "skip_samples": (0, _MANY),
        "epochs": (1, 1 << 20),
        "time_budget_s": (0.0, 1e9),
        "max_steps": (0, _MANY),
        "lr": (0.0, 10.0),
        "min_lr_ratio": _P,
        "warmup_ratio": _P,
        "weight_decay": (0.0, 10.0),
        "grad_clip": (0.0, 1e6),
        "grad_accum": (1, 1 << 16),
        "token_budget": (1, 1 << 30),
        "max_attention": (1, 1 << 40),
        "max_batch_size": (1, _TOKENS),
        "seed": (0, _SEED),
        "log_every": (1, _MANY),
        "save_every": (1, _MANY),
        "keep_checkpoints": (0, _TOKENS),
        "prefetch": (0, 1024),
        "heldout_samples": (0, 1 << 24),
        "heldout_every": (0, _MANY),
        "heldout_depth": (1, 1024),
        "nproc": (1, 4096),
        "master_port": _PORT,
    },
}


def _num(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def bound_errors(cfg: Any, section: str) -> list[str]:
    """One line per numeric option outside its row of BOUNDS (each item of a list option)."""
    errors = []
    for name, (lo, hi) in BOUNDS.get(section, {}).items():
        value = getattr(cfg, name, None)
        items = value if isinstance(value, tuple) else (value,)
        bad = [v for v in items if isinstance(v, (int, float)) and not isinstance(v, bool) and not lo <= v <= hi]
        if bad:
            errors.append(f"--{name.replace('_', '-')} {_short_repr(bad[0])}: must be from {_num(lo)} to {_num(hi)}")
    return errors


def build_config(cls: type[C], recipe: Path | None, section: str, **overrides: Any) -> C:
    """Recipe keys, then non-None flag overrides, into a frozen dataclass; validates all at once."""
    data = load_recipe(recipe, section)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise UsageError(
            f"recipe {recipe}: unknown key(s) for {section}: {', '.join(unknown)}",
            f"keys among: {', '.join(sorted(fields))}",
            "fix the recipe (typos are not ignored)",
        )
    hints = typing.get_type_hints(cls)
    for k, v in overrides.items():
        if isinstance(v, (str, Path)) and str(v).lower() == NONE_VALUE and k in hints and _is_optional(hints[k]):
            data[k] = None  # spelled out on the command line: clears the recipe's value
        elif v is not None:
            data[k] = v
    empty = [
        k for k, v in data.items() if k in fields and isinstance(v, str) and not v.strip() and _names_path(hints[k])
    ]
    if empty:  # Path("") is the current folder: `--run ""` wrote a run into wherever the shell stood
        raise UsageError(
            f"{', '.join('--' + k.replace('_', '-') for k in empty)} is empty",
            "a folder or file path (write `.` for the current folder)",
            "give the path, e.g. --run runs/NAME",
        )
    kwargs = {k: _coerce(v, hints[k]) for k, v in data.items() if k in fields}
    cfg = cls(**kwargs)
    errors = type_errors(cfg)
    try:  # validate() may assume the declared types; what it trips over is already reported above
        more = cfg.validate() if hasattr(cfg, "validate") else []
    except (TypeError, ValueError, AttributeError):
        more = []
    flags = {e.split(" ", 1)[0] for e in errors}
    errors += [e for e in more if e.split(" ", 1)[0] not in flags]
    flags |= {e.split(" ", 1)[0] for e in more}  # the stage's own words for a flag win over the table's
    errors += [e for e in bound_errors(cfg, section) if e.split(" ", 1)[0] not in flags]
    if errors:
        raise UsageError("invalid configuration:\n" + "\n".join(f"  {e}" for e in errors))
    return cfg


def _names_path(tp: Any) -> bool:
    return tp is Path or Path in typing.get_args(tp)


def _type_ok(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return value in typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:  # finite: a NaN compares False with every bound, so range checks would pass it
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if tp is str:
        return isinstance(value, (str, os.PathLike))
    if tp is Path:
        return isinstance(value, Path)
    if origin is tuple:
        inner = typing.get_args(tp)[0]
        return isinstance(value, tuple) and all(_type_ok(v, inner) for v in value)
    return True


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is typing.Literal:
        return "one of " + ", ".join(map(str, typing.get_args(tp)))
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if args and typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if typing.get_origin(tp) is tuple:
        inner = typing.get_args(tp)[0]
        return "a list of " + {int: "integers", float: "numbers", str: "strings"}.get(inner, str(inner))
    return {int: "an integer", float: "a finite number", bool: "true or false", str: "a string", Path: "a path"}.get(
        tp, str(tp)
    )


def _short_repr(value: Any, width: int = 80) -> str:
    """repr of a value, cut: a recipe value may be huge (never render it whole)."""
    if isinstance(value, (list, tuple, dict)) and len(value) > 8:
        return f"<a {type(value).__name__} of {len(value)} items>"
    try:
        text = reprlib.repr(value)
    except RecursionError:
        text = f"<a nested {type(value).__name__}>"
    return text if len(text) <= width else text[: width - 3] + "..."


def type_errors(cfg: Any) -> list[str]:
    """One line per field whose value is not of its declared type (recipes are untyped YAML)."""
    hints = typing.get_type_hints(type(cfg))
    return [
        f"--{f.name.replace('_', '-')} {_short_repr(getattr(cfg, f.name))}: expected {_type_name(hints[f.name])}"
        for f in dataclasses.fields(cfg)
        if not _type_ok(getattr(cfg, f.name), hints[f.name])
    ]


def config_dict(cfg: Any) -> dict:
    """JSON-friendly dict of a config (for manifests), with credentials in URLs masked."""
    return {k: redact(str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(cfg).items()}


def parse_shard(spec: str | None) -> tuple[int, int]:
    """'i/N' -> (i, N); None -> (0, 1), the whole cache in one process."""
    if spec is None:
        return 0, 1
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise ValueError("expected i/N, e.g. 0/4") from None
    if not (n >= 1 and 0 <= i < n):
        raise ValueError("expected 0 <= i < N")
    return i, n
