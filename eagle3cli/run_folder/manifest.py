"""The run-folder contract: atomic writes, checksums, fingerprints, manifests.

Every stage writes `manifest.json` atomically and last; the next stage reads it and refuses
inputs that do not match its own (target, tokenizer/template, layer ids, vocab size).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from typing_extensions import NotRequired, TypedDict  # pydantic reads TypedDicts from here before 3.12

from ..errors import StageError, UsageError
from ..readers.limits import max_input_bytes, read_file_bytes

MANIFEST = "manifest.json"
SCHEMA_VERSION = 1


# ---------------------------------------------------------------- atomic writes
_UMASK: int | None = None


def file_mode() -> int:
    """0o666 under the process umask: what `open()` would create. mkstemp makes 0600 files, which
    would leave run folders unreadable to the group that shares them."""
    global _UMASK
    if _UMASK is None:
        try:  # Linux reports it without changing it (os.umask can only be read by setting it)
            line = next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith("Umask:"))
            _UMASK = int(line.split()[1], 8)
        except (OSError, StopIteration, ValueError):
            _UMASK = os.umask(0o022)
            os.umask(_UMASK)
    return 0o666 & ~_UMASK


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """`write(tmp)` fills a temp file beside `path`; then fsync and rename: readers never see half a
    file. The temp name carries host and pid (`.NAME.HOST.PID.XXXX.tmp`), so a resumed stage can
    tell the leftovers of a killed process from a live writer's (`remove_dead_temps`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.{socket.gethostname()}.{os.getpid()}.", suffix=".tmp"
    )
    tmp = Path(name)
    try:
        os.fchmod(fd, file_mode())
        os.close(fd)
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:  # a write() or fsync() error names no file
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise


def remove_dead_temps(folder: Path) -> None:
    """Temp files of `atomic_write` left by processes on this host that died (kill -9); those of
    live writers (another `--shard i/N` process) and of other hosts are left alone."""
    host = socket.gethostname()
    for t in Path(folder).glob(f".*.{host}.*.tmp"):
        try:
            pid = int(t.name.rsplit(".", 3)[-3])
            os.kill(pid, 0)
        except (ValueError, IndexError):
            continue
        except ProcessLookupError:
            t.unlink(missing_ok=True)
        except PermissionError:  # alive, another user's
            pass


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_tensors(path: Path, tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None) -> None:
    """A safetensors file through `atomic_write`: the bytes are built in memory and written to our
    temp file. (safetensors' own `save_file` writes through a temp file of its own: mode 0600 whatever
    the umask, a name no resume recognises, and a full disk raised as SafetensorError, not OSError.)"""
    from safetensors.torch import save

    data = save(dict(tensors), metadata=dict(metadata) if metadata is not None else None)
    atomic_write_bytes(path, data)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def read_json(path: Path, what: str = "a JSON file eagle3 wrote") -> Any:
    """Every JSON file eagle3 reads back (manifests, configs, records): a regular file (a FIFO would
    block the open forever) of at most the input limit, parsed; ValueError when it is not JSON."""
    return json.loads(read_file_bytes(Path(path), what, max_input_bytes()))


def read_json_object(path: Path, expected: str, next_step: str | None = None) -> dict:
    """A JSON file holding an object, or a UsageError naming the file, what it should hold and the fix."""
    try:
        obj = read_json(path, expected)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{path} is not valid JSON ({e})", expected, next_step) from e
    except RecursionError:  # a hand-made file nested 100k deep: Python's parser gives up
        raise UsageError(f"{path} nests JSON deeper than Python can read", expected, next_step) from None
    if not isinstance(obj, dict):
        raise UsageError(f"{path} is not a JSON object (it holds a {type(obj).__name__})", expected, next_step)
    return obj


def _is_member(part: Any) -> bool:
    """A union member's name in a pydantic error location (the schemas name them `_Private`), not a key."""
    return isinstance(part, str) and part.startswith("_")


def field_name(loc: tuple) -> str:
    """A pydantic error location as a reader would write the key: `shards[0].bytes`."""
    out = ""
    for part in loc:
        if _is_member(part):
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(the whole file)"


def schema_problems(obj: Any, schema: Any) -> list[str]:
    """One line per field of `obj` that does not fit `schema` (a pydantic-readable type, strict: no
    "3" for 3, no true for 1): `shards[0].bytes: input should be a valid integer (found ...)`."""
    from pydantic import TypeAdapter, ValidationError

    try:
        TypeAdapter(schema).validate_python(obj, strict=True)
    except ValidationError as e:
        errors = e.errors()
        # a union (`A | B`) reports each member's errors under the member's name: keep the first member's
        tags = [p for err in errors for p in err["loc"] if _is_member(p)]
        errors = [err for err in errors if all(p == tags[0] for p in err["loc"] if _is_member(p))]
        return [
            f"{field_name(err['loc'])} is missing"
            if err["type"] == "missing"
            else f"{field_name(err['loc'])}: {err['msg'].lower()} (found {str(err.get('input'))[:60]!r})"
            for err in errors
        ]
    return []


def check_schema(obj: Any, schema: Any, path: Path, expected: str, next_step: str | None = None) -> Any:
    """`obj` (a file eagle3 read back) checked against `schema`: a missing key, a wrong type or a nested
    value where a scalar belongs is one UsageError naming the file and every field (`schema_problems`),
    instead of a KeyError or AttributeError wherever the value is first used. Returns `obj` unchanged:
    readers keep working on the plain dict."""
    lines = schema_problems(obj, schema)
    if lines:
        more = f"\n  (+{len(lines) - 8} more)" if len(lines) > 8 else ""
        raise UsageError(f"{path} does not hold {expected}:\n  " + "\n  ".join(lines[:8]) + more, expected, next_step)
    return obj


# ---------------------------------------------------------------- checksums
def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def shard_record(path: Path, **extra: Any) -> dict:
    """What a manifest stores per shard: name, bytes, sha256 (+ caller's counts)."""
    path = Path(path)
    return {"file": path.name, "bytes": path.stat().st_size, "sha256": sha256_file(path), **extra}


def folder_fingerprint(manifest: Mapping[str, Any]) -> str:
    """The identity of a finished stage folder's content: every file its manifest lists, by name and
    sha256. Another run's cache (or data) put in the same place has another fingerprint."""
    files = [*(manifest.get("shards") or []), *(manifest.get("files") or [])]
    pairs = sorted((str(f.get("file")), str(f.get("sha256"))) for f in files if isinstance(f, dict))
    return sha256_text(json.dumps(pairs))[:16]


def contained(folder: Path, name: str) -> Path:
    """`folder/name`, refusing a name that leaves the folder (absolute, `..`, a link out of it):
    a manifest is data, and must not make a stage read or delete files elsewhere."""
    folder = Path(folder)
    rel = Path(name) if isinstance(name, str) else None
    ok = rel is not None and str(rel) not in ("", ".") and not rel.is_absolute() and ".." not in rel.parts
    if ok:
        try:
            (folder / rel).resolve().relative_to(folder.resolve())
        except ValueError:
            ok = False
    if not ok:
        raise StageError(
            f"{folder / MANIFEST} names the file {name!r}, which is outside {folder}",
            "file names inside the run folder, as eagle3 writes them",
            "rebuild the folder with the stage that wrote it (the manifest was edited or crafted)",
        )
    return folder / rel


def verify_shards(folder: Path, shards: list[dict]) -> list[str]:
    """Re-check every shard listed in a manifest; returns a list of problems (empty = all good)."""
    problems = []
    for s in shards:
        p = contained(folder, s["file"])
        if not p.exists():
            problems.append(f"{s['file']}: missing")
        elif p.stat().st_size != s["bytes"]:
            problems.append(f"{s['file']}: {p.stat().st_size} bytes, manifest says {s['bytes']}")
        elif sha256_file(p) != s["sha256"]:
            problems.append(f"{s['file']}: checksum mismatch (corrupted or modified)")
    return problems


# ---------------------------------------------------------------- fingerprints
def _check_safetensors(path: Path) -> None:
    """The header of a safetensors file is sane (length, JSON, offsets inside the file); else a
    UsageError naming the file instead of an OverflowError or a loader traceback later."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little") if size >= 8 else -1
        problem = None
        if not 0 < n <= size - 8:
            problem = f"its header claims {n} bytes but the file has {size}"
        else:
            try:
                header = json.loads(f.read(n))
                data = size - 8 - n
                bad = [
                    k
                    for k, v in header.items()
                    if k != "__metadata__" and not (0 <= v["data_offsets"][0] <= v["data_offsets"][1] <= data)
                ]
                if bad:
                    problem = f"tensor {bad[0]} lies beyond the end of the file (cut short?)"
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                problem = f"its header is not valid ({type(e).__name__})"
    if problem:
        raise UsageError(
            f"{path} is not a valid safetensors file: {problem}",
            "the model's weights as saved by transformers (save_pretrained)",
            "copy the model folder again (the file is damaged or incomplete)",
        )


def cache_dir() -> Path:
    """eagle3's own cache (digest memo, GGUF conversions, llama.cpp's source, served copies), one rule
    for all of them and tools/build_llama_cpp.sh: `$EAGLE3_CACHE`, else `$EAGLE3_CACHE_DIR` (the digest
    memo's older name), else `$XDG_CACHE_HOME/eagle3`, else ~/.cache/eagle3."""
    base = os.environ.get("EAGLE3_CACHE") or os.environ.get("EAGLE3_CACHE_DIR")
    if base:  # `/` (or a file) would spread file-digests.json, llama.cpp's source and model copies over it
        p = Path(base).expanduser()
        if p.resolve() == Path(p.resolve().anchor) or (p.exists() and not p.is_dir()):
            var = "EAGLE3_CACHE" if os.environ.get("EAGLE3_CACHE") else "EAGLE3_CACHE_DIR"
            raise UsageError(
                f"{var}={base} is {'the filesystem root' if p.exists() and p.is_dir() else 'not a folder'}: "
                "eagle3 keeps its own files there (file digests, GGUF conversions, llama.cpp's source)",
                "a folder of eagle3's own, e.g. ~/.cache/eagle3",
                f"unset {var} or point it at a folder such as ~/.cache/eagle3",
            )
        return p
    return Path(base or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "eagle3"))


def _digest_memo_path() -> Path:
    return cache_dir() / "file-digests.json"


_DIGESTS: dict[str, list] = {}


def file_digest(path: Path) -> str:
    """sha256 of a whole file, remembered by (path, size, mtime, inode, ctime) across runs: hashing a 16 GB
    target costs seconds once, then nothing, and any rewrite of the file changes the stamp."""
    path = Path(path).resolve()
    st = path.stat()
    # ctime too: a rewrite in place that restores the mtime (touch -d, rsync -t, a copy with cp -p
    # onto the same inode) still moves the ctime, which no user call can set back
    stamp = [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]
    key = str(path)
    memo_path = _digest_memo_path()
    if not _DIGESTS:
        try:
            loaded = read_json(memo_path)
            _DIGESTS.update(loaded if isinstance(loaded, dict) else {})
        except (OSError, ValueError):
            pass
    hit = _DIGESTS.get(key)
    if isinstance(hit, list) and len(hit) == len(stamp) + 1 and hit[:-1] == stamp:
        return hit[-1]
    if path.suffix == ".safetensors":
        _check_safetensors(path)
    digest = sha256_file(path)
    _DIGESTS[key] = [*stamp, digest]
    for k in [k for k in _DIGESTS if not os.path.exists(k)]:  # models deleted since: forget them
        del _DIGESTS[k]
    try:  # best effort: no cache folder just means hashing again next time
        atomic_write_json(memo_path, _DIGESTS)
    except OSError:
        pass
    return digest


# config.json keys that record the library that saved the folder, not the model it describes
WRITER_KEYS = ("transformers_version",)
# fingerprint -> the same folder's fingerprint under scheme /2 (config.json hashed whole), so that
# data, caches and heads recorded before /3 still match a target whose config was not re-saved
_BEFORE_3: dict[str, set[str]] = {}


def model_fingerprint(model_dir: Path) -> str:
    """The identity of a local model folder: its config and every byte of its weight files.

    Every tensor counts: a target whose lm_head alone was rescaled is another target (a sampled
    hash missed exactly that). The per-file sha256 is remembered by size, mtime, inode and ctime, see file_digest.
    Who wrote config.json is not the model: a target converted again under a newer transformers
    (5.24 -> 5.25 changed only `transformers_version`) is the same target and keeps its data and heads.
    """
    model_dir = Path(model_dir)
    whole = own = b""  # config.json as written, and without its writer's keys
    cfg = model_dir / "config.json"
    if cfg.exists():
        try:
            config = json.loads(cfg.read_text())
        except ValueError as e:
            raise UsageError(f"{cfg} is not valid JSON ({e})", "a transformers config.json") from e
        whole = json.dumps(config, sort_keys=True).encode()
        own = json.dumps({k: v for k, v in config.items() if k not in WRITER_KEYS}, sort_keys=True).encode()
    weights = b"".join(
        f.name.encode() + b"\0" + file_digest(f).encode()
        for f in sorted([*model_dir.glob("*.safetensors"), *model_dir.glob("*.bin")])
    )
    now = hashlib.sha256(b"eagle3-fingerprint/3\n" + own + weights).hexdigest()[:16]
    before = _BEFORE_3.setdefault(now, set())
    before.add(hashlib.sha256(b"eagle3-fingerprint/2\n" + whole + weights).hexdigest()[:16])
    if cfg.exists() and config.get("architectures"):
        # the class name is how the folder loads, not the model: a GGUF-born config recorded with
        # "architectures": null (SmolLM2 before `make smollm2` named it) is the same target
        unnamed = {k: v for k, v in config.items() if k not in WRITER_KEYS} | {"architectures": None}
        before.add(
            hashlib.sha256(
                b"eagle3-fingerprint/3\n" + json.dumps(unnamed, sort_keys=True).encode() + weights
            ).hexdigest()[:16]
        )
    return now


def same_fingerprint(recorded: str | None, current: str | None) -> bool:
    """Whether a recorded target fingerprint names the target `current` identifies (computed by
    model_fingerprint in this process), under this scheme or the one before it."""
    return recorded == current or (recorded is not None and recorded in _BEFORE_3.get(str(current), ()))


def tokenizer_fingerprint(tokenizer) -> dict:
    """Hash of the vocabulary and of the chat template: either changing invalidates data and caches."""
    vocab = tokenizer.get_vocab()
    vocab_hash = sha256_text(json.dumps(sorted(vocab.items(), key=lambda kv: kv[1])))[:16]
    template = getattr(tokenizer, "chat_template", None) or ""
    return {
        "vocab_hash": vocab_hash,
        "chat_template_hash": sha256_text(template)[:16],
        "tokenizer_vocab_size": len(tokenizer),
    }


# ---------------------------------------------------------------- provenance
def package_versions() -> dict:
    out = {"python": platform.python_version()}
    for pkg in ("eagle3cli", "torch", "transformers", "deepspeed", "datasets", "sglang"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def machine() -> dict:
    """The machine a stage ran on: its timings (CPU seconds above all) compare only on the same one. The CPU's
    model as /proc/cpuinfo names it, the logical CPUs, and the GPU where torch is loaded and sees one."""
    from ..node.cpu_features import cpuinfo

    out = {"cpu": cpuinfo("model name") or platform.processor() or platform.machine(), "logical_cpus": os.cpu_count()}
    torch = sys.modules.get("torch")  # never imported for this: a stage that has no torch has no GPU to name
    if torch is not None and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    return out


def write_manifest(folder: Path, stage: str, **fields: Any) -> Path:
    """Write `folder/manifest.json` atomically, with schema version, stage, time, versions and machine."""
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "stage": stage,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": package_versions(),
        "machine": machine(),
        **fields,
    }
    path = Path(folder) / MANIFEST
    atomic_write_json(path, manifest)
    return path


STAGE_FOLDERS = ("data", "cache", "train", "head", "eval")


def for_run(next_step: str, folder) -> str:
    """`next_step` with its `runs/NAME` placeholder replaced by the run folder that `folder` belongs
    to (runs/a/data, runs/a/head-sglang, runs/a/eval-gsm8k -> runs/a); unchanged for other folders."""
    p = Path(folder)
    if not any(p.name == s or p.name.startswith(f"{s}-") for s in STAGE_FOLDERS) or str(p.parent) in ("", "."):
        return next_step
    return next_step.replace("runs/NAME", str(p.parent))


class ShardRecord(TypedDict):
    """One listed file (`shard_record`); other keys are the stage's counts."""

    file: str
    bytes: int
    sha256: str


class StageManifest(TypedDict):
    """What every reader of a stage's manifest relies on (stage-specific keys are the stage's to check)."""

    schema_version: NotRequired[int]
    stage: str
    shards: list[ShardRecord]
    target: NotRequired[dict[str, Any]]
    config: NotRequired[dict[str, Any]]
    counts: NotRequired[dict[str, Any]]


def read_manifest(folder: Path, stage: str, produced_by: str, schema: Any = StageManifest) -> dict:
    """Read a previous stage's manifest, or explain which command makes it; `schema` is the manifest's
    typed shape (None where the caller checks every field itself: the cache's `validate.check_manifest`)."""
    produced_by = for_run(produced_by, folder)
    path = Path(folder) / MANIFEST
    if not Path(folder).exists():
        raise UsageError(f"{folder} does not exist", f"a folder written by `eagle3 {stage}`", produced_by)
    if not path.exists():
        raise UsageError(
            f"{folder} has no manifest.json: the `{stage}` stage never finished there",
            f"a completed `eagle3 {stage}` output folder",
            produced_by,
        )
    m = read_json_object(path, "a manifest written by eagle3", produced_by)
    version = m.get("schema_version")
    if version is not None and version != SCHEMA_VERSION:  # a newer layout read as this one would be misread
        raise UsageError(
            f"{path} has schema_version {version!r}; this eagle3 reads version {SCHEMA_VERSION}",
            f"a manifest of schema version {SCHEMA_VERSION} (written by this eagle3 version)",
            f"use the eagle3 version that wrote it, or rebuild the folder: {produced_by}",
        )
    if m.get("stage") != stage:
        raise UsageError(
            f"{path} was written by stage '{m.get('stage')}', not '{stage}'",
            f"the output folder of `eagle3 {stage}`",
            produced_by,
        )
    return m if schema is None else check_schema(m, schema, path, f"a manifest of `eagle3 {stage}`", produced_by)


def check_matches(what: str, found: Mapping[str, Any], expected: Mapping[str, Any], next_step: str) -> None:
    """Refuse a mismatch between an input's recorded identity and ours, listing every difference."""
    diffs = [
        f"  {k}: {what} has {found.get(k)!r}, expected {v!r}"
        for k, v in expected.items()
        if v is not None
        and found.get(k) is not None
        and found.get(k) != v
        and not (k == "fingerprint" and same_fingerprint(found.get(k), v))
    ]
    if diffs:
        raise StageError(
            f"{what} does not match this run:\n" + "\n".join(diffs),
            "inputs produced with the same target model, tokenizer/chat template and layer ids",
            next_step,
        )
