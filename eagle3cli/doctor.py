"""`eagle3 doctor`: what this node can run — versions, devices, the CPU's instruction sets and the fast
paths they allow, DeepSpeed launcher, SGLang, vLLM's CPU build, disk."""

from __future__ import annotations

import importlib
import importlib.util
import json
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


def check_devices() -> list[Check]:
    import psutil
    import torch

    mem = psutil.virtual_memory()
    rows = [
        Check(
            "cpu",
            True,
            f"{psutil.cpu_count()} cores, "
            f"{mem.total / 2**30:.1f} GiB RAM ({mem.available / 2**30:.1f} GiB free), "
            f"torch threads {torch.get_num_threads()}",
        )
    ]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            free, total = torch.cuda.mem_get_info(i)
            rows.append(
                Check(
                    f"cuda:{i}",
                    True,
                    f"{p.name}, {total / 2**30:.1f} GiB ({free / 2**30:.1f} free), "
                    f"sm_{p.major}{p.minor}, bf16={'yes' if torch.cuda.is_bf16_supported() else 'no'}",
                )
            )
    else:
        rows.append(Check("cuda", False, f"no CUDA device (torch {torch.__version__}); CPU paths only", False))
    return rows


def check_cpu_features() -> list[Check]:
    """The CPU's instruction sets, and what each CPU fast path needs of them."""
    import platform

    import torch

    from .model.cpu_kernels import onednn_cannot_run
    from .node.cpu_features import FORCE_ENV, ONEDNN_BF16_ALTERNATIVE, ONEDNN_BF16_NEEDS, describe

    rows = [Check("cpu instruction sets", True, f"{platform.machine()}: {describe()}", False)]
    why_not = onednn_cannot_run(torch.bfloat16)
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


def device_choices() -> Check:
    from .node.devices import available_devices

    return Check("--device", True, "choices here: " + ", ".join(["auto", *available_devices()]))


def check_deepspeed() -> Check:
    """Can `deepspeed` launch here? The launcher binary and the accelerator it picks."""
    launcher = shutil.which("deepspeed") or str(Path(sys.executable).parent / "deepspeed")
    if not Path(launcher).exists():
        return Check("deepspeed launcher", False, "the `deepspeed` launcher is not on PATH")
    try:
        code = "from deepspeed.accelerator import get_accelerator as g; print(g().device_name())"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        acc = r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else None
    except (subprocess.TimeoutExpired, OSError):
        acc = None
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
        found = importlib.util.find_spec("sglang.srt") is not None
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
    """vLLM's CPU build in `make vllm-cpu`'s venv: its version and what it was measured to run on this
    machine (the probe serve runs once; doctor only reads it)."""
    from .engines.vllm_probe import DTYPES, read_probe
    from .node.cpu_features import native_flags
    from .serve.machine import VLLM_CPU_VENV, cpu_flags, vllm_build

    flags = cpu_flags()
    isa = ", ".join(f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f in flags) or "no AVX-512"
    for root in (Path.cwd(), Path(__file__).resolve().parents[1]):
        py = root / VLLM_CPU_VENV / "bin" / "python"
        if py.is_file():
            build = vllm_build(str(py))
            if build is None:
                return Check("vllm-cpu", False, f"{py} has no vLLM (re-run `make vllm-cpu`); CPU: {isa}", False)
            what = "vllm-cpu" if build.cpu else "vllm (CUDA build)"
            found = read_probe(str(py), f"vllm-cpu=={build.version}", native_flags()) if build.cpu else None
            if not build.cpu:
                note, ok = "serves on CUDA GPUs", True
            elif found is None:
                note, ok = "not tried on this machine yet (serve --engine vllm tries it once)", True
            else:
                runs = [d for d in DTYPES if (found["dtypes"].get(d) or {}).get("ok")]
                ok = "float32" in runs
                note = f"measured here: runs {', '.join(runs) or 'nothing'}" + (
                    f"; fails {', '.join(d for d in DTYPES if d not in runs)}" if len(runs) < len(DTYPES) else ""
                )
            return Check("vllm-cpu", ok, f"{what} {build.version} in {py}; CPU: {isa}; {note}", False)
    return Check("vllm-cpu", False, f"no {VLLM_CPU_VENV}/ (`make vllm-cpu`: ~2 min, ~3.4 GB); CPU: {isa}", False)


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
    return [
        *check_packages(),
        *check_devices(),
        *check_cpu_features(),
        device_choices(),
        check_deepspeed(),
        check_sglang(check_sglang_parser),
        check_vllm_cpu(),
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
