"""JSON lines, read the one way every stage reads them.

A JSON-lines file is split at "\n" and nowhere else. `str.splitlines()` also splits at U+2028,
U+2029, U+0085, \\x1c-\\x1e, \\x0b and \\x0c, which `json.dumps(..., ensure_ascii=False)` writes raw
inside strings (real chat data is full of them), so it cuts a valid record in two. A "\r" before
the "\n" (a file written on Windows) is not part of the record either.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path


def dumps(obj) -> str:
    """One JSONL line: text kept as written (non-ASCII unescaped), keys in their order."""
    return json.dumps(obj, ensure_ascii=False, sort_keys=False)


def split_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number from 1, line) for every non-blank line of `text`, split at "\n" only."""
    for n, line in enumerate(text.split("\n"), 1):
        if line.endswith("\r"):
            line = line[:-1]
        if line.strip():
            yield n, line


def split_byte_lines(data: bytes) -> Iterator[bytes]:
    """The non-blank lines of `data`, split at b"\n" only (bytes.splitlines also splits at a lone \r)."""
    for line in data.split(b"\n"):
        if line.endswith(b"\r"):
            line = line[:-1]
        if line.strip():
            yield line


def iter_file(path: Path) -> Iterator[tuple[int, str]]:
    """(line number from 1, line) for every non-blank line of a UTF-8 file, read as a stream."""
    # newline="\n": the file object itself splits only at "\n" and translates nothing.
    with open(path, encoding="utf-8", newline="\n") as f:
        for n, line in enumerate(f, 1):
            line = line[:-1] if line.endswith("\n") else line
            if line.endswith("\r"):
                line = line[:-1]
            if line.strip():
                yield n, line


def read_records(path: Path) -> list:
    """Every record of a JSONL file this project wrote (a malformed line raises ValueError)."""
    return [json.loads(line) for _, line in iter_file(path)]
