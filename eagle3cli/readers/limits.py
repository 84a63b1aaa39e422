"""Bounds on every read of data eagle3 does not control: input files and HTTP bodies.

A reader that trusts its input can be made to allocate without limit: `--input /dev/zero`, a
1 KB .gz that inflates to gigabytes, a server that streams a body that never ends or nests JSON
thousands deep. Every such read goes through here, and stops at a limit with a message that
names it (and the environment variable that raises it) instead of a MemoryError.

The limits are environment variables rather than flags: they guard the machine, not the run,
and every stage that reads inputs (gen-data, eval --bench, serve-bench --prompts) shares them.
"""

from __future__ import annotations

import bz2
import json
import lzma
import math
import os
import stat
import zlib
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..files import check_regular_file, human, read_file_bytes

__all__ = ["check_regular_file", "human", "read_file_bytes"]  # the file checks live in files.py, under config.py

INPUT_ENV = "EAGLE3_MAX_INPUT_BYTES"
BODY_ENV = "EAGLE3_MAX_BODY_BYTES"
# 1 GiB of text: the bytes and the decoded text of one input together stay under ~2 GiB.
DEFAULT_MAX_INPUT_BYTES = 1 << 30
# An engine's reply: chat completions are kilobytes, a `/metrics` page of a busy server a few MB.
DEFAULT_MAX_BODY_BYTES = 64 << 20
# JSON nesting a reply may have: chat completions nest ~6 deep; tool-call arguments a few more.
MAX_JSON_DEPTH = 200
CHUNK = 1 << 20
COMPRESSED = (".gz", ".bz2", ".xz", ".lzma", ".zst")


def _env_bytes(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise UsageError(
            f"{name}={raw!r} is not a whole number of bytes", f"e.g. {name}={default}", f"export {name}={default}"
        ) from None
    if value < 1:
        raise UsageError(f"{name}={value} must be positive", f"e.g. {name}={default}", f"export {name}={default}")
    return value


def max_input_bytes() -> int:
    return _env_bytes(INPUT_ENV, DEFAULT_MAX_INPUT_BYTES)


def max_body_bytes() -> int:
    return _env_bytes(BODY_ENV, DEFAULT_MAX_BODY_BYTES)


def _too_big(path: Path, flag: str, what: str, limit: int) -> UsageError:
    return UsageError(
        f"{flag} {path}: {what} more than {human(limit)}, the limit on one input file",
        f"an input file of at most {human(limit)} (set {INPUT_ENV} to raise the limit)",
        f"split the file (split -l 100000 {path} part-), or raise the limit: export {INPUT_ENV}={limit * 4}",
    )


def check_readable_file(path: Path, flag: str) -> os.stat_result:
    """Regular files and pipes (`--input <(zcat f.gz)`) only: a device (/dev/zero, /dev/urandom)
    or a socket never ends, and a pipe is read with the size limit."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise UsageError(f"{flag} {path} cannot be read ({e.strerror})", "a readable file") from e
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) or stat.S_ISSOCK(st.st_mode):
        kind = "a socket" if stat.S_ISSOCK(st.st_mode) else "a device"
        raise UsageError(
            f"{flag} {path} is {kind}, not a data file",
            "a regular file (JSONL, JSON, Parquet, optionally .gz/.bz2/.xz/.zst) or a pipe",
            f"pass the data file itself, e.g. {flag} data.jsonl",
        )
    return st


def _new_decompressor(suffix: str):
    """A zlib/bz2/lzma-style streaming object for one compressed stream."""
    if suffix == ".gz":
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if suffix == ".bz2":
        return bz2.BZ2Decompressor()
    if suffix in (".xz", ".lzma"):
        return lzma.LZMADecompressor()
    try:
        import zstandard
    except ImportError:
        raise UsageError(
            "a .zst input needs the Python package `zstandard`, which is not installed",
            "`pip install zstandard` in this environment, or an uncompressed / .gz input",
            "pip install zstandard   (or: zstd -d FILE.zst and pass the .jsonl)",
        ) from None
    return zstandard.ZstdDecompressor().decompressobj()


def _inflate(suffix: str, raw: bytes | bytearray, limit: int, too_big) -> bytearray:
    """Decompress `raw` (several concatenated streams, as gzip/bzip2/xz allow) without ever holding
    much more than `limit` bytes of output: each call's output is bounded by max_length, or, for
    zstandard (no max_length), its input is 4 KiB so one call inflates to at most a few MB."""
    out = bytearray()
    view = memoryview(raw)
    pos, d = 0, _new_decompressor(suffix)
    if suffix == ".zst":
        while pos < len(view):
            out += d.decompress(bytes(view[pos : pos + 4096]))
            pos += 4096
            if len(out) > limit:
                raise too_big()
        return out
    pending = b""  # zlib: input it has not consumed yet (bz2/lzma keep theirs inside)
    while True:
        if d.eof:
            rest = d.unused_data + pending + bytes(view[pos:])
            if not rest.strip(b"\0"):  # the end, or the zero padding gzip tolerates
                return out
            d, pending, view, pos = _new_decompressor(suffix), b"", memoryview(rest), 0
        needs = not pending if suffix == ".gz" else d.needs_input
        data = b""
        if needs:
            if pos >= len(view):
                raise EOFError("the compressed stream ends early")
            data, pos = bytes(view[pos : pos + CHUNK]), pos + CHUNK
        if pending:
            data, pending = pending + data, b""
        out += d.decompress(data, CHUNK)
        pending = getattr(d, "unconsumed_tail", b"")
        if len(out) > limit:
            raise too_big()


def read_input_bytes(path: Path, flag: str = "--input") -> tuple[bytearray, bytearray]:
    """(raw bytes as stored, the data after decompression by suffix), each at most the input limit.

    The raw bytes are read in chunks and the decompression is streamed with a bound on its output,
    so a gzip bomb costs the limit, not the size it inflates to."""
    path = Path(path)
    check_readable_file(path, flag)
    limit = max_input_bytes()
    raw = bytearray()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(CHUNK)
            if not chunk:
                break
            raw += chunk
            if len(raw) > limit:
                raise _too_big(path, flag, "holds", limit)
    suffix = path.suffix.lower()
    if suffix not in COMPRESSED:
        return raw, raw  # one buffer: no copy of a file that may be a GiB
    try:
        out = _inflate(suffix, raw, limit, lambda: _too_big(path, flag, "decompresses to", limit))
    except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError) as e:
        raise UsageError(
            f"{flag} {path} cannot be read as {suffix[1:]} data ({type(e).__name__}: {e})",
            f"a {suffix} file (or rename it if it is not compressed)",
            f"check it with the matching tool (e.g. gzip -t {path})",
        ) from e
    except Exception as e:  # zstandard's ZstdError
        if type(e).__name__ != "ZstdError":
            raise
        raise UsageError(f"{flag} {path} cannot be read as zstd data ({e})", "a .zst file") from e
    return raw, out


# ---------------------------------------------------------------- JSON from engines
class UnusableReply(ValueError):
    """An engine answered, but with JSON we refuse to use (too deep, non-finite numbers, too big).
    Such an answer is deterministic for a seeded request: the request is rejected, not retried."""


def _refuse_constant(name: str) -> Any:
    raise UnusableReply(f"the reply holds {name}, which is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise UnusableReply(f"the reply holds the number {text[:40]}, which overflows a float")
    return value


def json_depth_ok(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether brackets outside strings nest at most `limit` deep (no parsing, no recursion)."""
    depth = 0
    in_str = esc = False
    for c in text:
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "[{":
            depth += 1
            if depth > limit:
                return False
        elif c in "]}":
            depth -= 1
    return True


def strict_json(text: str) -> Any:
    """JSON of an engine's reply: NaN/Infinity refused, nesting deeper than MAX_JSON_DEPTH refused
    (Python's parser would raise RecursionError a little deeper, or later code on the value)."""
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and not json_depth_ok(text):
        raise UnusableReply(f"the reply nests JSON more than {MAX_JSON_DEPTH} levels deep")
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise UnusableReply(f"the reply nests JSON more than {MAX_JSON_DEPTH} levels deep") from None
