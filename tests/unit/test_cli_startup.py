"""`eagle3 --help`, every stage's --help and `eagle3 doctor` answer without importing torch,
transformers or DeepSpeed (seconds of imports to print text; doctor asks torch and DeepSpeed in one
child process). Read from `python -X importtime`, which lists every module the real entry point
imported, lazy ones included (a child's imports are its own)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from eagle3cli.cli import app

HEAVY = ("torch", "transformers", "deepspeed")


def imported(*args: str) -> tuple[int, set[str]]:
    """Exit code and the top-level names of every module `python -X importtime ARGS` imported."""
    r = subprocess.run(
        [sys.executable, "-X", "importtime", *args], capture_output=True, text=True, timeout=300, check=False
    )
    names = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in r.stderr.splitlines()
        if line.startswith("import time:")
    }
    return r.returncode, names


def commands() -> list[str]:
    return sorted(c.name or c.callback.__name__ for c in app.registered_commands if c.callback)


def test_the_checker_sees_torch_when_it_is_imported():
    code, names = imported("-c", "import eagle3cli.speculate.chain")
    assert code == 0 and "torch" in names
    code, names = imported("-c", "import eagle3cli.speculate")  # the package alone loads no maths
    assert code == 0 and not names & set(HEAVY)


def test_every_stage_is_checked():
    assert {"doctor", "gen-data", "cache", "train", "export", "eval", "serve", "serve-bench"} <= set(commands())


@pytest.mark.parametrize("args", [(), *((c,) for c in commands())], ids=lambda a: " ".join(a) or "eagle3")
def test_help_imports_no_torch(args):
    code, names = imported("-m", "eagle3cli", *args, "--help")
    assert code == 0
    assert "eagle3cli" in names and "typer" in names
    assert not names & set(HEAVY), sorted(names & set(HEAVY))


@pytest.mark.slow  # doctor's own checks run: torch and DeepSpeed imported in its child, vLLM's venv asked
def test_doctor_imports_no_torch_itself_and_still_reports_torchs_view():
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "eagle3cli", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    names = {x.rsplit("|", 1)[1].strip().split(".")[0] for x in r.stderr.splitlines() if x.startswith("import time:")}
    assert "eagle3cli" in names and not names & {*HEAVY, "sglang", "vllm"}, sorted(names & {*HEAVY, "sglang"})
    checks = {c["name"]: c for c in json.loads(r.stdout)}
    assert "torch threads" in checks["cpu"]["detail"]  # asked of torch in the child
    assert checks["--device"]["ok"] and "cpu" in checks["--device"]["detail"]
    assert checks["deepspeed launcher"]["ok"] and "accelerator: cpu" in checks["deepspeed launcher"]["detail"]
    assert checks["oneDNN bf16"]["detail"]
