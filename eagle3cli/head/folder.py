"""A head folder, parsed and not yet judged: config.json, its layout, the safetensors header (no
weights), and each config field read where its engine reads it (`table.py` says where).

Aux layer ids: each config field that names layers is read in its own engine's convention and
turned into eagle3's (`hidden_states[k]`, the input of decoder layer k):

  field                                            convention                 eagle3 ids
  eagle3.aux_layer_ids                             hidden_states[k]           k, as listed
  eagle_config.eagle_aux_hidden_state_layer_ids    SGLang: output of layer k  k + 1, sorted
  eagle_aux_hidden_state_layer_ids (top level)     vLLM/speculators           k, sorted

An engine field is read sorted because the engines capture in layer order whatever the list says
(`speculate.aux_layers`); eagle3's own field is kept as listed, and `check.py` refuses one that is
not ascending. Fields that disagree are refused with every reading shown (`resolve_aux_ids`). A head
that names no layers gets what both engines capture then, [2, L//2, L-3] sorted, with a notice.

EAGLE-3.1's two norms (`head_norms`) are read where vLLM reads them: `norm_before_residual` at the
top level (in a speculators config a missing one means true, vLLM's and the speculators library's
default), `norm_before_fc` in `eagle_config` first, then at the top level; its weight is
`input_norm.weight`. `fc_norm` (one norm per aux feature, another variant) is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from ..errors import UsageError
from ..readers.limits import check_regular_file
from ..run_folder.manifest import check_schema, for_run, read_json_object
from ..speculate.aux_layers import aux_layer_problems, default_aux_layer_ids, from_sglang_ids, int_list
from .table import HEAD_KEYS, HEAD_WEIGHTS, SPECULATORS_ARCH, canonical_name, field, get_path

NEXT = "eagle3 export --head HEAD --format sglang --out DIR   (or re-export: eagle3 train --run runs/NAME)"


# ---------------------------------------------------------------- safetensors header
@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype string: F32, BF16, I64, BOOL...


def read_tensor_index(path: Path) -> dict[str, TensorInfo]:
    """Names, shapes and dtypes from the safetensors header; no tensor is loaded."""
    from safetensors import safe_open

    out = {}
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():
            s = f.get_slice(name)
            out[name] = TensorInfo(tuple(int(d) for d in s.get_shape()), str(s.get_dtype()))
    return out


# ---------------------------------------------------------------- the folder
HEAD_FOLDER = "a head folder with config.json + model.safetensors (eagle3, SGLang, vLLM or speculators layout)"


def read_config(
    folder: Path, role: str, next_step: str, expected: str = "a local model folder with config.json"
) -> dict:
    """config.json of a model or head folder (`role`: target, head), or a UsageError saying which folder was meant."""
    path = Path(folder) / "config.json"
    next_step = for_run(next_step, folder)
    if not Path(folder).is_dir():
        raise UsageError(f"{role} folder {folder} does not exist", expected, next_step)
    if not path.exists():
        if (Path(folder) / role / "config.json").exists():  # given runs/NAME instead of runs/NAME/head
            next_step = f"--{role} {Path(folder) / role}"
        raise UsageError(f"{path} does not exist", expected, next_step)
    check_regular_file(path, f"the {role}'s config.json", next_step)  # a FIFO blocks any open of it forever
    return read_json_object(path, f"the {role}'s config.json", NEXT if role == "head" else next_step)


def read_head_config(head_dir: Path) -> dict:
    cfg = read_config(head_dir, "head", "eagle3 train --run runs/NAME   (exports runs/NAME/head)", HEAD_FOLDER)
    return check_schema(cfg, HeadConfigShape, Path(head_dir) / "config.json", "a head config.json", NEXT)


def head_file(head_dir: Path, name: str) -> Path:
    """`head_dir/name`, or the error saying what a head folder holds and how one is made."""
    path = Path(head_dir) / name
    if not path.exists():
        next_step = for_run("eagle3 train --run runs/NAME   (exports runs/NAME/head)", head_dir)
        if (Path(head_dir) / "head" / name).exists():  # given runs/NAME instead of runs/NAME/head
            next_step = f"--head {Path(head_dir) / 'head'}"
        raise UsageError(f"{path} does not exist", HEAD_FOLDER, next_step)
    check_regular_file(path, f"the head's {name}", NEXT)  # a FIFO blocks any open of it forever
    return path


class _Eagle3Block(TypedDict, total=False):
    target: dict[str, Any]


class _SpeculatorsBlock(TypedDict, total=False):
    verifier: dict[str, Any]


class HeadConfigShape(TypedDict, total=False):
    """The blocks of a head config that every reader walks into (`cfg["eagle3"].get(...)`): each an
    object where present. A hand-edited `"eagle3": "not an object"` was an AttributeError in the head
    check that serve, eval and export share; the fields' values are check.py's to judge."""

    eagle3: _Eagle3Block
    eagle_config: dict[str, Any]
    transformer_layer_config: dict[str, Any]
    speculators_config: _SpeculatorsBlock


def detect_layout(cfg: dict) -> str:
    if cfg.get("speculators_model_type") == "eagle3" or SPECULATORS_ARCH in (cfg.get("architectures") or []):
        return "speculators"
    if (cfg.get("eagle3") or {}).get("aux_layer_ids"):
        return "eagle3"
    if cfg.get("eagle_aux_hidden_state_layer_ids") and not (cfg.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids"
    ):
        return "vllm"
    return "sglang"


@dataclass(frozen=True)
class HeadFolder:
    """config.json and the safetensors header of a head folder, in any layout."""

    path: Path
    cfg: dict
    layout: str
    llama: dict  # the draft layer's Llama fields (speculators: transformer_layer_config)
    target: dict  # what the head records of its target (eagle3.target, or the speculators verifier)
    index: dict[str, TensorInfo] | None  # None: model.safetensors could not be read (`unreadable` says why)
    unreadable: str | None
    names: dict[str, str]  # eagle3 name -> name in model.safetensors

    @property
    def where(self) -> str:
        return f"head {self.path}"

    @property
    def target_architectures(self) -> list | None:
        """The target's classes as the head records them (eagle3's export, a speculators verifier)."""
        archs = (self.cfg.get("eagle3") or {}).get("target_architectures")
        archs = archs or ((self.cfg.get("speculators_config") or {}).get("verifier") or {}).get("architectures")
        return archs if isinstance(archs, list) else None

    @property
    def target_ref(self) -> str | None:
        """The target the head names: eagle3's own record first, then a speculators verifier."""
        return self.target.get("path") or self.target.get("name_or_path")

    def shape(self, name: str) -> tuple[int, ...] | None:
        return self.index[self.names[name]].shape if self.index is not None and name in self.names else None

    @property
    def target_hidden(self) -> int | None:
        v = self.cfg.get("target_hidden_size") or self.llama.get("target_hidden_size") or self.llama.get("hidden_size")
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def read_folder(head_dir: Path) -> HeadFolder:
    """The folder's config.json (UsageError when missing or not JSON) and safetensors header (an
    unreadable file is recorded, for the checks to report beside the rest)."""
    head_dir = Path(head_dir)
    cfg = read_head_config(head_dir)
    layout = detect_layout(cfg)
    if layout == "speculators":
        layer = cfg.get("transformer_layer_config")
        llama = dict(layer) if isinstance(layer, dict) else {}
    else:
        llama = {k: v for k, v in cfg.items() if k not in HEAD_KEYS}
    target = _recorded(cfg, layout)
    w_path = head_dir / HEAD_WEIGHTS
    index, unreadable = None, None
    if not w_path.exists():
        unreadable = f"{w_path} does not exist"
    else:
        head_file(head_dir, HEAD_WEIGHTS)  # a FIFO or device: refused before safetensors opens it
        try:
            index = read_tensor_index(w_path)
        except Exception as e:  # noqa: BLE001 — a truncated or foreign file: say so, do not crash
            unreadable = f"{w_path} is not a readable safetensors file ({type(e).__name__}: {str(e)[:200]})"
    names: dict[str, str] = {}
    for name in index or {}:
        names.setdefault(canonical_name(name), name)
    return HeadFolder(head_dir, cfg, layout, llama, target, index, unreadable, names)


def _recorded(cfg: dict, layout: str) -> dict:
    """What the head records of its target: eagle3.target, and a speculators verifier's name_or_path."""
    target = dict((cfg.get("eagle3") or {}).get("target") or {})
    verifier = (cfg.get("speculators_config") or {}).get("verifier") or {}
    if layout == "speculators" and verifier.get("name_or_path"):
        target["name_or_path"] = verifier["name_or_path"]
    return target


def recorded_target(head_dir: Path) -> str | None:
    """The target a head folder names (eagle3's record first, as `HeadFolder.target_ref`), usable from here."""
    from ..model.target import resolvable_reference

    cfg = read_head_config(Path(head_dir))
    target = _recorded(cfg, detect_layout(cfg))
    return resolvable_reference(target.get("path") or target.get("name_or_path"), base=Path(head_dir))


def named_target(head_dir: Path, command: str) -> str:
    """The target the head folder names, when no --target is given; else the UsageError saying why not
    (none recorded, or one that is not on this machine), with `command` as the way on."""
    from ..model.target import build_hint

    recorded = recorded_target(head_dir)
    if not recorded:
        raise UsageError(f"no --target given and head {head_dir} records none", "--target MODEL_DIR", command)
    hint = build_hint(recorded)
    if not Path(recorded).exists() and (Path(recorded).is_absolute() or hint):
        # a committed head records its target relative to the repository (models/smollm2-135m),
        # which a fresh clone has not built yet
        raise UsageError(
            f"no --target given, and the target head {head_dir} records ({recorded}) is not here",
            "the target model folder the head was trained for",
            hint or "pass --target MODEL_DIR (the target the head was trained for)",
        )
    return recorded


# ---------------------------------------------------------------- aux layer ids
@dataclass(frozen=True)
class AuxReading:
    """One config field naming aux layers, and what it means in eagle3's convention."""

    field: str
    raw: tuple[int, ...]
    hidden_states: tuple[int, ...]
    convention: str

    def describe(self) -> str:
        return f"{self.field}={list(self.raw)} ({self.convention}) -> hidden_states{list(self.hidden_states)}"


def _int_list(value, where: str) -> list[int] | None:
    try:
        return int_list(value)
    except ValueError:
        raise UsageError(
            f"an aux layer id field of the head's config.json is malformed: {where}: {value!r} is not a list of "
            "integers",
            "a list of layer indices",
            NEXT,
        ) from None


def aux_readings(cfg: dict, layout: str, first_id_rule: bool = False) -> list[AuxReading]:
    """Every field of a head config that names aux layers, each read in its engine's convention (SGLang's
    for the target's class: `first_id_rule`, `speculate.aux_layers.from_sglang_ids`)."""
    out = []
    for row in ("aux_layer_ids", "sglang_aux_layer_ids", "vllm_aux_layer_ids"):  # the table's id fields
        key = field(row).eagle3 or ""
        raw = _int_list(get_path(cfg, key), key)
        if not raw:
            continue
        ours, how = sorted(raw), "hidden_states[k]"
        if row == "aux_layer_ids":
            ours = raw  # kept as listed: check.py refuses one out of layer order
        elif row == "sglang_aux_layer_ids":
            # SGLang adds 1 ("output of layer k" is the input of layer k+1) and captures in layer order
            fed = from_sglang_ids(raw, first_id_rule)
            ours = sorted(fed)
            how = "SGLang: " + (
                "output of layer k, +1"
                if fed[0] != raw[0]
                else "as given (DeepSeek family: +1 only to a first id of 1)"
            )
        else:
            how = f"{'speculators/vLLM' if layout == 'speculators' else 'vLLM'}: {how}"
        out.append(AuxReading(key, tuple(raw), tuple(ours), how))
    return out


def resolve_aux_ids(
    readings: list[AuxReading], num_target_layers: int | None, n_aux_fc: int | None, where: str
) -> tuple[tuple[int, ...], str, list[str]]:
    """(eagle3 ids, where they came from, notices); refuses fields that contradict each other, a count
    fc.weight does not read, and ids the one rule refuses (`aux_layer_problems`: id 0, order, range)."""
    if readings:  # the one rule first: eagle3's own ids listed out of layer order say so, not "contradict"
        _refuse_ids(readings[0].hidden_states, readings[0].field, num_target_layers, where)
    distinct = {r.hidden_states for r in readings}
    if len(distinct) > 1:
        lines = "\n  ".join(r.describe() for r in readings)
        raise UsageError(
            f"{where}: its aux layer fields contradict each other, so engines would feed it different layers:\n  "
            f"{lines}",
            "fields that name the same target layers, each in its engine's convention "
            "(eagle_config ids = k - 1, top-level ids = k, for hidden_states[k])",
            _contradiction_fix(readings),
        )
    notices = []
    if readings:
        ids, source = readings[0].hidden_states, " = ".join(r.field for r in readings)
    else:
        if num_target_layers is None:
            raise UsageError(
                f"{where} names no aux layers and no target is known to take the engines' default from",
                "a target (--target) whose layer count gives the default [2, L//2, L-3]",
                "pass --target MODEL_DIR",
            )
        ids = tuple(default_aux_layer_ids(num_target_layers))
        source = f"engine default [2, L//2, L-3] for L={num_target_layers}"
        notices.append(
            f"{where} names no aux layers: assuming what SGLang and vLLM capture then, "
            f"hidden_states{list(ids)} (inputs of decoder layers {list(ids)}, L={num_target_layers})"
        )
    if n_aux_fc is not None and n_aux_fc != len(ids):
        raise UsageError(
            f"{where}: fc.weight reads {n_aux_fc} aux features but the config gives {len(ids)} aux layers "
            f"(hidden_states{list(ids)} from {source})",
            "as many aux layer ids as fc.weight's input width / target hidden size",
            "add the layer ids the head was trained on to config.json (eagle_config.eagle_aux_hidden_state_layer_ids)",
        )
    _refuse_ids(ids, source, num_target_layers, where)
    return tuple(int(k) for k in ids), source, notices


def _contradiction_fix(readings: list[AuxReading]) -> str:
    """Which field to set to what, when eagle3's own field says what the head was trained on."""
    generic = (
        "fix the field that is wrong in config.json (the one the head was not trained with), "
        "or re-export: eagle3 export --head HEAD --format sglang --out DIR"
    )
    if readings[0].field != "eagle3.aux_layer_ids":
        return generic
    ours = list(readings[0].hidden_states)
    sets = [
        f"{r.field} to {[k - 1 for k in ours] if r.field.startswith('eagle_config') else ours}"
        for r in readings[1:]
        if r.hidden_states != readings[0].hidden_states
    ]
    return f"set {' and '.join(sets)} (eagle3.aux_layer_ids is what the head was trained on), or re-export the head"


def _refuse_ids(ids, source: str, num_target_layers: int | None, where: str) -> None:
    bad = aux_layer_problems(ids, num_target_layers)
    if bad:
        raise UsageError(
            f"{where}: aux layers hidden_states{list(ids)} ({source}): " + "; ".join(bad),
            "the target the head was trained for, and a head trained on aux layers the engines can feed it",
            "pass --target with the model the head names (eagle3.target or speculators verifier), or retrain the "
            "head on ascending ids in 1..L-1 (eagle3 cache --aux-layers 2,L//2,L-3)",
        )


# ---------------------------------------------------------------- EAGLE-3.1's norms
@dataclass(frozen=True)
class HeadNorms:
    """EAGLE-3.1's optional norms as the engines read a head's config (`head_norms`)."""

    norm_before_fc: bool = False
    norm_before_residual: bool = False
    problems: tuple[str, ...] = ()
    notices: tuple[str, ...] = ()


def head_norms(cfg: dict, layout: str) -> HeadNorms:
    """The two norm flags of a head config, each read where and as vLLM reads it (the reference
    loader; `table.FIELDS` lists every engine's place), and the spellings that would make engines
    disagree, as problems:

      norm_before_residual  top level; speculators: missing = true (vLLM's `update_eagle3` and the
                            speculators library's own default), elsewhere missing = false
      norm_before_fc        `eagle_config` first, then the top level (llama.cpp's converter reads
                            only the top level: the two must not disagree); missing = false
      fc_norm               a norm per aux feature, not one over all of them: refused
    """
    eagle_cfg = cfg.get("eagle_config") or {}
    problems, notices = [], []

    def value(where: dict, key: str, label: str) -> bool | None:
        v = where.get(key)
        if v is None or isinstance(v, bool):
            return v
        problems.append(f"{label} is {v!r}, not true or false")
        return None

    if eagle_cfg.get("fc_norm") or cfg.get("fc_norm"):
        problems.append(
            "fc_norm is set: one RMSNorm per aux feature before fc, a variant eagle3's draft does not implement "
            "(its norm_before_fc is one norm over all of them)"
        )
    top_fc = value(cfg, "norm_before_fc", "norm_before_fc")
    ec_fc = value(eagle_cfg, "norm_before_fc", "eagle_config.norm_before_fc")
    if top_fc is not None and ec_fc is not None and top_fc != ec_fc:
        problems.append(
            f"eagle_config.norm_before_fc is {ec_fc} but norm_before_fc is {top_fc}: vLLM reads the first, "
            "llama.cpp's converter the second"
        )
    fc = bool(ec_fc if ec_fc is not None else top_fc)
    top_res = value(cfg, "norm_before_residual", "norm_before_residual")
    ec_res = value(eagle_cfg, "norm_before_residual", "eagle_config.norm_before_residual")
    if ec_res is not None and ec_res != bool(top_res):
        problems.append(
            f"eagle_config.norm_before_residual is {ec_res}, but vLLM and llama.cpp read only the top-level "
            f"norm_before_residual, which is {top_res if top_res is not None else 'missing'}"
        )
    if top_res is None and layout == "speculators":
        notices.append(
            "the speculators config does not say norm_before_residual: reading it as true, as vLLM and the "
            "speculators library do"
        )
        top_res = True
    return HeadNorms(fc, bool(top_res), tuple(problems), tuple(notices))
